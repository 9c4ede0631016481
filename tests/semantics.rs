//! The reference semantics of docs/language.md, one rule at a time, on tiny kernels whose results
//! are worked out by hand here, each run on every executor (the interpreter, wgpu, and Mosaic
//! GPU's PTX on the emulator) through `on_every_executor!`, as CubeCL's `testgen` does. A
//! missing adapter or a refusal by design (Mosaic GPU takes no `dyn` grid) is a recorded skip.

mod common;

use common::exec::Exec;
use half::f16;
use tessel::HostArray;
use tessel_plugin_api::array::ArrayData;

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
    float_to_int_cast_truncates_and_saturates,
    max_and_min_propagate_nan,
    f16_arithmetic_rounds_every_result,
    ragged_blocks_load_other_and_drop_stores,
    negative_block_offsets_read_zero,
    masked_lanes_are_neither_read_nor_written,
    seq_axes_run_in_order_and_scratch_is_per_program,
    concatenate_puts_its_operands_one_after_another_along_the_axis,
    slice_takes_the_elements_from_its_start,
    computed_block_indices_floor_and_clamp,
    block_indices_read_integer_inputs,
    a_grid_size_from_an_input_runs_that_many_programs,
    a_while_loop_stops_where_its_carried_bool_is_false,
    strided_slices_take_every_kth_element,
);

fn f32s(v: &[f32]) -> HostArray {
    f32s_shaped(&[v.len()], v)
}

fn f32s_shaped(shape: &[usize], v: &[f32]) -> HostArray {
    HostArray { shape: shape.to_vec(), data: ArrayData::F32(v.to_vec()) }
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

fn concatenate_puts_its_operands_one_after_another_along_the_axis(ex: Exec) {
    let src = "
kernel k
  in  x: f32[2, 3]
  in  y: f32[2, 1]
  out r: f32[4, 3]
  out c: f32[2, 7]
{
  %x = load x
  %y = load y
  %n = neg %x
  %r = concatenate %x, %n axis 0
  store r, %r
  %c = concatenate %y, %x, %n axis 1
  store c, %c
}
";
    let x = f32s_shaped(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let y = f32s_shaped(&[2, 1], &[10.0, 20.0]);
    let Some(out) = ex.run(src, vec![("x", x), ("y", y)], &[]) else { return };
    assert_eq!(as_f32(&out["r"]), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, -1.0, -2.0, -3.0, -4.0, -5.0, -6.0]);
    assert_eq!(as_f32(&out["c"]), [10.0, 1.0, 2.0, 3.0, -1.0, -2.0, -3.0, 20.0, 4.0, 5.0, 6.0, -4.0, -5.0, -6.0]);
}

fn slice_takes_the_elements_from_its_start(ex: Exec) {
    let src = "
kernel k
  in  x: f32[3, 4]
  out r: f32[2, 2]
  out c: f32[3, 1]
{
  %x = load x
  %r = slice %x start (1, 1) : f32[2, 2]
  store r, %r
  %e = exp %x
  %c = slice %e start (0, 3) : f32[3, 1]
  %l = log %c
  store c, %l
}
";
    let v: Vec<f32> = (0..12).map(|i| i as f32).collect();
    let Some(out) = ex.run(src, vec![("x", f32s_shaped(&[3, 4], &v))], &[]) else { return };
    assert_eq!(as_f32(&out["r"]), [5.0, 6.0, 9.0, 10.0]);
    let c = as_f32(&out["c"]);
    for (got, want) in c.iter().zip([3.0f32, 7.0, 11.0]) {
        assert!((got - want).abs() <= 1e-5 * want, "log(exp(x)) of the last column: {c:?}");
    }
}

fn ints(shape: &[usize], v: &[i32]) -> HostArray {
    HostArray { shape: shape.to_vec(), data: ArrayData::I32(v.to_vec()) }
}

/// Block `b` of `0, 1, 2, ...` in blocks of 2 is `2b, 2b + 1`: the blocks picked, by hand.
fn blocks_of_two(picked: &[i32], base: f32) -> Vec<f32> {
    picked.iter().flat_map(|&b| [base + 2.0 * b as f32, base + 2.0 * b as f32 + 1.0]).collect()
}

fn computed_block_indices_floor_and_clamp(ex: Exec) {
    // x holds 4 blocks of 2. Python's floored `%` and `/` (C's truncation would pick other
    // blocks at i = 1, 3, 4, 5); a negative index counts from the end once, and past the end
    // it is clamped (Pallas's interpret mode).
    let src = "
kernel k
  grid (i: 6)
  in  x: f32[8] block [2] at (select(lt(i, 3), 3 - i, (i - 7) % 4))
  in  y: f32[8] block [2] at (max(i, 2)*2 - 5)
  in  z: f32[8] block [2] at ((i - 4) / 2 + 2)
  out o: f32[12] block [2] at (i)
  out p: f32[12] block [2] at (i)
  out q: f32[12] block [2] at (i)
{
  %x = load x
  store o, %x
  %y = load y
  store p, %y
  %z = load z
  store q, %z
}
";
    let v: Vec<f32> = (0..8).map(|i| i as f32).collect();
    let Some(out) = ex.run(src, vec![("x", f32s(&v)), ("y", f32s(&v)), ("z", f32s(&v))], &[]) else { return };
    // i = 0..6: 3 - i for i < 3, then (-4, -3, -2) floor-mod 4 = 0, 1, 2.
    assert_eq!(as_f32(&out["o"]), blocks_of_two(&[3, 2, 1, 0, 1, 2], 0.0));
    // 2*max(i, 2) - 5 = -1, -1, -1, 1, 3, 5: -1 counts from the end (block 3), 5 is clamped to 3.
    assert_eq!(as_f32(&out["p"]), blocks_of_two(&[3, 3, 3, 1, 3, 3], 0.0));
    // floor((i - 4) / 2) + 2 = 0, 0, 1, 1, 2, 2.
    assert_eq!(as_f32(&out["q"]), blocks_of_two(&[0, 0, 1, 1, 2, 2], 0.0));
}

fn block_indices_read_integer_inputs(ex: Exec) {
    // A block table (Pallas's scalar prefetch) and a scalar: entry -1 is the last block (3), 7
    // is clamped to it, and a read past the table (tbl[4]) is 0.
    let src = "
kernel k
  grid (g: 4)
  in  tbl: i32[4]
  in  n: i32
  in  x: f32[8] block [2] at (tbl[g])
  in  y: f32[8] block [2] at (tbl[g + 1] + n)
  out o: f32[8] block [2] at (g)
  out p: f32[8] block [2] at (g)
{
  %x = load x
  store o, %x
  %y = load y
  store p, %y
}
";
    let x: Vec<f32> = (0..8).map(|i| i as f32).collect();
    let y: Vec<f32> = (0..8).map(|i| 10.0 + i as f32).collect();
    let inputs = vec![("tbl", ints(&[4], &[2, -1, 7, 0])), ("n", ints(&[], &[1])), ("x", f32s(&x)), ("y", f32s(&y))];
    let Some(out) = ex.run(src, inputs, &[]) else { return };
    assert_eq!(as_f32(&out["o"]), blocks_of_two(&[2, 3, 3, 0], 0.0));
    // tbl[g + 1] + 1 = 0, 8, 1, 0 + 1 (past the table): blocks 0, 3, 1, 1.
    assert_eq!(as_f32(&out["p"]), blocks_of_two(&[0, 3, 1, 1], 10.0));
}

fn a_grid_size_from_an_input_runs_that_many_programs(ex: Exec) {
    // `dyn(n)`: n programs of 4 elements each; none for 0 or a negative n (outputs stay zeros);
    // past the array, the programs' stores are dropped.
    let src = "
kernel k
  grid (g: dyn(n))
  in  n: i32
  in  x: f32[16] block [4] at (g)
  out o: f32[16] block [4] at (g)
{
  %x = load x
  %y = add %x, 1.0
  store o, %y
}
";
    let x: Vec<f32> = (0..16).map(|i| i as f32).collect();
    for (n, ran) in [(3, 12), (1, 4), (0, 0), (-2, 0), (7, 16)] {
        let Some(out) = ex.run(src, vec![("n", ints(&[], &[n])), ("x", f32s(&x))], &[]) else { return };
        let want: Vec<f32> = (0..16).map(|i| if i < ran { i as f32 + 1.0 } else { 0.0 }).collect();
        assert_eq!(as_f32(&out["o"]), want, "n = {n}");
    }
}

fn a_while_loop_stops_where_its_carried_bool_is_false(ex: Exec) {
    // Doubling a block until its largest element reaches `lim`: the trip count depends on the
    // data (checked before every trip, the first included).
    let src = "
kernel k
  in  x: f32[8]
  in  lim: f32
  out o: f32[8]
  out trips: i32[1]
{
  %x = load x
  %l = load lim
  %m = max %x axis 0
  %go0 = lt %m, %l
  %n0 = full 0 : i32
  %y, %mf, %n, %go = for %i = 0 to 1000000 iter (%v = %x, %mm = %m, %c = %n0, %g = %go0) while %g {
    %v2 = mul %v, 2.0
    %mm2 = max %v2 axis 0
    %c2 = add %c, 1
    %g2 = lt %mm2, %l
    yield %v2, %mm2, %c2, %g2
  }
  store o, %y
  store trips[0], %n
}
";
    let x: Vec<f32> = (0..8).map(|i| i as f32 * 0.125).collect();
    // By hand: the largest is 0.875; 0.875 * 2^7 = 112 is the first to reach 100 (and 112: the
    // test is `lt`); 112.5 takes one more; 0.5 stops before the first trip.
    for (lim, trips) in [(100.0f32, 7), (0.5, 0), (112.0, 7), (112.5, 8)] {
        let Some(out) = ex.run(src, vec![("x", f32s(&x)), ("lim", f32s_shaped(&[], &[lim]))], &[]) else { return };
        let scale = (1u32 << trips) as f32;
        assert_eq!(as_f32(&out["o"]), x.iter().map(|v| v * scale).collect::<Vec<_>>(), "lim = {lim}");
        assert_eq!(as_i32(&out["trips"]), [trips], "lim = {lim}");
    }
}

fn strided_slices_take_every_kth_element(ex: Exec) {
    // `ds(START, SIZE, STRIDE)`: rows 1, 3, 5 and columns 0, 3, 6, 9 read; a stride running past
    // the array reads 0 there (columns 8, 11, 14 of 12); stores to every other element leave the
    // others as they were (zeros).
    let src = "
kernel k
  in  x: f32[8, 12]
  out a: f32[3, 4]
  out b: f32[3]
  out c: f32[12]
{
  %a = load x[ds(1, 3, 2), ds(0, 4, 3)]
  store a, %a
  %b = load x[7, ds(8, 3, 3)]
  store b, %b
  %r = load x[0, ds(0, 6, 2)]
  %s = add %r, 100.0
  store c[ds(1, 6, 2)], %s
}
";
    let x: Vec<f32> = (0..96).map(|i| i as f32).collect();
    let Some(out) = ex.run(src, vec![("x", f32s_shaped(&[8, 12], &x))], &[]) else { return };
    // By hand: element (r, c) of x is 12 r + c.
    assert_eq!(as_f32(&out["a"]), [12.0, 15.0, 18.0, 21.0, 36.0, 39.0, 42.0, 45.0, 60.0, 63.0, 66.0, 69.0]);
    assert_eq!(as_f32(&out["b"]), [92.0, 95.0, 0.0]);
    assert_eq!(as_f32(&out["c"]), [0.0, 100.0, 0.0, 102.0, 0.0, 104.0, 0.0, 106.0, 0.0, 108.0, 0.0, 110.0]);
}
