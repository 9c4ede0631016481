//! `reduce`: each output element is one thread's, which accumulates along the axis in the
//! interpreter's order (16-bit floats in `f32`, rounded once).

use tessel_plugin_api::ir::{Operand, ReduceOp};

use super::conv::combining;
use super::writer::Writer;

impl Writer<'_> {
    pub(super) fn write_reduce(&mut self, op: ReduceOp, arg: &Operand, axis: usize, dst: &str, n: usize) {
        let Operand::Value(src) = arg else { unreachable!("verifier: reduce of a value") };
        let shape = self.shape_of(src);
        let d = self.plan.kernel.value_type(src).dtype;
        let len = shape[axis];
        let inner: usize = shape[axis + 1..].iter().product();
        let (src, dst) = (src.to_string(), dst.to_string());
        self.each(n, |w, e| {
            // Output element e = (outer, in): inputs at outer*len*inner + r*inner + in, r ascending.
            let (outer, inn, base) = (w.r(), w.r(), w.r());
            w.insf(format_args!("div.u32 {outer}, {e}, {inner}"));
            w.insf(format_args!("rem.u32 {inn}, {e}, {inner}"));
            w.insf(format_args!("mad.lo.u32 {base}, {outer}, {}, {inn}", len * inner));
            let acc = w.load_slot(&src, &base);
            let r = w.imm(1);
            let (top, end) = (w.label("red"), w.label("endred"));
            w.place_label(&top);
            let done = w.p();
            w.insf(format_args!("setp.ge.u32 {done}, {r}, {len}"));
            w.insf(format_args!("@{done} bra {end}"));
            let idx = w.r();
            w.insf(format_args!("mad.lo.u32 {idx}, {r}, {inner}, {base}"));
            let x = w.load_slot(&src, &idx);
            let bop = combining(op);
            // 16-bit floats accumulate in f32 and round once, as the interpreter does.
            let v = w.binary32(bop, d, &acc, &x);
            w.insf(format_args!("mov.b32 {acc}, {v}"));
            w.insf(format_args!("add.u32 {r}, {r}, 1"));
            w.insf(format_args!("bra {top}"));
            w.place_label(&end);
            w.narrow(d, &acc);
            w.store_slot(&dst, e, &acc);
        });
    }
}
