//! The concurrent model's copies by TMA on the general path (`crate::tma` says which): into
//! scratch, counted on a barrier's mbarrier; out of scratch to an `out` array, in thread 0's bulk
//! group, which `commit_copies` closes and `wait_copies` waits for.

use tessel_plugin_api::ir::BarrierAt;

use crate::tma::TmaCopy;

use super::writer::Writer;

impl Writer<'_> {
    /// A copy by TMA into scratch: once the warpgroup's own accesses are done (its threads
    /// meet), its thread 0 orders them before the asynchronous proxy's, counts the copy's bytes
    /// as its arrival on the barrier and starts the tensor copy, which completes them.
    pub(super) fn write_tma_copy(&mut self, c: &TmaCopy<'_>, bar: &BarrierAt) {
        let (addr, _, _) = self.mbarrier(bar);
        let (map, coords, tile) = self.tensor_copy_operands(c);
        self.meet_in_op();
        let skip = self.unless_thread_zero("copied");
        let state = self.rd();
        self.ins("fence.proxy.async.shared::cta");
        self.insf(format_args!("mbarrier.arrive.expect_tx.shared::cta.b64 {state}, [{addr}], {}", c.bytes));
        for (at, at_box) in self.slab_boxes(c, &tile, &coords) {
            self.insf(format_args!(
                "cp.async.bulk.tensor.{}d.shared::cluster.global.mbarrier::complete_tx::bytes [{at}], [{map}, {{{at_box}}}], [{addr}]",
                c.boxes.len()
            ));
        }
        self.place_label(&skip);
    }

    /// A copy by TMA out of scratch: every thread orders its stores to the tile before the
    /// asynchronous proxy's reads, the warpgroup meets, and its thread 0 starts the tensor copy
    /// in its bulk group.
    pub(super) fn write_tma_store(&mut self, c: &TmaCopy<'_>) {
        let (map, coords, tile) = self.tensor_copy_operands(c);
        self.ins("fence.proxy.async.shared::cta");
        self.meet_in_op();
        let skip = self.unless_thread_zero("stored");
        for (at, at_box) in self.slab_boxes(c, &tile, &coords) {
            self.insf(format_args!(
                "cp.async.bulk.tensor.{}d.global.shared::cta.bulk_group [{map}, {{{at_box}}}], [{at}]",
                c.boxes.len()
            ));
        }
        self.place_label(&skip);
    }

    /// `commit_copies`: thread 0 closes its bulk group.
    pub(super) fn write_commit_copies(&mut self) {
        let skip = self.unless_thread_zero("committed");
        self.ins("cp.async.bulk.commit_group");
        self.place_label(&skip);
    }

    /// `wait_copies N (reads)`: thread 0 waits until at most `N` of its bulk groups are pending
    /// (have not read their tiles), then the warpgroup meets, so that none of its threads writes
    /// a tile still being copied.
    pub(super) fn write_wait_copies(&mut self, pending: usize, reads: bool) {
        let skip = self.unless_thread_zero("waited");
        let read = if reads { ".read" } else { "" };
        self.insf(format_args!("cp.async.bulk.wait_group{read} {pending}"));
        self.place_label(&skip);
        self.meet_in_op();
    }

    /// At the kernel's end, thread 0 waits for its copies out, so that the CTA's shared memory
    /// outlives their reads and the kernel its writes.
    pub(super) fn write_final_wait_copies(&mut self) {
        if self
            .plan
            .maps
            .iter()
            .any(|m| self.plan.kernel.kernel().param(&m.array).is_some_and(|p| p.kind == tessel_plugin_api::ir::ParamKind::Out))
        {
            let skip = self.unless_thread_zero("stores_done");
            self.ins("cp.async.bulk.wait_group 0");
            self.place_label(&skip);
        }
    }

    /// The tensor map's address, the box's coordinates and the scratch tile's shared address of
    /// a copy by TMA.
    fn tensor_copy_operands(&mut self, c: &TmaCopy<'_>) -> (String, Vec<String>, String) {
        let plan = self.plan;
        let n = (plan.maps.iter().position(|m| c.reads_through(m))).expect("the plan has a tensor map for each copy by TMA");
        let param = format!("{}_{}", plan.entry, plan.maps[n].param);
        let coords: Vec<String> = c.coords.iter().map(|o| self.scalar(o)).collect();
        let (tile, map) = (self.rd(), self.rd());
        let slot = plan.scratch[c.scratch].offset;
        let base = self.scratch.clone();
        self.insf(format_args!("add.u64 {tile}, {base}, {slot}"));
        for (at, stride) in &c.leading {
            let (k, step) = (self.scalar(at), self.rd());
            self.insf(format_args!("mul.wide.u32 {step}, {k}, {stride}"));
            self.insf(format_args!("add.u64 {tile}, {tile}, {step}"));
        }
        self.insf(format_args!("mov.b64 {map}, {param}"));
        self.insf(format_args!("cvta.param.u64 {map}, {map}"));
        (map, coords, tile)
    }

    /// The boxes of a copy: one, or one a slab of a swizzled buffer (`rows` rows of `span` bytes
    /// each, one after another): each box's shared address and coordinates.
    fn slab_boxes(&mut self, c: &TmaCopy<'_>, tile: &str, coords: &[String]) -> Vec<(String, String)> {
        let width = c.slab_box()[0];
        (0..c.slabs())
            .map(|slab| {
                let (at, column) = (self.rd(), self.r());
                self.insf(format_args!("add.u64 {at}, {tile}, {}", u64::from(slab) * c.rows() * u64::from(c.swizzle)));
                self.insf(format_args!("add.u32 {column}, {}, {}", coords[0], slab * width));
                (at, std::iter::once(column).chain(coords[1..].iter().cloned()).collect::<Vec<_>>().join(", "))
            })
            .collect()
    }

    /// Code from here to the returned label runs on the warpgroup's thread 0 only.
    fn unless_thread_zero(&mut self, what: &str) -> String {
        let (others, skip) = (self.p(), self.label(what));
        let tid = self.tid.clone();
        self.insf(format_args!("setp.ne.u32 {others}, {tid}, 0"));
        self.insf(format_args!("@{others} bra {skip}"));
        skip
    }
}
