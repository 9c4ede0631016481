//! The operations that move elements without computing: `broadcast`, `reshape`, `transpose`,
//! `concatenate`, `slice`.

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

/// The values one after another along `axis`: for each index of the dimensions before it, each
/// value's run of `shape[axis] * inner` elements in turn (row-major).
pub(crate) fn concatenate(args: &[&Val], axis: usize) -> Val {
    fn join<T: Copy>(parts: &[(&[T], usize)], outer: usize) -> Vec<T> {
        let mut out = Vec::with_capacity(parts.iter().map(|(v, _)| v.len()).sum());
        for o in 0..outer {
            for (v, run) in parts {
                out.extend_from_slice(&v[o * run..(o + 1) * run]);
            }
        }
        out
    }
    let first = args[0];
    let outer: usize = first.shape[..axis].iter().product();
    let inner: usize = first.shape[axis + 1..].iter().product();
    let run = |a: &Val| a.shape[axis] * inner;
    let mut shape = first.shape.clone();
    shape[axis] = args.iter().map(|a| a.shape[axis]).sum();
    macro_rules! each {
        ($variant:ident) => {{
            let parts: Vec<(&[_], usize)> = args
                .iter()
                .map(|a| match &a.data {
                    Data::$variant(v) => (&v[..], run(a)),
                    _ => unreachable!("verifier: concatenate of one element type"),
                })
                .collect();
            Data::$variant(join(&parts, outer))
        }};
    }
    let data = match &first.data {
        Data::F(_) => each!(F),
        Data::I(_) => each!(I),
        Data::U(_) => each!(U),
        Data::B(_) => each!(B),
    };
    first.with(shape, data)
}

/// The `shape` elements of `a` from `start` on, row-major.
pub(crate) fn slice(a: &Val, start: &[usize], stride: &[usize], shape: &[usize]) -> Val {
    fn take<T: Copy>(v: &[T], from: &[usize], start: &[usize], stride: &[usize], shape: &[usize]) -> Vec<T> {
        let st = strides(from);
        let n: usize = shape.iter().product();
        let mut out = Vec::with_capacity(n);
        let mut idx = vec![0usize; shape.len()];
        for _ in 0..n {
            let off: usize = (0..idx.len()).map(|d| (idx[d] * stride[d] + start[d]) * st[d]).sum();
            out.push(v[off]);
            for d in (0..shape.len()).rev() {
                idx[d] += 1;
                if idx[d] < shape[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        out
    }
    let data = match &a.data {
        Data::F(v) => Data::F(take(v, &a.shape, start, stride, shape)),
        Data::I(v) => Data::I(take(v, &a.shape, start, stride, shape)),
        Data::U(v) => Data::U(take(v, &a.shape, start, stride, shape)),
        Data::B(v) => Data::B(take(v, &a.shape, start, stride, shape)),
    };
    a.with(shape.to_vec(), data)
}
