//! How an operation reads each of its operands (`Read`): a literal, a scalar register, the
//! invocation's own element, a row's broadcast value, a value computed where it is read, a block
//! read from its buffer where it is used, or an element another invocation owns, from the
//! workspace.

use std::collections::BTreeSet;

use tessel_plugin_api::ir::*;

use super::layout::broadcast_index;
use super::{Read, Writer};
use crate::conv::{from_word, literal};

impl<'k> Writer<'k> {
    /// How an operand is read for a result of shape `res`; `linear` for `reshape`.
    pub(super) fn classify(&mut self, o: &Operand, res: &[usize], linear: bool) -> Read {
        match o {
            Operand::Lit(l) => Read::Lit(*l),
            Operand::Value(name) => {
                let shape = self.ty(name).shape.clone();
                let id = self.ident(name);
                if shape.is_empty() {
                    Read::Scalar(id)
                } else if self.plan.crosses(&shape, res, linear) {
                    assert!(self.plan.publish.contains(self.plan.id(name)), "the plan publishes %{name}, which another invocation reads");
                    Read::Shared { name: name.clone(), shape, linear }
                } else if self.plan.row_forwarded.contains_key(self.plan.id(name)) && shape == res {
                    Read::Row(name.clone())
                } else if self.deferred.contains_key(name) && shape == res {
                    Read::Deferred(name.clone())
                } else if shape == res || linear {
                    Read::Own(id)
                } else {
                    Read::RowOwn(id, self.plan.row_len().expect("the row layout's broadcast"))
                }
            }
        }
    }

    /// The expression reading `r` (as `dtype` for literals) for result element `e` of `res`.
    pub(super) fn read(&mut self, r: &Read, dtype: DType, res: &[usize]) -> String {
        match r {
            Read::Lit(l) => literal(*l, dtype),
            Read::Scalar(id) => id.clone(),
            Read::Own(id) => self.at(id, res),
            Read::RowOwn(id, c) => {
                let row = self.row_of_slot(res, *c);
                format!("{id}[{row}]")
            }
            Read::Row(name) => match self.quad_lane {
                Some(t) if self.hoisted.contains(name) => format!("{}_q.{}", self.ident(name), ["x", "y", "z", "w"][t]),
                // Slot `k` on its own: its element of the `vec4` of its quad.
                _ => format!("{}[k % 4u]", self.row_quad(self.plan.row_forwarded[self.plan.id(name)], "(k / 4u)")),
            },
            Read::Deferred(name) => {
                let d = self.deferred[name].clone();
                let xs: Vec<String> = d.reads.iter().zip(&d.tys).map(|(r, &t)| self.read(r, t, res)).collect();
                let v = (d.f)(self, &xs);
                let x = self.t();
                self.line(format!("let {x} = {v};"));
                x
            }
            Read::Shared { name, shape, linear } => {
                let idx = if *linear { "e".to_string() } else { broadcast_index(res, shape) };
                let off = self.plan.published_at(name);
                let d = self.ty(name).dtype;
                from_word(d, &format!("tk_ws[wsb + {off}u + {idx}]"))
            }
        }
    }

    pub(super) fn dtype_of(&self, ops: &[&Operand]) -> DType {
        ops.iter()
            .find_map(|o| match o {
                Operand::Value(v) => Some(self.ty(v).dtype),
                Operand::Lit(_) => None,
            })
            .unwrap_or(DType::I32)
    }

    /// The row-forwarded blocks that `reads` read, through values computed where they are read.
    pub(super) fn rows_read(&self, reads: &[Read]) -> Vec<String> {
        let mut out = BTreeSet::new();
        let mut todo: Vec<&Read> = reads.iter().collect();
        while let Some(r) = todo.pop() {
            match r {
                Read::Row(name) => {
                    out.insert(name.clone());
                }
                Read::Deferred(name) => todo.extend(self.deferred[name].reads.iter()),
                _ => {}
            }
        }
        out.into_iter().collect()
    }
}
