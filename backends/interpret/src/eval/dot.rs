//! `dot`: `f32` products through the `gemm` crate's blocked kernels, reading a block of an
//! array in place where the runtime has one ([`Matrix`]); integer products by a plain loop.

use std::borrow::Cow;

use tessel_plugin_api::ir::DType;

use super::shape::transpose;
use super::value::{Data, Val};

/// `c[m, n] = sum_k a[m, k] * b[k, n]`, `k` ascending, accumulating in `T` (the integer dots:
/// wrapping, so any order gives the same result).
fn matmul<T: Copy + Default>(a: &[T], b: &[T], m: usize, k: usize, n: usize, mul_add: impl Fn(T, T, T) -> T) -> Vec<T> {
    let mut c = vec![T::default(); m * n];
    for i in 0..m {
        let row = &mut c[i * n..(i + 1) * n];
        for p in 0..k {
            let x = a[i * k + p];
            let brow = &b[p * n..(p + 1) * n];
            for (acc, &y) in row.iter_mut().zip(brow) {
                *acc = mul_add(*acc, x, y);
            }
        }
    }
    c
}

/// Multiply-adds above which an f32 `dot` splits its rows over rayon's pool. Below, one
/// program's product is one task; parallel programs already keep every core busy, and a split
/// made while they do runs on the thread that made it (rayon's work stealing), so programs ×
/// GEMM threads never exceed the pool.
const SPLIT_MACS: usize = 1 << 21;

/// An f32 matrix in memory: its elements and the strides of its rows and columns (a transposed
/// operand is the same memory with the strides swapped).
#[derive(Clone, Copy)]
struct Strided<'a> {
    data: &'a [f32],
    rows: isize,
    cols: isize,
}

/// `c = a b` (`m × k` by `k × n`) through the `gemm` crate's blocked, vectorised kernels. Each
/// product of `f32`-held `f16`/`bf16` values is exact in `f32`; the sums are in the order the
/// GEMM blocks them, with a fused multiply-add where the CPU has one (docs/language.md §8).
fn sgemm(a: Strided<'_>, b: Strided<'_>, m: usize, k: usize, n: usize) -> Vec<f32> {
    use rayon::prelude::*;
    if m == 0 || n == 0 || k == 0 {
        return vec![0.0f32; m * n];
    }
    // The GEMM writes every element without reading it (`read_dst` false): no zeroing first.
    let mut c = Vec::<f32>::with_capacity(m * n);
    // A thread outside rayon's pool (a thread of a program of the concurrent model, whose pool
    // worker waits for it) multiplies on its own: work it handed the pool could wait forever for
    // workers that are all waiting for such threads.
    let in_pool = rayon::current_thread_index().is_some();
    let rows_per_task = if in_pool && m * n * k >= SPLIT_MACS { m.div_ceil(4 * rayon::current_num_threads()).max(8) } else { m };
    let task = |(t, c): (usize, &mut [std::mem::MaybeUninit<f32>])| {
        let rows = c.len() / n;
        let a_task = &a.data[t * rows_per_task * a.rows as usize..];
        // The last element either operand is read at, which must lie inside its slice.
        let last = |s: Strided<'_>, r: usize, q: usize| (r - 1) * s.rows as usize + (q - 1) * s.cols as usize;
        assert!(last(Strided { data: a_task, ..a }, rows, k) < a_task.len() && last(b, k, n) < b.data.len());
        // SAFETY: the GEMM reads `rows × k` elements of `a_task` and `k × n` of `b` at their
        // (positive) strides, all inside the slices (the assert above), and writes `rows × n`
        // elements of `c` contiguously, which is this task's own chunk of the spare capacity;
        // it does not read `c` (`read_dst` false), so the chunk may start uninitialized.
        #[allow(unsafe_code)]
        unsafe {
            gemm::gemm(
                rows,
                n,
                k,
                c.as_mut_ptr().cast::<f32>(),
                1,
                n as isize,
                false,
                a_task.as_ptr(),
                a.cols,
                a.rows,
                b.data.as_ptr(),
                b.cols,
                b.rows,
                0.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        }
    };
    let spare = &mut c.spare_capacity_mut()[..m * n];
    if in_pool {
        spare.par_chunks_mut(rows_per_task * n).enumerate().for_each(task);
    } else {
        task((0, spare));
    }
    // SAFETY: the tasks above wrote all `m × n` elements.
    #[allow(unsafe_code)]
    unsafe {
        c.set_len(m * n)
    };
    c
}

/// One small blocked product (16 × 16 × 16: neither a vector nor small enough for the gemm
/// crate's unblocked kernels), so that the crate's one-time set-up is done (see `warm_up`).
pub(crate) fn warm_gemm() {
    let x = [1.0f32; 256];
    let m = Strided { data: &x, rows: 16, cols: 1 };
    std::hint::black_box(sgemm(m, m, 16, 16, 16));
}

/// A row-major `f32` matrix in memory: `rows × cols`, rows `stride` elements apart (a block of
/// a larger array, read in place).
#[derive(Clone, Copy)]
pub(crate) struct Matrix<'a> {
    pub data: &'a [f32],
    pub rows: usize,
    pub cols: usize,
    pub stride: usize,
}

impl<'a> Matrix<'a> {
    /// A 2-D float value as a matrix; `None` for integers.
    pub fn of(v: &'a Val) -> Option<Matrix<'a>> {
        match &v.data {
            Data::F(x) => Some(Matrix { data: x, rows: v.shape[0], cols: v.shape[1], stride: v.shape[1] }),
            _ => None,
        }
    }

    /// Its memory with the strides of its rows and columns; transposed, they swap.
    fn strided(self, transposed: bool) -> Strided<'a> {
        let (rows, cols) = if transposed { (1, self.stride as isize) } else { (self.stride as isize, 1) };
        Strided { data: self.data, rows, cols }
    }
}

/// `dot` of two `f32` matrices (each transposed where its flag says), by [`sgemm`].
pub(crate) fn dot_f32(a: Matrix<'_>, b: Matrix<'_>, trans_a: bool, trans_b: bool) -> Val {
    let (m, k) = if trans_a { (a.cols, a.rows) } else { (a.rows, a.cols) };
    let n = if trans_b { b.rows } else { b.cols };
    Val { dtype: DType::F32, shape: vec![m, n], data: Data::F(sgemm(a.strided(trans_a), b.strided(trans_b), m, k, n)) }
}

pub(crate) fn dot(a: &Val, b: &Val, trans_a: bool, trans_b: bool) -> Val {
    if let (Some(x), Some(y)) = (Matrix::of(a), Matrix::of(b)) {
        return dot_f32(x, y, trans_a, trans_b);
    }
    let (m, k) = if trans_a { (a.shape[1], a.shape[0]) } else { (a.shape[0], a.shape[1]) };
    let n = if trans_b { b.shape[0] } else { b.shape[1] };
    let a = if trans_a { Cow::Owned(transpose(a, &[1, 0])) } else { Cow::Borrowed(a) };
    let b = if trans_b { Cow::Owned(transpose(b, &[1, 0])) } else { Cow::Borrowed(b) };
    let data = match (&a.data, &b.data) {
        (Data::I(x), Data::I(y)) => Data::I(matmul(x, y, m, k, n, |c, x, y| c.wrapping_add(x.wrapping_mul(y)))),
        (Data::U(x), Data::U(y)) => Data::U(matmul(x, y, m, k, n, |c, x, y| c.wrapping_add(x.wrapping_mul(y)))),
        _ => unreachable!("verifier: dot on two numeric matrices of one dtype"),
    };
    Val { dtype: a.dtype.widened(), shape: vec![m, n], data }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `f32` dots against an `f64` reference, for shapes that take each of the GEMM crate's
    /// paths (a vector on either side, tiny products, blocked ones, a split over the pool) and
    /// each transposition. The result's memory starts uninitialized, so each product is made
    /// right after freeing a buffer of its size full of NaNs: were any element left unwritten,
    /// or read before written, the allocator's reuse of that buffer would show.
    #[test]
    fn f32_dots_write_every_element_of_the_product() {
        let mut state = 3u32;
        let mut next = move || {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (state >> 8) as f32 / (1 << 23) as f32 - 1.0
        };
        for (m, k, n) in
            [(1, 5, 1), (1, 7, 9), (9, 7, 1), (3, 4, 5), (16, 16, 16), (17, 33, 19), (100, 3, 70), (512, 64, 128), (4, 0, 3)]
        {
            for (trans_a, trans_b) in [(false, false), (true, false), (false, true), (true, true)] {
                let a: Vec<f32> = (0..m * k).map(|_| next()).collect();
                let b: Vec<f32> = (0..k * n).map(|_| next()).collect();
                let (ar, ac) = if trans_a { (k, m) } else { (m, k) };
                let (br, bc) = if trans_b { (n, k) } else { (k, n) };
                let at = |i: usize, p: usize| f64::from(if trans_a { a[p * m + i] } else { a[i * k + p] });
                let bt = |p: usize, j: usize| f64::from(if trans_b { b[j * k + p] } else { b[p * n + j] });
                drop(std::hint::black_box(vec![f32::NAN; m * n]));
                let got = dot_f32(
                    Matrix { data: &a, rows: ar, cols: ac, stride: ac },
                    Matrix { data: &b, rows: br, cols: bc, stride: bc },
                    trans_a,
                    trans_b,
                );
                assert_eq!(got.shape, [m, n]);
                let Data::F(c) = &got.data else { panic!("an f32 product") };
                for i in 0..m {
                    for j in 0..n {
                        let want: f64 = (0..k).map(|p| at(i, p) * bt(p, j)).sum();
                        let g = f64::from(c[i * n + j]);
                        assert!(
                            (g - want).abs() <= 1e-5 * (1.0 + want.abs()),
                            "{m}x{k}x{n} {trans_a} {trans_b} at ({i}, {j}): {g} against {want}"
                        );
                    }
                }
            }
        }
    }
}
