//! The reference semantics of docs/language.md, one rule at a time, on tiny kernels whose results
//! are worked out by hand here, each run on every executor (the interpreter, wgpu, and Mosaic
//! GPU's PTX on the emulator) through `on_every_executor!`, as CubeCL's `testgen` does. A
//! missing adapter or a refusal by design (Mosaic GPU takes no `dyn` grid) is a recorded skip.

mod common;

use std::collections::BTreeMap;

use half::f16;
use tessel::{HostArray, LaunchArgs};
use tessel_plugin_api::array::ArrayData;

/// Where a case runs.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Exec {
    Interpret,
    Wgpu,
    MosaicEmulated,
}

impl Exec {
    /// The outputs of the kernel in `src` on this executor, or `None` after a recorded skip.
    fn run(self, src: &str, inputs: Vec<(&str, HostArray)>, grid: &[(&str, u64)]) -> Option<BTreeMap<String, HostArray>> {
        let kernels = tessel::load_source("test.tk", src).unwrap_or_else(|e| panic!("{e}"));
        let args = LaunchArgs {
            inputs: inputs.into_iter().map(|(n, a)| (n.to_string(), a)).collect(),
            grid: grid.iter().map(|(n, s)| (n.to_string(), *s)).collect(),
        };
        let what = format!("semantics on {self:?}");
        let outputs = match self {
            Exec::Interpret => tessel::run_kernel("interpret", &kernels[0], &args).unwrap_or_else(|e| panic!("{e}")),
            Exec::Wgpu => {
                common::wgpu_adapter(&what)?;
                tessel::run_kernel("wgpu", &kernels[0], &args).unwrap_or_else(|e| panic!("{e}"))
            }
            Exec::MosaicEmulated => {
                let rt = tessel::Runtime::new(&[]).expect("runtime");
                let call = [tessel::KernelLaunch { kernel: &kernels[0], mesh: None }];
                let ptx = match rt.lower("mosaic-gpu", &call, &[], &Default::default()) {
                    Ok(mut l) => l.remove(0).1,
                    // The one refusal by design among these cases (DESIGN.md's sentence).
                    Err(e) if e.to_string().starts_with("dynamic grid bounds not supported in the Mosaic GPU backend") => {
                        eprintln!(
                            "{what}: refused by design, as it should be: {}",
                            e.to_string().lines().next().unwrap_or_default()
                        );
                        return None;
                    }
                    Err(e) => panic!("{e}"),
                };
                common::emulate(&ptx, &kernels[0], &args, false).unwrap_or_else(|e| panic!("{e}"))
            }
        };
        Some(outputs.into_iter().collect())
    }
}

/// Instantiates each case `fn name(ex: Exec)` as a test per executor: `interpret::name`,
/// `wgpu::name`, `mosaic_emulated::name`.
macro_rules! on_every_executor {
    ($($case:ident),* $(,)?) => {
        mod interpret {
            $(#[test] fn $case() { super::$case(super::Exec::Interpret) })*
        }
        mod wgpu {
            $(#[test] fn $case() { super::$case(super::Exec::Wgpu) })*
        }
        mod mosaic_emulated {
            $(#[test] fn $case() { super::$case(super::Exec::MosaicEmulated) })*
        }
    };
}

on_every_executor!(
    integer_division_truncates_and_zero_divisor_gives_zero,
    u32_shift_right_is_logical,
    float_to_int_cast_truncates_and_saturates,
    max_and_min_propagate_nan,
    f16_arithmetic_rounds_every_result,
    ragged_blocks_load_other_and_drop_stores,
    negative_block_offsets_read_zero,
    masked_lanes_are_neither_read_nor_written,
    seq_axes_run_in_order_and_scratch_is_per_program,
    dyn_grid_takes_its_size_at_launch,
    scalar_arguments_are_passed_by_value,
    shape_ops_and_integer_dot,
    for_loops_step_and_may_run_zero_times,
    bitcast_keeps_bits,
);

fn i32s(v: &[i32]) -> HostArray {
    HostArray { shape: vec![v.len()], data: ArrayData::I32(v.to_vec()) }
}

fn f32s(v: &[f32]) -> HostArray {
    HostArray { shape: vec![v.len()], data: ArrayData::F32(v.to_vec()) }
}

fn as_i32(a: &HostArray) -> Vec<i32> {
    match &a.data {
        ArrayData::I32(v) => v.clone(),
        other => panic!("expected i32, got {other:?}"),
    }
}

fn as_u32(a: &HostArray) -> Vec<u32> {
    match &a.data {
        ArrayData::U32(v) => v.clone(),
        other => panic!("expected u32, got {other:?}"),
    }
}

fn as_f32(a: &HostArray) -> Vec<f32> {
    match &a.data {
        ArrayData::F32(v) => v.clone(),
        other => panic!("expected f32, got {other:?}"),
    }
}

const INT_BINARY: &str = "
kernel k
  in  a: i32[6]
  in  b: i32[6]
  out div: i32[6]
  out rem: i32[6]
  out shl: i32[6]
  out shr: i32[6]
  out add: i32[6]
{
  %a = load a
  %b = load b
  %d = div %a, %b
  store div, %d
  %r = rem %a, %b
  store rem, %r
  %l = shl %a, %b
  store shl, %l
  %s = shr %a, %b
  store shr, %s
  %w = add %a, %b
  store add, %w
}
";

fn integer_division_truncates_and_zero_divisor_gives_zero(ex: Exec) {
    let a = [-7, 7, -8, 5, i32::MAX, 1];
    let b = [2, -2, 0, 33, 1, 31];
    let Some(out) = ex.run(INT_BINARY, vec![("a", i32s(&a)), ("b", i32s(&b))], &[]) else { return };
    assert_eq!(as_i32(&out["div"]), [-3, -3, 0, 0, i32::MAX, 0]);
    assert_eq!(as_i32(&out["rem"]), [-1, 1, 0, 5, 0, 1]);
    // Shift counts modulo 32: 5 << 33 = 5 << 1; -8 >> 0; arithmetic shift keeps the sign.
    assert_eq!(as_i32(&out["shl"]), [-7 << 2, 7 << 30, -8, 10, -2, i32::MIN]);
    assert_eq!(as_i32(&out["shr"]), [-2, 0, -8, 2, i32::MAX / 2, 0]);
    // Wrapping add.
    assert_eq!(as_i32(&out["add"]), [-5, 5, -8, 38, i32::MIN, 32]);
}

fn u32_shift_right_is_logical(ex: Exec) {
    let src = "
kernel k
  in  a: u32[2]
  out o: u32[2]
{
  %a = load a
  %s = shr %a, 31
  store o, %s
}
";
    let a = HostArray { shape: vec![2], data: ArrayData::U32(vec![0x8000_0000, 0xffff_ffff]) };
    let Some(out) = ex.run(src, vec![("a", a)], &[]) else { return };
    assert_eq!(as_u32(&out["o"]), [1, 1]);
}

fn float_to_int_cast_truncates_and_saturates(ex: Exec) {
    let src = "
kernel k
  in  x: f32[6]
  out i: i32[6]
  out u: u32[6]
{
  %x = load x
  %i = cast %x : i32
  store i, %i
  %u = cast %x : u32
  store u, %u
}
";
    let x = [-1.7, 2.9, 3e9, -3e9, f32::NAN, 5e9];
    let Some(out) = ex.run(src, vec![("x", f32s(&x))], &[]) else { return };
    assert_eq!(as_i32(&out["i"]), [-1, 2, i32::MAX, i32::MIN, 0, i32::MAX]);
    assert_eq!(as_u32(&out["u"]), [0, 2, 3_000_000_000, 0, 0, u32::MAX]);
}

fn max_and_min_propagate_nan(ex: Exec) {
    let src = "
kernel k
  in  x: f32[3]
  out o: f32[3]
  out r: f32[1]
{
  %x = load x
  %m = max %x, 1.0
  store o, %m
  %s = min %x axis 0 keepdims
  store r, %s
}
";
    let Some(out) = ex.run(src, vec![("x", f32s(&[0.5, f32::NAN, 2.0]))], &[]) else { return };
    let o = as_f32(&out["o"]);
    assert_eq!(o[0], 1.0);
    assert!(o[1].is_nan());
    assert_eq!(o[2], 2.0);
    assert!(as_f32(&out["r"])[0].is_nan());
}

fn f16_arithmetic_rounds_every_result(ex: Exec) {
    let src = "
kernel k
  in  x: f16[2]
  in  y: f16[2]
  out o: f16[2]
{
  %x = load x
  %y = load y
  %s = add %x, %y
  store o, %s
}
";
    let h = |v: &[f32]| HostArray { shape: vec![v.len()], data: ArrayData::F16(v.iter().map(|&x| f16::from_f32(x)).collect()) };
    // 2048 + 1 is not an f16 (spacing 2 there): round to even gives 2048. 0.5 + 0.25 is exact.
    let Some(out) = ex.run(src, vec![("x", h(&[2048.0, 0.5])), ("y", h(&[1.0, 0.25]))], &[]) else { return };
    let ArrayData::F16(o) = &out["o"].data else { panic!("f16 output") };
    assert_eq!(o.iter().map(|x| x.to_f32()).collect::<Vec<_>>(), [2048.0, 0.75]);
}

fn ragged_blocks_load_other_and_drop_stores(ex: Exec) {
    // 10 elements in blocks of 4: the last block has 2 elements in the array.
    let src = "
kernel k
  grid (i: 3)
  in  x: f32[10] block [4] at (i)
  out o: f32[10] block [4] at (i)
  out edge: f32[12] block [4] at (i)
{
  %x = load x other 7.0
  store o, %x
  store edge, %x
}
";
    let x: Vec<f32> = (0..10).map(|v| v as f32).collect();
    let Some(out) = ex.run(src, vec![("x", f32s(&x))], &[]) else { return };
    assert_eq!(as_f32(&out["o"]), x);
    let mut want: Vec<f32> = x.clone();
    want.extend([7.0, 7.0]);
    assert_eq!(as_f32(&out["edge"]), want);
}

fn negative_block_offsets_read_zero(ex: Exec) {
    // Block index i - 1: program 0 reads before the array and sees zeros.
    let src = "
kernel k
  grid (i: 3)
  in  x: f32[6] block [2] at (i - 1)
  out o: f32[6] block [2] at (i)
{
  %x = load x
  store o, %x
}
";
    let Some(out) = ex.run(src, vec![("x", f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]))], &[]) else { return };
    assert_eq!(as_f32(&out["o"]), [0.0, 0.0, 1.0, 2.0, 3.0, 4.0]);
}

fn masked_lanes_are_neither_read_nor_written(ex: Exec) {
    let src = "
kernel k
  in  x: f32[4]
  out o: f32[4]
{
  %lane = iota 0 : i32[4]
  %even = rem %lane, 2
  %m = eq %even, 0
  %x = load x mask %m other -1.0
  store o, %x
  %nine = full 9.0 : f32[4]
  %odd = not %m
  store o, %nine mask %odd
}
";
    let Some(out) = ex.run(src, vec![("x", f32s(&[10.0, 11.0, 12.0, 13.0]))], &[]) else { return };
    assert_eq!(as_f32(&out["o"]), [10.0, 9.0, 12.0, 9.0]);
}

fn seq_axes_run_in_order_and_scratch_is_per_program(ex: Exec) {
    // o[i] = digits of k in order: ((0*10 + 0)*10 + 1)*10 + 2 = 12, for every program i.
    // The scratch counter counts this program's steps only: 3.
    let src = "
kernel k
  grid (i: 4, k: 3 seq)
  out o: f32[4] block [1] at (i)
  out n: f32[4] block [1] at (i)
  scratch c: f32[1]
{
  %k = program_id k
  %kf = cast %k : f32
  %o = load o
  %t = mul %o, 10.0
  %d = add %t, %kf
  store o, %d
  %c = load c
  %c1 = add %c, 1.0
  store c, %c1
  store n, %c1
}
";
    let Some(out) = ex.run(src, vec![], &[]) else { return };
    assert_eq!(as_f32(&out["o"]), [12.0; 4]);
    assert_eq!(as_f32(&out["n"]), [3.0; 4]);
}

fn dyn_grid_takes_its_size_at_launch(ex: Exec) {
    let src = "
kernel k
  grid (i: dyn)
  in  x: f32[8] block [2] at (i)
  out o: f32[8] block [2] at (i)
{
  %n = num_programs i
  %nf = cast %n : f32
  %x = load x
  %y = mul %x, %nf
  store o, %y
}
";
    let x = f32s(&[1.0; 8]);
    let Some(out) = ex.run(src, vec![("x", x)], &[("i", 3)]) else { return };
    // Three programs cover the first six elements; the rest stay zero.
    assert_eq!(as_f32(&out["o"]), [3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 0.0, 0.0]);
}

fn scalar_arguments_are_passed_by_value(ex: Exec) {
    let src = "
kernel k
  in  x: f32[3]
  in  s: f32
  out o: f32[3]
{
  %x = load x
  %s = load s
  %y = mul %x, %s
  store o, %y
}
";
    let s = HostArray { shape: vec![], data: ArrayData::F32(vec![2.5]) };
    let Some(out) = ex.run(src, vec![("x", f32s(&[1.0, 2.0, 4.0])), ("s", s)], &[]) else { return };
    assert_eq!(as_f32(&out["o"]), [2.5, 5.0, 10.0]);
}

fn shape_ops_and_integer_dot(ex: Exec) {
    let src = "
kernel k
  out t: i32[3, 2]
  out d: i32[2, 2]
  out r: i32[6]
  out b: i32[2, 3]
  out p: i32[2]
{
  %a = iota 1 : i32[2, 3]
  %row = iota 0 : i32[2, 3]
  %ten = mul %row, 10
  %m = add %a, %ten
  %t = transpose %m perm (1, 0)
  store t, %t
  %d = dot %m, %m trans_b
  store d, %d
  %r = reshape %m : i32[6]
  store r, %r
  %one = iota 0 : i32[3]
  %b = broadcast %one : i32[2, 3]
  store b, %b
  %plus = add %m, 1
  %p = prod %plus axis 1
  store p, %p
}
";
    // m = [[0, 1, 2], [10, 11, 12]]
    let Some(out) = ex.run(src, vec![], &[]) else { return };
    assert_eq!(as_i32(&out["t"]), [0, 10, 1, 11, 2, 12]);
    // m m^T = [[0+1+4, 0+11+24], [.., 100+121+144]]
    assert_eq!(as_i32(&out["d"]), [5, 35, 35, 365]);
    assert_eq!(as_i32(&out["r"]), [0, 1, 2, 10, 11, 12]);
    assert_eq!(as_i32(&out["b"]), [0, 1, 2, 0, 1, 2]);
    assert_eq!(as_i32(&out["p"]), [6, 11 * 12 * 13]);
}

fn for_loops_step_and_may_run_zero_times(ex: Exec) {
    let src = "
kernel k
  out o: i32[2]
{
  %z = full 0 : i32
  %s = for %i = 1 to 10 step 3 iter (%acc = %z) {
    %n = add %acc, %i
    yield %n
  }
  %e = for %j = 5 to 5 iter (%b = %z) {
    %m = add %b, 100
    yield %m
  }
  %v = broadcast %s : i32[2]
  %lane = iota 0 : i32[2]
  %first = eq %lane, 0
  %w = select %first, %v, %e
  store o, %w
}
";
    // 1 + 4 + 7 = 12; the empty loop gives its initial 0.
    let Some(out) = ex.run(src, vec![], &[]) else { return };
    assert_eq!(as_i32(&out["o"]), [12, 0]);
}

fn bitcast_keeps_bits(ex: Exec) {
    let src = "
kernel k
  in  x: f32[2]
  out o: u32[2]
{
  %x = load x
  %b = bitcast %x : u32
  store o, %b
}
";
    let Some(out) = ex.run(src, vec![("x", f32s(&[1.0, -2.0]))], &[]) else { return };
    assert_eq!(as_u32(&out["o"]), [0x3f80_0000, 0xc000_0000]);
}

#[test]
fn several_kernels_in_one_file_are_chosen_by_name() {
    let file = common::root().join("tests/in/two_kernels.tk").display().to_string();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().display().to_string();
    let r = common::tessel(&["run", &file, "--out-dir", &out]);
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("defines several kernels: scale, shift"), "{}", r.stderr);
    let x: Vec<f32> = (0..16).map(|v| v as f32).collect();
    let input = common::input_arg(dir.path(), "x", &f32s(&x));
    let r = common::tessel(&["run", &file, "--kernel", "shift", "--input", &input, "--out-dir", &out]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let want: Vec<f32> = x.iter().map(|v| v + 1.0).collect();
    assert_eq!(as_f32(&common::read_output(dir.path(), "o")), want);
}

#[test]
fn a_kernel_without_grid_takes_its_axes_from_the_mesh() {
    let file = common::root().join("tests/in/mesh_grid.tk").display().to_string();
    let dir = tempfile::tempdir().unwrap();
    let x: Vec<f32> = (0..64 * 32).map(|v| v as f32).collect();
    let input = common::input_arg(dir.path(), "x", &HostArray { shape: vec![64, 32], data: ArrayData::F32(x.clone()) });
    let out = dir.path().display().to_string();
    let r = common::tessel(&["run", &file, "--mesh", "grid(i: 4, j: 2)", "--input", &input, "--out-dir", &out]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    // o[r, c] = x[r, c] + (the row block r / 16, which is program_id i).
    let want: Vec<f32> = x.iter().enumerate().map(|(n, v)| v + ((n / 32) / 16) as f32).collect();
    assert_eq!(as_f32(&common::read_output(dir.path(), "o")), want);
    let r = common::tessel(&["run", &file, "--input", &input, "--out-dir", &out]);
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("has no grid and uses the axes `i`, `j`"), "{}", r.stderr);
    let r = common::tessel(&["run", &file, "--mesh", "grid(i: 4)", "--input", &input, "--out-dir", &out]);
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("uses axis `j`, which the mesh grid(i: 4) does not name"), "{}", r.stderr);
}
