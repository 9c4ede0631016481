//! The operations that move elements without computing: `broadcast`, `reshape`, `transpose`.

use super::layout::{expand, strides};
use super::value::{Data, Val};

pub(crate) fn broadcast_to(a: &Val, shape: &[usize]) -> Val {
    let data = match &a.data {
        Data::F(v) => Data::F(expand(v, &a.shape, shape).into_owned()),
        Data::I(v) => Data::I(expand(v, &a.shape, shape).into_owned()),
        Data::U(v) => Data::U(expand(v, &a.shape, shape).into_owned()),
        Data::B(v) => Data::B(expand(v, &a.shape, shape).into_owned()),
    };
    a.with(shape.to_vec(), data)
}

pub(crate) fn reshape(a: &Val, shape: &[usize]) -> Val {
    a.with(shape.to_vec(), a.data.clone())
}

fn permute<T: Copy>(v: &[T], shape: &[usize], perm: &[usize]) -> Vec<T> {
    let st = strides(shape);
    let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let out_st: Vec<usize> = perm.iter().map(|&p| st[p]).collect();
    let n = v.len();
    let mut res = Vec::with_capacity(n);
    let mut idx = vec![0usize; shape.len()];
    let mut off = 0;
    for _ in 0..n {
        res.push(v[off]);
        for d in (0..out_shape.len()).rev() {
            idx[d] += 1;
            off += out_st[d];
            if idx[d] < out_shape[d] {
                break;
            }
            off -= out_st[d] * idx[d];
            idx[d] = 0;
        }
    }
    res
}

pub(crate) fn transpose(a: &Val, perm: &[usize]) -> Val {
    let shape: Vec<usize> = perm.iter().map(|&p| a.shape[p]).collect();
    let data = match &a.data {
        Data::F(v) => Data::F(permute(v, &a.shape, perm)),
        Data::I(v) => Data::I(permute(v, &a.shape, perm)),
        Data::U(v) => Data::U(permute(v, &a.shape, perm)),
        Data::B(v) => Data::B(permute(v, &a.shape, perm)),
    };
    a.with(shape, data)
}
