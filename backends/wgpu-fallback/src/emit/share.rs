//! Values other invocations read: their publication to the workgroup's region of the workspace,
//! the barriers the plan places between publications, stores and reads
//! ([`crate::lower::meetings`]), and scalars computed by one invocation and shared with
//! `workgroupUniformLoad` so that they are uniform.

use tessel_plugin_api::ir::*;

use super::Writer;
use crate::conv::{from_word, reg_ty, to_word};
use crate::lower::meetings::{Barrier, Site};

impl<'k> Writer<'k> {
    pub(super) fn storage_barrier(&mut self) {
        self.line("storageBarrier();");
    }

    /// The barrier the plan places at `site` of the statement being written, if any.
    pub(super) fn meet(&mut self, site: Site) {
        match self.plan.meetings.at(self.stmt, site) {
            Some(Barrier::Storage) => self.storage_barrier(),
            Some(Barrier::Workgroup) => self.line("workgroupBarrier();"),
            None => {}
        }
    }

    /// After a block value is made: publish it if another invocation reads it.
    pub(super) fn defined(&mut self, name: &str) {
        let ty = self.ty(name);
        if ty.is_scalar() || !self.plan.publish.contains(self.plan.id(name)) {
            return;
        }
        let off = self.plan.published_at(name);
        let id = self.ident(name);
        let word = to_word(ty.dtype, &self.at(&id, &ty.shape));
        self.each(&ty.shape, |w| w.line(format!("tk_ws[wsb + {off}u + e] = {word};")));
    }

    /// A scalar computed by invocation 0 and shared with the workgroup, so that it is uniform.
    pub(super) fn broadcast_scalar(&mut self, dst: &str, d: DType, compute: impl FnOnce(&mut Self) -> String) {
        self.uses_broadcast = true;
        assert!(self.plan.meetings.at(self.stmt, Site::Broadcast).is_some(), "the plan places a broadcast's barrier");
        self.meet(Site::Broadcast);
        self.open("if (lid == 0u)");
        self.line("let k = 0u;");
        self.line("let e = 0u;");
        let v = compute(self);
        self.line(format!("tk_bc = {};", to_word(d, &v)));
        self.close();
        let id = self.ident(dst);
        self.line(format!("let {id}: {} = {};", reg_ty(d), from_word(d, "workgroupUniformLoad(&tk_bc)")));
    }

    /// Values whose elements are read by other invocations: they are published
    /// ([`KernelPlan::publish`](crate::lower::KernelPlan::publish)), and a barrier the plan places at `site`
    /// separates their publication from the reads. Returns their word offsets.
    pub(super) fn read_published(&mut self, site: Site, srcs: &[&str]) -> Vec<u64> {
        self.meet(site);
        srcs.iter().map(|s| self.plan.published_word(s).unwrap_or_else(|| panic!("the plan publishes %{s}"))).collect()
    }

    /// A block (or scalar) result whose elements read other elements of `srcs`: the sources are
    /// published; `f` gets their word offsets and writes the element expression for `e`.
    pub(super) fn gather(&mut self, dst: &str, srcs: &[&str], f: impl Fn(&mut Self, &[u64]) -> String) {
        let offs = self.read_published(Site::Reads, srcs);
        let ty = self.ty(dst);
        if ty.is_scalar() {
            self.broadcast_scalar(dst, ty.dtype, |w| f(w, &offs));
            return;
        }
        let id = self.declare_block(dst);
        self.each_into(&ty.shape, &id, ty.dtype, |w| f(w, &offs));
        self.defined(dst);
    }
}
