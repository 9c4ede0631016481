//! Where a block's elements lie: row-major strides, and numpy broadcasting of shapes and of
//! element slices.

use std::borrow::Cow;

/// Row-major strides of `shape`.
pub(crate) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// numpy broadcasting of two shapes (the verifier has checked they agree).
pub(crate) fn broadcast_shape(a: &[usize], b: &[usize]) -> Vec<usize> {
    let n = a.len().max(b.len());
    (0..n)
        .map(|i| {
            let da = if i + a.len() >= n { a[i + a.len() - n] } else { 1 };
            let db = if i + b.len() >= n { b[i + b.len() - n] } else { 1 };
            da.max(db)
        })
        .collect()
}

/// `data` of `shape` stretched to `out` (numpy broadcasting); borrowed when nothing stretches.
pub(crate) fn expand<'a, T: Copy>(data: &'a [T], shape: &[usize], out: &[usize]) -> Cow<'a, [T]> {
    if shape == out {
        return Cow::Borrowed(data);
    }
    let n: usize = out.iter().product();
    if data.len() == 1 {
        return Cow::Owned(vec![data[0]; n]);
    }
    let lead = out.len() - shape.len();
    let src = strides(shape);
    // Stride in `data` of each output dimension (0 where it stretches).
    let st: Vec<usize> = (0..out.len()).map(|d| if d < lead || shape[d - lead] == 1 { 0 } else { src[d - lead] }).collect();
    // Whole rows at a time: the innermost dimension is either copied or filled.
    let last = out.len() - 1;
    let row = out[last];
    let mut res = Vec::with_capacity(n);
    let mut idx = vec![0usize; last];
    let mut off = 0usize;
    for _ in 0..n / row {
        if st[last] == 0 {
            res.resize(res.len() + row, data[off]);
        } else {
            res.extend_from_slice(&data[off..off + row]);
        }
        for d in (0..last).rev() {
            idx[d] += 1;
            off += st[d];
            if idx[d] < out[d] {
                break;
            }
            off -= st[d] * idx[d];
            idx[d] = 0;
        }
    }
    Cow::Owned(res)
}
