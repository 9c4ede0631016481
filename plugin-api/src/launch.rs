//! What a launch names besides the kernel: inputs and dynamic grid sizes, checked the same way for
//! every backend before anything runs.

use std::collections::BTreeMap;

use thiserror::Error;

use crate::array::HostArray;
use crate::ir::{AxisSize, DType, Kernel, ParamKind, Verified};

/// The largest size of one grid axis: `program_id` is an `i32`.
pub const MAX_AXIS_SIZE: u64 = i32::MAX as u64;

/// Inputs and dynamic grid sizes of one launch.
#[derive(Clone, Debug, Default)]
pub struct LaunchArgs {
    /// One array (or 0-d scalar) per `in` argument, by name.
    pub inputs: BTreeMap<String, HostArray>,
    /// The size of each `dyn` grid axis, by name.
    pub grid: BTreeMap<String, u64>,
}

/// A launch that does not fit its kernel. Each message names the thing and what was expected.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum LaunchError {
    /// An `in` argument has no array.
    #[error(
        "kernel `{kernel}` needs input `{name}`: {ty}\n  give it with `--input {name}=FILE.npy`, or leave out every `--input` to use seeded random inputs"
    )]
    MissingInput {
        /// Kernel name.
        kernel: String,
        /// Argument name.
        name: String,
        /// Its declared type.
        ty: String,
    },
    /// An array was given for a name that is not an `in` argument.
    #[error("kernel `{kernel}` has no input `{name}`\n  its inputs are: {expected}")]
    UnknownInput {
        /// Kernel name.
        kernel: String,
        /// The name given.
        name: String,
        /// The kernel's inputs.
        expected: String,
    },
    /// An input has the wrong dtype or shape.
    #[error(
        "input `{name}` of kernel `{kernel}` is {got}, but the kernel declares {expected}\n  give an array of exactly {expected}"
    )]
    WrongType {
        /// Kernel name.
        kernel: String,
        /// Argument name.
        name: String,
        /// Declared type.
        expected: String,
        /// Given type.
        got: String,
    },
    /// A `dyn` axis has no size.
    #[error("grid axis `{axis}` of kernel `{kernel}` is `dyn` and needs a size at launch\n  give it with `--grid {axis}=N`")]
    MissingGridSize {
        /// Kernel name.
        kernel: String,
        /// Axis name.
        axis: String,
    },
    /// A size was given for an axis that is not a `dyn` axis of the kernel.
    #[error("kernel `{kernel}` has no `dyn` grid axis `{axis}`\n  {expected}")]
    NotDynAxis {
        /// Kernel name.
        kernel: String,
        /// The name given.
        axis: String,
        /// What would work.
        expected: String,
    },
    /// A kernel without `grid` that uses axes a mesh must give, launched without one.
    #[error(
        "kernel `{kernel}` has no grid and uses the axes {axes}: they come from the mesh it is launched with\n  launch it with a mesh naming them, as in --mesh \"grid({example})\""
    )]
    NeedsMesh {
        /// Kernel name.
        kernel: String,
        /// The axes, comma-separated.
        axes: String,
        /// An example mesh body.
        example: String,
    },
    /// A grid size of 0 or beyond [`MAX_AXIS_SIZE`].
    #[error("grid axis `{axis}` of kernel `{kernel}` cannot have size {size}\n  expected a size from 1 to {MAX_AXIS_SIZE}")]
    BadGridSize {
        /// Kernel name.
        kernel: String,
        /// Axis name.
        axis: String,
        /// The size given.
        size: u64,
    },
    /// The launch was cancelled ([`crate::cancel`]) before every program ran.
    #[error("the launch of kernel `{kernel}` was cancelled before it finished\n  its outputs are incomplete; launch it again")]
    Cancelled {
        /// Kernel name.
        kernel: String,
    },
    /// A kernel of the concurrent model broke its rules as it ran (docs/language.md, "Threads,
    /// barriers and asynchronous operations"): a data race, a barrier no thread can complete, a
    /// barrier phase a waiting thread would miss. The first line of `message` says what
    /// happened and names the statements; the next what would fix it.
    #[error("kernel `{kernel}` {message}")]
    Concurrency {
        /// Kernel name.
        kernel: String,
        /// What happened (first line), then what would fix it.
        message: String,
    },
}

/// One grid axis with its launch size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchAxis {
    /// Axis name.
    pub name: String,
    /// Number of points.
    pub size: u64,
    /// Whether it runs in order inside a program.
    pub seq: bool,
}

/// Checks a launch against a kernel and returns the grid with every size known (those of
/// `dyn(n)` axes from their inputs).
pub fn bind(kernel: &Verified, args: &LaunchArgs) -> Result<Vec<LaunchAxis>, LaunchError> {
    check_inputs(kernel.kernel(), &args.inputs, true)?;
    let mut sizes = args.grid.clone();
    sizes.extend(sizes_from_inputs(kernel.kernel(), |n| args.inputs.get(n).and_then(|a| scalar_value(a.dtype(), &a.le_bytes()))));
    resolve_grid(kernel, &sizes)
}

/// The sizes of the grid axes a kernel takes from its inputs (`dyn(n)`): each the value of its
/// scalar input as `read` gives it, 0 where it is negative (as an empty `range`).
pub fn sizes_from_inputs(k: &Kernel, read: impl Fn(&str) -> Option<i64>) -> BTreeMap<String, u64> {
    (k.grid.iter().flatten())
        .filter_map(|a| {
            let v = read(a.from.as_deref()?)?;
            Some((a.name.clone(), v.max(0) as u64))
        })
        .collect()
}

/// The value of a scalar `i32` or `u32` from its little-endian bytes.
pub fn scalar_value(dtype: DType, bytes: &[u8]) -> Option<i64> {
    let word: [u8; 4] = bytes.get(..4)?.try_into().ok()?;
    match dtype {
        DType::I32 => Some(i64::from(i32::from_le_bytes(word))),
        DType::U32 => Some(i64::from(u32::from_le_bytes(word))),
        _ => None,
    }
}

/// Whether a kernel takes a grid size from an input (`dyn(n)`).
pub fn sizes_from_data(k: &Kernel) -> bool {
    k.grid.iter().flatten().any(|a| a.from.is_some())
}

/// Checks that every `in` argument has an array of its declared type, and (with `exact`) that
/// no array is given for a name that is not an `in` argument.
pub fn check_inputs(k: &Kernel, inputs: &BTreeMap<String, HostArray>, exact: bool) -> Result<(), LaunchError> {
    check_input_types(k, &inputs.iter().map(|(n, a)| (n.clone(), a.ty())).collect(), exact)
}

/// [`check_inputs`] on the inputs' types alone.
pub fn check_input_types(k: &Kernel, inputs: &BTreeMap<String, crate::ir::Type>, exact: bool) -> Result<(), LaunchError> {
    let kname = || k.name.clone();
    for (name, ty) in inputs {
        let Some(p) = k.param(name).filter(|p| p.kind == ParamKind::In) else {
            if !exact {
                continue;
            }
            let expected: Vec<String> = k.params_of(ParamKind::In).map(|p| format!("{}: {}", p.name, p.ty)).collect();
            let expected = if expected.is_empty() { "none".to_string() } else { expected.join(", ") };
            return Err(LaunchError::UnknownInput { kernel: kname(), name: name.clone(), expected });
        };
        if *ty != p.ty {
            return Err(LaunchError::WrongType {
                kernel: kname(),
                name: name.clone(),
                expected: p.ty.to_string(),
                got: ty.to_string(),
            });
        }
    }
    if let Some(p) = k.params_of(ParamKind::In).find(|p| !inputs.contains_key(&p.name)) {
        return Err(LaunchError::MissingInput { kernel: kname(), name: p.name.clone(), ty: p.ty.to_string() });
    }
    Ok(())
}

/// The grid of a verified kernel with every `dyn` size taken from `sizes`.
pub fn resolve_grid(kernel: &Verified, sizes: &BTreeMap<String, u64>) -> Result<Vec<LaunchAxis>, LaunchError> {
    let k = kernel.kernel();
    let kname = || k.name.clone();
    if !kernel.mesh_axes().is_empty() {
        return Err(LaunchError::NeedsMesh {
            kernel: kname(),
            axes: kernel.mesh_axes().iter().map(|a| format!("`{a}`")).collect::<Vec<_>>().join(", "),
            example: kernel.mesh_axes().iter().map(|a| format!("{a}: 4")).collect::<Vec<_>>().join(", "),
        });
    }
    let grid = kernel.grid();
    for axis in sizes.keys() {
        if !grid.iter().any(|a| &a.name == axis && a.size == AxisSize::Dyn) {
            let dyns: Vec<&str> = grid.iter().filter(|a| a.size == AxisSize::Dyn).map(|a| a.name.as_str()).collect();
            let expected = if dyns.is_empty() {
                "its grid has no `dyn` axis, so `--grid` is not needed".to_string()
            } else {
                format!("its `dyn` axes are: {}", dyns.join(", "))
            };
            return Err(LaunchError::NotDynAxis { kernel: kname(), axis: axis.clone(), expected });
        }
    }
    grid.iter()
        .map(|a| {
            let size = match a.size {
                AxisSize::Fixed(n) => n,
                // Planning and lowering, which see no data, take 1; a launch reads the input
                // (`bind`, the host's launches) and may run no program.
                AxisSize::Dyn if a.from.is_some() => match sizes.get(&a.name) {
                    Some(&0) => return Ok(LaunchAxis { name: a.name.clone(), size: 0, seq: a.seq }),
                    Some(&n) => n,
                    None => 1,
                },
                AxisSize::Dyn => {
                    *sizes.get(&a.name).ok_or_else(|| LaunchError::MissingGridSize { kernel: kname(), axis: a.name.clone() })?
                }
            };
            if size == 0 || size > MAX_AXIS_SIZE {
                return Err(LaunchError::BadGridSize { kernel: kname(), axis: a.name.clone(), size });
            }
            Ok(LaunchAxis { name: a.name.clone(), size, seq: a.seq })
        })
        .collect()
}
