//! Values other invocations read: their publication to the workgroup's region of the workspace,
//! the barriers between publications, stores and reads, and scalars computed by one invocation
//! and shared with `workgroupUniformLoad` so that they are uniform.

use tessel_plugin_api::ir::*;

use super::{Read, Writer};
use crate::conv::{from_word, reg_ty, to_word};

impl<'k> Writer<'k> {
    pub(super) fn storage_barrier(&mut self) {
        self.line("storageBarrier();");
        self.pending_publish = false;
        self.pending_store = false;
        self.pending_ref_load = false;
    }

    /// At the top of a loop iteration: the previous iteration's reads and stores are done.
    pub(super) fn loop_barrier(&mut self) {
        if self.plan.shares || self.plan.stores {
            self.storage_barrier();
        }
    }

    pub(super) fn flags(&self) -> (bool, bool, bool) {
        (self.pending_publish, self.pending_store, self.pending_ref_load)
    }

    pub(super) fn set_flags(&mut self, f: (bool, bool, bool)) {
        (self.pending_publish, self.pending_store, self.pending_ref_load) = f;
    }

    pub(super) fn merge_flags(&mut self, f: (bool, bool, bool)) {
        self.pending_publish |= f.0;
        self.pending_store |= f.1;
        self.pending_ref_load |= f.2;
    }

    /// Before reading published values: a barrier if one was published since the last.
    pub(super) fn sync_reads(&mut self, reads: &[&Read]) {
        if self.pending_publish && reads.iter().any(|r| matches!(r, Read::Shared { .. })) {
            self.storage_barrier();
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
        self.pending_publish = true;
    }

    /// A scalar computed by invocation 0 and shared with the workgroup, so that it is uniform.
    pub(super) fn broadcast_scalar(&mut self, dst: &str, d: DType, compute: impl FnOnce(&mut Self) -> String) {
        self.uses_broadcast = true;
        if self.pending_publish || self.pending_store {
            self.storage_barrier();
        } else {
            self.line("workgroupBarrier();");
        }
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
    /// ([`Plan::publish`](crate::lower::Plan::publish)), and a barrier separates their publication
    /// from the reads. Returns their word offsets.
    pub(super) fn read_published(&mut self, srcs: &[&str]) -> Vec<u64> {
        let reads: Vec<Read> =
            srcs.iter().map(|s| Read::Shared { name: s.to_string(), shape: Vec::new(), linear: false }).collect();
        self.sync_reads(&reads.iter().collect::<Vec<_>>());
        srcs.iter().map(|s| self.plan.published_word(s).unwrap_or_else(|| panic!("the plan publishes %{s}"))).collect()
    }

    /// A block (or scalar) result whose elements read other elements of `srcs`: the sources are
    /// published; `f` gets their word offsets and writes the element expression for `e`.
    pub(super) fn gather(&mut self, dst: &str, srcs: &[&str], f: impl Fn(&mut Self, &[u64]) -> String) {
        let offs = self.read_published(srcs);
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
