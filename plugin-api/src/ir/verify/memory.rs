//! `load` and `store`: the argument named, the block an index list selects from it, the mask, and
//! the value or literal stored.

use super::{Arg, Checked, Checker, broadcast, literal_fits, shape_text, with_article};
use crate::ir::*;

impl Checker<'_> {
    pub(super) fn ref_param(&mut self, name: &str, span: Span) -> Option<&Param> {
        let k = self.k;
        match k.param(name) {
            Some(p) => Some(p),
            None => {
                let names: Vec<&str> = k.params.iter().map(|p| p.name.as_str()).collect();
                self.err(
                    span,
                    format!("unknown argument `{name}`"),
                    format!("expected an argument or scratch of this kernel: {}", names.join(", ")),
                );
                None
            }
        }
    }

    /// The shape an index list selects from a block, checking each index; an index that is an
    /// integer vector becomes a [`Index::Gather`].
    pub(super) fn indexed_shape(&mut self, p: &Param, index: Option<&mut [Index]>, span: Span) -> Checked<Vec<usize>> {
        let block = p.block_shape().to_vec();
        let Some(index) = index else { return Some(block) };
        if index.len() != block.len() {
            self.err(
                span,
                format!(
                    "`{}` is indexed with {} ind{}, but its block {} has rank {}",
                    p.name,
                    index.len(),
                    if index.len() == 1 { "ex" } else { "ices" },
                    shape_text(&block),
                    block.len()
                ),
                format!("expected {} indices, one per dimension (`:` for a whole one)", block.len()),
            );
            return None;
        }
        let mut shape = Vec::new();
        let mut gathers = 0;
        for (ix, &dim) in index.iter_mut().zip(&block) {
            if let Index::At(Operand::Value(v)) = ix
                && let Some(t) = self.lookup(v, span)
                && !t.is_scalar()
            {
                if t.shape.len() != 1 || !matches!(t.dtype, DType::I32 | DType::U32) {
                    self.err(
                        span,
                        format!("the index `%{v}` is {t}"),
                        "expected a scalar index, or a vector of `i32` or `u32` indices (a gather) such as i32[8]",
                    );
                    return None;
                }
                gathers += 1;
                *ix = Index::Gather { index: Operand::Value(v.clone()), len: t.shape[0] };
            }
            match ix {
                Index::Full => shape.push(dim),
                Index::Slice { start, size, stride } => {
                    self.scalar_int(start, span, "the start of `ds`", false);
                    if *size == 0 {
                        self.err(span, "`ds(..., 0)` selects nothing", "expected a positive slice size");
                    }
                    if *stride == 0 {
                        self.err(span, "`ds(START, SIZE, 0)` has a stride of 0", "expected a positive stride, as in `ds(%s, 8, 2)`");
                    }
                    shape.push(*size);
                }
                Index::At(v) => self.scalar_int(v, span, "an index", false),
                Index::Gather { len, .. } => shape.push(*len),
            }
        }
        if gathers > 1 {
            self.err(
                span,
                format!("`{}` is indexed with {gathers} index vectors", p.name),
                "expected at most one index vector (a gather along one dimension); gather the others with loads of their own",
            );
            return None;
        }
        Some(shape)
    }

    fn mask(&mut self, mask: Option<&str>, shape: &[usize], span: Span) {
        let Some(m) = mask else { return };
        let Some(t) = self.lookup(m, span) else { return };
        if t.dtype != DType::Bool || broadcast(&t.shape, shape).as_deref() != Some(shape) {
            self.err(
                span,
                format!("the mask `%{m}` is {t}"),
                format!("expected a bool mask that broadcasts to {}", shape_text(shape)),
            );
        }
    }

    pub(super) fn load(
        &mut self,
        src: &str,
        index: Option<&mut [Index]>,
        mask: Option<&str>,
        other: Option<Literal>,
        span: Span,
    ) -> Checked<Type> {
        let p = self.ref_param(src, span)?.clone();
        if p.ty.is_scalar() {
            if index.is_some() || mask.is_some() || other.is_some() {
                self.err(
                    span,
                    format!("`{src}` is a scalar argument"),
                    format!("expected `load {src}` with no index, mask or other"),
                );
            }
            return Some(p.ty.clone());
        }
        let shape = self.indexed_shape(&p, index, span)?;
        self.mask(mask, &shape, span);
        if let Some(l) = other
            && let Err(m) = literal_fits(l, p.ty.dtype)
        {
            self.err(span, format!("`other`: {m}"), format!("expected {} literal", with_article(p.ty.dtype)));
        }
        Some(Type::array(p.ty.dtype, shape))
    }

    pub(super) fn store(&mut self, dst: &str, index: Option<&mut [Index]>, value: &Operand, mask: Option<&str>, span: Span) {
        let Some(p) = self.ref_param(dst, span).cloned() else { return };
        if p.kind == ParamKind::In {
            self.err(span, format!("cannot store to input `{dst}`"), "expected an `out` or `scratch` argument");
            return;
        }
        let Some(shape) = self.indexed_shape(&p, index, span) else { return };
        self.mask(mask, &shape, span);
        match self.arg(value, span) {
            Some(Arg::Lit(l)) => {
                if let Err(m) = literal_fits(l, p.ty.dtype) {
                    self.err(span, m, format!("expected {} literal", with_article(p.ty.dtype)));
                }
            }
            Some(Arg::Val(t)) if t.dtype != p.ty.dtype || broadcast(&t.shape, &shape).as_deref() != Some(&shape[..]) => {
                self.err(
                    span,
                    format!("cannot store {t} into `{dst}`, whose selected block is {}", Type::array(p.ty.dtype, shape.clone())),
                    format!("expected {} value whose shape broadcasts to {}", with_article(p.ty.dtype), shape_text(&shape)),
                );
            }
            None | Some(Arg::Val(_)) => {}
        }
    }
}
