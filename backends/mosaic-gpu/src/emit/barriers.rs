//! The concurrent model's barriers on the general path (docs/language.md §10): each barrier of
//! the kernel is an mbarrier in shared memory, made by thread 0 of the CTA at entry with the
//! kernel's arrival count. The thread axis's points are the CTA's warpgroups, running at once.
//!
//! - `arrive B[k]` is one arrival of the warpgroup: its threads meet (so that everything each
//!   did before is done), then its thread 0 arrives, with the release semantics of
//!   `mbarrier.arrive` — a copy that lands as an arrival is its load and store, then this.
//! - `wait B[k]`: every thread of the warpgroup waits, with acquire semantics, for the phase
//!   after the last it waited for on that barrier. The language counts a thread's waits per
//!   barrier (its n-th wait returns once n phases have completed); an mbarrier tells phases
//!   apart by parity, so each CUDA thread keeps, per barrier array, one register of parity bits,
//!   flipped at each wait (the warpgroup's threads wait alike, so they agree). A wait that a
//!   later phase could pass is the interpreter's "missed phase" error, found before lowering.

use tessel_plugin_api::ir::BarrierAt;

use super::header::SHARED;
use super::writer::{Mbarriers, Writer};

impl Writer<'_> {
    /// Thread 0 of the CTA (`tid_x` 0) makes every mbarrier, then the CTA meets, so that no
    /// thread arrives at or waits on one before it exists.
    pub(super) fn init_mbarriers(&mut self, tid_x: &str) {
        let plan = self.plan;
        let decls = &plan.kernel.kernel().barriers;
        self.comment(&format!("the kernel's barriers: {} bytes of mbarriers after the workspace", plan.barrier_bytes));
        let base = self.rd();
        self.insf(format_args!("mov.u64 {base}, {SHARED}"));
        self.insf(format_args!("add.u64 {base}, {base}, {}", plan.barrier_offset()));
        let (leader, skip) = (self.p(), self.label("made"));
        self.insf(format_args!("setp.ne.u32 {leader}, {tid_x}, 0"));
        let mut offset = 0;
        let mut arrays = Vec::new();
        for d in decls {
            let (first, parity) = (self.rd(), self.r());
            self.insf(format_args!("add.u64 {first}, {base}, {offset}"));
            self.insf(format_args!("mov.b32 {parity}, 0"));
            offset += 8 * d.count as u64;
            arrays.push(Mbarriers { name: d.name.clone(), first, parity });
        }
        self.insf(format_args!("@{leader} bra {skip}"));
        for (d, m) in decls.iter().zip(&arrays) {
            for i in 0..d.count {
                let at = self.rd();
                self.insf(format_args!("add.u64 {at}, {}, {}", m.first, 8 * i));
                self.insf(format_args!("mbarrier.init.shared::cta.b64 [{at}], {}", d.arrivals));
            }
        }
        self.place_label(&skip);
        self.ins("bar.sync 0");
        self.mbarriers = arrays;
    }

    /// The address of barrier `b` and the register of its array's parity bits, and `b`'s index.
    pub(super) fn mbarrier(&mut self, b: &BarrierAt) -> (String, String, String) {
        let k = self.scalar(&b.index);
        let m = self.mbarriers.iter().find(|m| m.name == b.name).expect("verified barrier");
        let (first, parity) = (m.first.clone(), m.parity.clone());
        let (off, addr) = (self.rd(), self.rd());
        self.insf(format_args!("mul.wide.u32 {off}, {k}, 8"));
        self.insf(format_args!("add.u64 {addr}, {first}, {off}"));
        (addr, parity, k)
    }

    /// `arrive B[k]`: the warpgroup meets, then its thread 0 arrives.
    pub(super) fn write_arrive(&mut self, b: &BarrierAt) {
        let (addr, _, _) = self.mbarrier(b);
        self.meet_in_op();
        let (others, skip, state) = (self.p(), self.label("arrived"), self.rd());
        let tid = self.tid.clone();
        self.insf(format_args!("setp.ne.u32 {others}, {tid}, 0"));
        self.insf(format_args!("@{others} bra {skip}"));
        self.insf(format_args!("mbarrier.arrive.shared::cta.b64 {state}, [{addr}]"));
        self.place_label(&skip);
    }

    /// `wait B[k]`: each thread waits for the phase its parity bit names, then flips the bit.
    pub(super) fn write_wait(&mut self, b: &BarrierAt) {
        let (addr, parity, k) = self.mbarrier(b);
        let (bit, mask, one) = (self.r(), self.r(), self.imm(1));
        self.insf(format_args!("shr.u32 {bit}, {parity}, {k}"));
        self.insf(format_args!("and.b32 {bit}, {bit}, 1"));
        let (top, ready) = (self.label("wait"), self.p());
        self.place_label(&top);
        self.insf(format_args!("mbarrier.try_wait.parity.shared::cta.b64 {ready}, [{addr}], {bit}"));
        self.insf(format_args!("@!{ready} bra {top}"));
        self.insf(format_args!("shl.b32 {mask}, {one}, {k}"));
        self.insf(format_args!("xor.b32 {parity}, {parity}, {mask}"));
    }
}
