//! Reductions along one axis (`sum`, `prod`, `max`, `min`): each output is bit for bit the
//! fold of its elements in ascending order.

use tessel_plugin_api::ir::ReduceOp;

use super::float::{nan_max, nan_min, round_all, wrap_i, wrap_u};
use super::value::{Data, Slice, Val, View};

/// `f` over one row, left to right from its first element.
fn fold_row<T: Copy>(row: &[T], f: impl Fn(T, T) -> T) -> T {
    row[1..].iter().fold(row[0], |acc, &x| f(acc, x))
}

/// Folds `[outer, n, inner]` along the middle dimension, in order. (Not compiled for wider
/// vector units: along the innermost axis they would gather each step's eight elements from
/// eight rows, which measured slower than the baseline's loads.)
fn fold_axis<T: Copy>(v: &[T], outer: usize, n: usize, inner: usize, f: impl Fn(T, T) -> T) -> Vec<T> {
    if inner == 1 {
        // Along the innermost axis: each output folds one contiguous row, left to right. Rows go
        // [`ROWS`] at a time, one element of each in turn: that many independent chains of `f`,
        // where one row alone is a chain whose every step waits for the last. Each row's order,
        // and so every bit, is unchanged.
        const ROWS: usize = 8;
        let mut out = Vec::with_capacity(outer);
        let mut groups = v.chunks_exact(n * ROWS);
        for group in &mut groups {
            let rows: [&[T]; ROWS] = std::array::from_fn(|k| &group[k * n..(k + 1) * n]);
            let mut acc: [T; ROWS] = std::array::from_fn(|k| rows[k][0]);
            for r in 1..n {
                for (acc, row) in acc.iter_mut().zip(&rows) {
                    *acc = f(*acc, row[r]);
                }
            }
            out.extend_from_slice(&acc);
        }
        out.extend(groups.remainder().chunks_exact(n).map(|row| fold_row(row, &f)));
        return out;
    }
    let mut out = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        let base = o * n * inner;
        out.extend_from_slice(&v[base..base + inner]);
        let row = &mut out[o * inner..];
        for r in 1..n {
            let src = &v[base + r * inner..base + (r + 1) * inner];
            for (acc, &x) in row.iter_mut().zip(src) {
                *acc = f(*acc, x);
            }
        }
    }
    out
}

/// The maximum (`MAX`) or minimum of each contiguous row of `n`: bit for bit the left-to-right
/// fold of [`nan_max`] or [`nan_min`], computed in vector lanes (AVX-512, AVX2, NEON). The lanes' winner is the fold's
/// wherever it is the only float of its value — neither zero (`-0.0` and `0.0` tie, and the fold
/// keeps the later) nor NaN (whose payload the fold's order picks); such rows fold in order.
#[multiversion::multiversion(targets("x86_64+avx512f+avx512dq+avx512vl+avx512bw", "x86_64+avx2+fma", "aarch64+neon"))]
fn extreme_rows<const MAX: bool>(v: &[f32], n: usize) -> Vec<f32> {
    const LANES: usize = 16;
    let better = |x: f32, m: f32| if MAX { x > m } else { x < m };
    let fold = if MAX { nan_max } else { nan_min };
    v.chunks_exact(n)
        .map(|row| {
            let (mut best, mut nan) = ([row[0]; LANES], [false; LANES]);
            let mut lanes = row.chunks_exact(LANES);
            for c in &mut lanes {
                for ((m, nan), &x) in best.iter_mut().zip(&mut nan).zip(c) {
                    *m = if better(x, *m) { x } else { *m };
                    *nan |= x.is_nan();
                }
            }
            let rest = lanes.remainder();
            let m = best.iter().chain(rest).fold(row[0], |m, &x| if better(x, m) { x } else { m });
            // A NaN anywhere, `row[0]` included, is in a lane or the rest.
            if m == 0.0 || nan.contains(&true) || rest.iter().any(|x| x.is_nan()) { fold_row(row, fold) } else { m }
        })
        .collect()
}

pub(crate) fn reduce(op: ReduceOp, a: View<'_>, axis: usize, keepdims: bool) -> Val {
    let outer: usize = a.shape[..axis].iter().product();
    let n = a.shape[axis];
    let inner: usize = a.shape[axis + 1..].iter().product();
    let mut shape = a.shape.to_vec();
    if keepdims {
        shape[axis] = 1;
    } else {
        shape.remove(axis);
    }
    let data = match a.data {
        Slice::F(v) => Data::F(round_all(
            a.dtype,
            match op {
                ReduceOp::Sum => fold_axis(v, outer, n, inner, |x, y| x + y),
                ReduceOp::Prod => fold_axis(v, outer, n, inner, |x, y| x * y),
                ReduceOp::Max if inner == 1 => extreme_rows::<true>(v, n),
                ReduceOp::Min if inner == 1 => extreme_rows::<false>(v, n),
                ReduceOp::Max => fold_axis(v, outer, n, inner, nan_max),
                ReduceOp::Min => fold_axis(v, outer, n, inner, nan_min),
            },
        )),
        // Narrow integers wrap once at the end: wrapping is a ring homomorphism, so the sum and
        // product wrapped after every step are the same.
        Slice::I(v) => Data::I(wrap_i(
            a.dtype,
            match op {
                ReduceOp::Sum => fold_axis(v, outer, n, inner, i32::wrapping_add),
                ReduceOp::Prod => fold_axis(v, outer, n, inner, i32::wrapping_mul),
                ReduceOp::Max => fold_axis(v, outer, n, inner, i32::max),
                ReduceOp::Min => fold_axis(v, outer, n, inner, i32::min),
            },
        )),
        Slice::U(v) => Data::U(wrap_u(
            a.dtype,
            match op {
                ReduceOp::Sum => fold_axis(v, outer, n, inner, u32::wrapping_add),
                ReduceOp::Prod => fold_axis(v, outer, n, inner, u32::wrapping_mul),
                ReduceOp::Max => fold_axis(v, outer, n, inner, u32::max),
                ReduceOp::Min => fold_axis(v, outer, n, inner, u32::min),
            },
        )),
        Slice::B(_) => unreachable!("verifier: reduce on bool"),
    };
    Val { dtype: a.dtype, shape, data }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Row folds taken eight rows at a time give each row's left-to-right fold, bit for bit: row
    /// counts around the group size, rows of one element, and float sums whose order shows.
    #[test]
    fn row_folds_keep_each_rows_order() {
        let mut state = 7u32;
        let mut next = || {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (state >> 8) as f32 * 1e-3 - 8e3
        };
        for (rows, n) in [(1, 1), (7, 3), (8, 1), (8, 256), (9, 5), (17, 33), (64, 2)] {
            let v: Vec<f32> = (0..rows * n).map(|_| next()).collect();
            for f in [|a: f32, b: f32| a + b, nan_max, |a: f32, b: f32| a * b] {
                let want: Vec<u32> = v.chunks(n).map(|row| row.iter().skip(1).fold(row[0], |a, &x| f(a, x)).to_bits()).collect();
                let got: Vec<u32> = fold_axis(&v, rows, n, 1, f).iter().map(|x| x.to_bits()).collect();
                assert_eq!(got, want, "{rows} rows of {n}");
            }
        }
    }

    /// Row maxima and minima in lanes give the in-order fold's bits: rows of distinct values,
    /// rows whose extreme is a tie of `-0.0` and `0.0` in either order, NaNs (with payloads)
    /// anywhere, infinities, and rows shorter and longer than the lanes.
    #[test]
    fn row_extremes_are_the_in_order_fold() {
        let quiet_nan = f32::from_bits(0x7fc0_0001);
        let specials = [0.0, -0.0, f32::NAN, -f32::NAN, quiet_nan, f32::INFINITY, f32::NEG_INFINITY, -1.5, 2.5, 1e-40];
        let mut state = 11u32;
        let mut next = move || {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            state >> 8 // the high bits: an LCG's low bits repeat with short periods
        };
        for n in [1, 3, 15, 16, 17, 40, 256] {
            for _ in 0..400 {
                // Mostly small negative values, so that zeros are often the extreme.
                let row: Vec<f32> = (0..n)
                    .map(|_| match next() % 8 {
                        0 => specials[(next() % specials.len() as u32) as usize],
                        1 | 2 => [0.0, -0.0][(next() % 2) as usize],
                        _ => -((next() % 1000) as f32),
                    })
                    .collect();
                let rows: Vec<f32> = row.iter().chain(&row).copied().collect();
                for (got, f) in
                    [(extreme_rows::<true>(&rows, n), nan_max as fn(f32, f32) -> f32), (extreme_rows::<false>(&rows, n), nan_min)]
                {
                    let want = row[1..].iter().fold(row[0], |a, &x| f(a, x));
                    assert_eq!(got.len(), 2);
                    assert!(got.iter().all(|g| g.to_bits() == want.to_bits()), "{row:?}: {got:?}, in order {want:?}");
                }
            }
        }
    }
}
