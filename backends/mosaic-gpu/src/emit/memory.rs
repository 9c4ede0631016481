//! The workspace and the arrays: a value's or a scratch buffer's slot (in the workspace, shared
//! or global, or in registers), operands read with numpy broadcasting, and `load`/`store` of an
//! argument's block with bounds and masks checked lane by lane. Arrays and scratch hold 16-bit
//! floats as 2 bytes an element; a value's slot holds every element as the 4 bytes of an `f32`.

use tessel_plugin_api::ir::{DType, Index, Literal, Operand};

use super::conv::{element_bytes, half_ty, lit_bits, load_ty, store_ty, strides};
use super::writer::Writer;

/// What [`Writer::write_access`] does at each element of a region.
#[derive(Clone, Copy)]
pub(super) enum Access<'a> {
    Load { dst: &'a str, other: Option<Literal> },
    Store { value: &'a Operand },
}

impl Writer<'_> {
    /// Array bits (a 16-bit float in the low half) to the workspace's `f32`, in place.
    fn widen16(&mut self, d: DType, v: &str) {
        if matches!(d, DType::F16 | DType::BF16) {
            let h = self.h();
            self.insf(format_args!("cvt.u16.u32 {h}, {v}"));
            self.insf(format_args!("cvt.f32.{} {v}, {h}", half_ty(d)));
        }
    }

    /// The workspace's `f32` to array bits of a 16-bit float, in place.
    fn narrow16(&mut self, d: DType, v: &str) {
        if matches!(d, DType::F16 | DType::BF16) {
            let h = self.h();
            self.insf(format_args!("cvt.rn.{}.f32 {h}, {v}", half_ty(d)));
            self.insf(format_args!("cvt.u32.u16 {v}, {h}"));
        }
    }

    pub(super) fn slot_addr(&mut self, name: &str, index: &str) -> String {
        // Values live in this warpgroup's copy; scratch in the region the CTA shares.
        let (slot, region) = match self.plan.value_slot(name) {
            Some(s) => (s, self.values.clone()),
            None => panic!("no value slot for {name} (scratch is read by load and store only)"),
        };
        let offset = slot.offset;
        let (base, wide) = (self.rd(), self.rd());
        let ws = region;
        self.insf(format_args!("add.u64 {base}, {ws}, {offset}"));
        self.insf(format_args!("mul.wide.u32 {wide}, {index}, 4"));
        self.insf(format_args!("add.u64 {base}, {base}, {wide}"));
        base
    }

    /// The state space of the workspace: `shared` or `global`.
    pub(super) fn space(&self) -> &'static str {
        if self.plan.shared { "shared" } else { "global" }
    }

    /// Whether `name` is a value held in registers.
    pub(super) fn in_regs(&self, name: &str) -> bool {
        self.plan.kernel.values().get(name).is_some_and(|id| self.in_registers.contains_key(id))
    }

    /// Register `j` of a value in registers, where `index` is the unrolled loop's own element.
    fn register_of(&self, name: &str, index: &str) -> Option<String> {
        let regs = self.in_registers.get(self.plan.kernel.values().get(name)?)?;
        let (e, j) = self.element.as_ref().expect("values in registers are touched in unrolled loops");
        assert_eq!(index, e, "a value in registers is read only at the thread's own element");
        Some(regs[*j].clone())
    }

    pub(super) fn load_slot(&mut self, name: &str, index: &str) -> String {
        if let Some(reg) = self.register_of(name, index) {
            // A copy: callers may change what they load in place.
            let v = self.r();
            self.insf(format_args!("mov.b32 {v}, {reg}"));
            return v;
        }
        let addr = self.slot_addr(name, index);
        let v = self.r();
        self.insf(format_args!("ld.{}.b32 {v}, [{addr}]", self.space()));
        v
    }

    pub(super) fn store_slot(&mut self, name: &str, index: &str, v: &str) {
        if let Some(reg) = self.register_of(name, index) {
            self.insf(format_args!("mov.b32 {reg}, {v}"));
            return;
        }
        let addr = self.slot_addr(name, index);
        self.insf(format_args!("st.{}.b32 [{addr}], {v}", self.space()));
    }

    /// The flat index into a value of shape `from` that numpy broadcasting reads for element `e`
    /// of a result of shape `to`.
    fn broadcast_index(&mut self, e: &str, to: &[usize], from: &[usize]) -> String {
        if from == to {
            return e.to_string();
        }
        let lead = to.len() - from.len();
        let (ts, fs) = (strides(to), strides(from));
        let acc = self.imm(0);
        for d in lead..to.len() {
            if from[d - lead] == 1 {
                continue;
            }
            let t = self.r();
            self.insf(format_args!("div.u32 {t}, {e}, {}", ts[d]));
            self.insf(format_args!("rem.u32 {t}, {t}, {}", to[d]));
            self.insf(format_args!("mad.lo.u32 {acc}, {t}, {}, {acc}", fs[d - lead]));
        }
        acc
    }

    pub(super) fn shape_of(&self, name: &str) -> Vec<usize> {
        self.plan.value_slot(name).map(|s| s.shape.clone()).unwrap_or_else(|| self.plan.kernel.value_type(name).shape.clone())
    }

    /// An operand's element for result element `e` of shape `to` (literals as `dtype`).
    pub(super) fn operand(&mut self, o: &Operand, dtype: DType, e: &str, to: &[usize]) -> String {
        match o {
            Operand::Lit(l) => self.imm(lit_bits(*l, dtype)),
            Operand::Value(v) => {
                let from = self.shape_of(v);
                let i = self.broadcast_index(e, to, &from);
                self.load_slot(v, &i)
            }
        }
    }

    /// A scalar operand read by every thread (indices, bounds, conditions).
    pub(super) fn scalar(&mut self, o: &Operand) -> String {
        match o {
            Operand::Lit(l) => self.imm(lit_bits(*l, DType::I32)),
            Operand::Value(v) => {
                let zero = self.imm(0);
                self.load_slot(v, &zero)
            }
        }
    }

    pub(super) fn dtype_of(&self, ops: &[&Operand]) -> DType {
        ops.iter()
            .find_map(|o| match o {
                Operand::Value(v) => Some(self.plan.kernel.value_type(v).dtype),
                Operand::Lit(_) => None,
            })
            .expect("verifier: one operand is a value")
    }

    pub(super) fn write_access(&mut self, name: &str, index: Option<&[Index]>, mask: Option<&str>, access: Access<'_>) {
        let k = self.plan.kernel.kernel();
        let p = k.param(name).expect("verified argument").clone();
        let block = p.block_shape().to_vec();
        let dims = p.ty.shape.clone();
        let origin = self.origin_of(name);
        // Region: a start register and a length per array dimension; which dimensions stay.
        let mut starts = Vec::new();
        let mut lens = Vec::new();
        let mut strides_of = Vec::new();
        let mut shape = Vec::new();
        // Per dimension, the index vector it is gathered by (each element's start is its entry's).
        let mut gathered: Vec<Option<String>> = Vec::new();
        for d in 0..block.len() {
            gathered.push(match index.map(|ix| &ix[d]) {
                Some(Index::Gather { index: Operand::Value(v), .. }) => Some(v.clone()),
                _ => None,
            });
            let (s, len, keep) = match index.map(|ix| &ix[d]) {
                None | Some(Index::Full) => (None, block[d], true),
                Some(Index::Slice { start, size, .. }) => (Some(self.scalar(start)), *size, true),
                Some(Index::At(at)) => (Some(self.scalar(at)), 1, false),
                Some(Index::Gather { len, .. }) => (None, *len, true),
            };
            strides_of.push(match index.map(|ix| &ix[d]) {
                Some(Index::Slice { stride, .. }) => *stride,
                _ => 1,
            });
            let st = match s {
                Some(s) => {
                    let r = self.r();
                    self.insf(format_args!("add.s32 {r}, {}, {s}", origin[d]));
                    r
                }
                None => origin[d].clone(),
            };
            starts.push(st);
            lens.push(len);
            if keep {
                shape.push(len);
            }
        }
        let n: usize = lens.iter().product();
        // A swizzled operand buffer (`crate::async_mma`): its tiles' elements where `wgmma` reads them.
        let span = self.plan.mma.span(name);
        let (base, space) = match self.args.iter().find(|(a, _)| a == name) {
            Some((_, r)) => (r.clone(), "global"),
            None => {
                let slot = self.plan.scratch[name].offset;
                let r = self.rd();
                let base = self.scratch.clone();
                self.insf(format_args!("add.u64 {r}, {base}, {slot}"));
                (r, if self.plan.scratch_shared() { "shared" } else { "global" })
            }
        };
        let dtype = p.ty.dtype;
        // Arrays and scratch hold 16-bit floats and narrow integers at their width (as numpy
        // and TMA have them).
        let (bytes, load, store) = (element_bytes(dtype), load_ty(dtype), store_ty(dtype));
        let mask_shape = mask.map(|m| self.shape_of(m));
        self.each(n, |w, e| {
            let ok = w.p();
            w.insf(format_args!("setp.eq.u32 {ok}, {e}, {e}"));
            let flat = w.imm(0);
            let (ls, as_) = (strides(&lens), strides(&dims));
            for d in 0..lens.len() {
                let g = w.r();
                w.insf(format_args!("div.u32 {g}, {e}, {}", ls[d]));
                w.insf(format_args!("rem.u32 {g}, {g}, {}", lens[d]));
                if strides_of[d] > 1 {
                    w.insf(format_args!("mul.lo.u32 {g}, {g}, {}", strides_of[d]));
                }
                if let Some(v) = &gathered[d] {
                    // A gather: the entry's index (from the block origin) instead of the position.
                    let at = w.load_slot(v, &g);
                    w.insf(format_args!("mov.b32 {g}, {at}"));
                }
                w.insf(format_args!("add.s32 {g}, {g}, {}", starts[d]));
                let inside = w.p();
                w.insf(format_args!("setp.lt.u32 {inside}, {g}, {}", dims[d]));
                w.insf(format_args!("and.pred {ok}, {ok}, {inside}"));
                w.insf(format_args!("mad.lo.u32 {flat}, {g}, {}, {flat}", as_[d]));
            }
            if let (Some(m), Some(ms)) = (mask, &mask_shape) {
                let i = w.broadcast_index(e, &shape, ms);
                let mv = w.load_slot(m, &i);
                let on = w.p();
                w.insf(format_args!("setp.ne.u32 {on}, {mv}, 0"));
                w.insf(format_args!("and.pred {ok}, {ok}, {on}"));
            }
            let (wide, addr) = (w.rd(), w.rd());
            if span == 0 {
                w.insf(format_args!("mul.wide.u32 {wide}, {flat}, {bytes}"));
            } else {
                let at = w.swizzled_offset(&flat, [dims[dims.len() - 2], dims[dims.len() - 1]], bytes, span);
                w.insf(format_args!("cvt.u64.u32 {wide}, {at}"));
            }
            w.insf(format_args!("add.u64 {addr}, {base}, {wide}"));
            match access {
                Access::Load { dst, other } => {
                    let (raw, v) = (w.imm(0), w.imm(lit_bits(other.unwrap_or(Literal::Int(0)), dtype)));
                    w.insf(format_args!("@{ok} ld.{space}.{load} {raw}, [{addr}]"));
                    w.widen16(dtype, &raw);
                    w.insf(format_args!("selp.b32 {v}, {raw}, {v}, {ok}"));
                    w.store_slot(dst, e, &v);
                }
                Access::Store { value } => {
                    let v = w.operand(value, dtype, e, &shape);
                    let bits = w.r();
                    w.insf(format_args!("mov.b32 {bits}, {v}"));
                    w.narrow16(dtype, &bits);
                    w.insf(format_args!("@{ok} st.{space}.{store} [{addr}], {bits}"));
                }
            }
        });
    }

    /// The byte offset in a swizzled buffer (`crate::async_mma`) of its element `flat`: its tile
    /// of `[rows, cols]`, in slabs of `span` bytes a row, `rows` rows each, the row's 16-byte
    /// chunks XORed with its row in the atom (bits 4.. with bits 7.., as the hardware swizzles
    /// shared addresses; buffers start 1024-byte aligned, so offsets swizzle as addresses do).
    fn swizzled_offset(&mut self, flat: &str, [rows, cols]: [usize; 2], bytes: usize, span: u32) -> String {
        let slab = span as usize / bytes;
        let (tile, r, c, off, x) = (self.r(), self.r(), self.r(), self.r(), self.r());
        self.insf(format_args!("div.u32 {tile}, {flat}, {}", rows * cols));
        self.insf(format_args!("div.u32 {r}, {flat}, {cols}"));
        self.insf(format_args!("rem.u32 {r}, {r}, {rows}"));
        self.insf(format_args!("rem.u32 {c}, {flat}, {cols}"));
        self.insf(format_args!("mul.lo.u32 {off}, {tile}, {}", rows * cols * bytes));
        self.insf(format_args!("mad.lo.u32 {off}, {r}, {span}, {off}"));
        self.insf(format_args!("div.u32 {x}, {c}, {slab}"));
        self.insf(format_args!("mad.lo.u32 {off}, {x}, {}, {off}", rows * span as usize));
        self.insf(format_args!("rem.u32 {x}, {c}, {slab}"));
        self.insf(format_args!("mad.lo.u32 {off}, {x}, {bytes}, {off}"));
        self.insf(format_args!("shr.u32 {x}, {off}, 7"));
        self.insf(format_args!("and.b32 {x}, {x}, {}", span / 16 - 1));
        self.insf(format_args!("shl.b32 {x}, {x}, 4"));
        self.insf(format_args!("xor.b32 {off}, {off}, {x}"));
        off
    }
}
