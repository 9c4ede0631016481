//! numpy arrays in and out of a launch: inputs lent as byte views (copied once where they are
//! not C-contiguous little-endian arrays), outputs made fresh once they are known to fit.

use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use tessel_plugin_api::ir::{ArgDecl, DType, ParamKind, Type, Verified};

use crate::{Failure, raise};

/// numpy's name for a dtype.
pub(crate) fn numpy_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "float32",
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        DType::I32 => "int32",
        DType::U32 => "uint32",
        DType::Bool => "bool",
        DType::I8 => "int8",
        DType::U8 => "uint8",
        DType::I16 => "int16",
        DType::U16 => "uint16",
    }
}

/// An input as numpy holds it: C-contiguous, of the declared dtype, and a byte view of its
/// elements that the launch reads in place.
pub(crate) struct Lent<'py> {
    pub shape: Vec<usize>,
    pub dtype: DType,
    pub bytes: Bound<'py, PyArray1<u8>>,
}

/// A numpy array (or anything `np.asarray` takes) as input `arg`: exactly the declared dtype (a
/// `bf16` input also takes a `uint16` array of its bits), C-contiguous and little-endian (an
/// array that is not is copied once, by numpy). Its shape is checked once the kernel is
/// specialized for it.
pub(crate) fn lend<'py>(py: Python<'py>, kernel: &str, arg: &ArgDecl, obj: &Bound<'py, PyAny>) -> PyResult<Lent<'py>> {
    let np = py.import("numpy")?;
    let kwargs = PyDict::new(py);
    kwargs.set_item("order", "C")?;
    let mut arr = np.call_method("asarray", (obj,), Some(&kwargs))?;
    // The launch reads little-endian elements: an array of the other byte order (`>f4`), whose
    // dtype has the same name, is converted once (a copy), never read as if it were native.
    let order: String = arr.getattr("dtype")?.getattr("byteorder")?.extract()?;
    if order == ">" || (order == "=" && cfg!(target_endian = "big")) {
        let little = arr.getattr("dtype")?.call_method1("newbyteorder", ("<",))?;
        arr = arr.call_method1("astype", (little,))?;
    }
    let dtype: String = arr.getattr("dtype")?.getattr("name")?.extract()?;
    let shape: Vec<usize> = arr.getattr("shape")?.extract()?;
    let expected = numpy_name(arg.dtype);
    if !(dtype == expected || (arg.dtype == DType::BF16 && dtype == "uint16")) {
        let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
        let hint = if arg.dtype == DType::BF16 {
            "an ml_dtypes.bfloat16 array (or a uint16 array of its bits)".to_string()
        } else {
            format!("np.asarray({}, dtype=np.{expected})", arg.name)
        };
        return Err(raise(
            py,
            Failure::Input(format!(
                "input `{}` of kernel `{kernel}` is {dtype}[{}], but the kernel declares {arg}\n  give an array of {}: {hint}",
                arg.name,
                dims.join(", "),
                arg.dtype.name()
            )),
        ));
    }
    // A view, not a copy: the array is C-contiguous.
    let bytes = arr.call_method1("reshape", (-1,))?.call_method1("view", ("uint8",))?.cast_into::<PyArray1<u8>>()?;
    Ok(Lent { shape, dtype: arg.dtype, bytes })
}

/// An output: its name and type, the fresh numpy array it is returned as, and that array's bytes.
pub(crate) type Fresh<'py> = (String, Type, Bound<'py, PyAny>, Bound<'py, PyArray1<u8>>);

/// Fresh numpy arrays for the outputs of `kernel` (`bf16` as `ml_dtypes.bfloat16` where that
/// package is installed, else as `uint16` bits), each with a byte view the launch writes into.
pub(crate) fn fresh_outputs<'py>(py: Python<'py>, kernel: &Verified) -> PyResult<Vec<Fresh<'py>>> {
    let np = py.import("numpy")?;
    let mut out = Vec::new();
    for p in kernel.kernel().params_of(ParamKind::Out) {
        let storage = if p.ty.dtype == DType::BF16 { "uint16" } else { numpy_name(p.ty.dtype) };
        let arr = np.call_method1("empty", (PyTuple::new(py, &p.ty.shape)?, storage))?;
        let bytes = arr.call_method1("reshape", (-1,))?.call_method1("view", ("uint8",))?.cast_into::<PyArray1<u8>>()?;
        // Imported only for a bf16 output: its first import takes a second or more.
        let arr = match p.ty.dtype {
            DType::BF16 => match py.import("ml_dtypes") {
                Ok(m) => arr.call_method1("view", (m.getattr("bfloat16")?,))?,
                Err(_) => arr,
            },
            _ => arr,
        };
        out.push((p.name.clone(), p.ty.clone(), arr, bytes));
    }
    Ok(out)
}
