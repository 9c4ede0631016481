//! A [`Plan`] to PTX text (`.version 8.0`, `.target sm_90a`). See `lower.rs` for the model.
//!
//! Registers are PTX virtual registers (`%r` 32-bit, `%rd` 64-bit, `%p` predicates) numbered in
//! emission order, as nvcc numbers its own; every 32-bit value uses a `.b32` register, which PTX
//! accepts for `.f32`, `.s32` and `.u32` instructions alike.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use tessel_plugin_api::ir::*;
use tessel_plugin_api::libm;

use crate::lower::{Plan, THREADS, Use, uses};

mod wgmma;

/// The dynamic shared memory of a CTA: its workspace when it fits.
const SHARED: &str = "tessel_smem";

/// The PTX module of one planned kernel.
pub fn emit(plan: &Plan) -> String {
    let mut w = Writer::new(plan);
    w.write_kernel();
    w.finish()
}

/// One instruction of an accurate maths function.
fn libm_ins(f: &libm::Func, dst: libm::Var, op: libm::Op, regs: &[String]) -> String {
    use libm::{Op, Ty};
    let t = f.types[dst.0];
    let d = &regs[dst.0];
    let r = |v: libm::Var| regs[v.0].as_str();
    let ty = |v: libm::Var| f.types[v.0];
    // Integer instruction suffixes by the operand's type.
    let int = |v: libm::Var| if ty(v) == Ty::I32 { "s32" } else { "u32" };
    match op {
        Op::Const(bits) if t == Ty::F32 => format!("mov.b32 {d}, {}", f32_imm(f32::from_bits(bits))),
        Op::Const(bits) => format!("mov.b32 {d}, {bits}"),
        Op::Copy(a) if t == Ty::Bool => format!("mov.pred {d}, {}", r(a)),
        Op::Copy(a) | Op::Bits(a) => format!("mov.b32 {d}, {}", r(a)),
        Op::Add(a, b) if t == Ty::F32 => format!("add.rn.f32 {d}, {}, {}", r(a), r(b)),
        Op::Sub(a, b) if t == Ty::F32 => format!("sub.rn.f32 {d}, {}, {}", r(a), r(b)),
        Op::Mul(a, b) if t == Ty::F32 => format!("mul.rn.f32 {d}, {}, {}", r(a), r(b)),
        Op::Add(a, b) => format!("add.u32 {d}, {}, {}", r(a), r(b)),
        Op::Sub(a, b) => format!("sub.u32 {d}, {}, {}", r(a), r(b)),
        Op::Mul(a, b) => format!("mul.lo.u32 {d}, {}, {}", r(a), r(b)),
        Op::Div(a, b) => format!("div.rn.f32 {d}, {}, {}", r(a), r(b)),
        Op::Fma(a, b, c) => format!("fma.rn.f32 {d}, {}, {}, {}", r(a), r(b), r(c)),
        Op::Neg(a) => format!("neg.f32 {d}, {}", r(a)),
        Op::Abs(a) => format!("abs.f32 {d}, {}", r(a)),
        Op::Rint(a) => format!("cvt.rni.f32.f32 {d}, {}", r(a)),
        Op::Trunc(a) => format!("cvt.rzi.f32.f32 {d}, {}", r(a)),
        Op::Lt(a, b) if ty(a) == Ty::F32 => format!("setp.lt.f32 {d}, {}, {}", r(a), r(b)),
        Op::Eq(a, b) if ty(a) == Ty::F32 => format!("setp.eq.f32 {d}, {}, {}", r(a), r(b)),
        Op::Lt(a, b) => format!("setp.lt.{} {d}, {}, {}", int(a), r(a), r(b)),
        Op::Eq(a, b) => format!("setp.eq.u32 {d}, {}, {}", r(a), r(b)),
        Op::Convert(a) if t == Ty::F32 => format!("cvt.rn.f32.{} {d}, {}", int(a), r(a)),
        Op::Convert(a) => format!("cvt.rzi.{}.f32 {d}, {}", int(dst), r(a)),
        Op::MulHi(a, b) => format!("mul.hi.u32 {d}, {}, {}", r(a), r(b)),
        Op::Shl(a, b) => format!("shl.b32 {d}, {}, {}", r(a), r(b)),
        Op::Shr(a, b) => format!("shr.{} {d}, {}, {}", int(a), r(a), r(b)),
        Op::And(a, b) if t == Ty::Bool => format!("and.pred {d}, {}, {}", r(a), r(b)),
        Op::Or(a, b) if t == Ty::Bool => format!("or.pred {d}, {}, {}", r(a), r(b)),
        Op::Xor(a, b) if t == Ty::Bool => format!("xor.pred {d}, {}, {}", r(a), r(b)),
        Op::And(a, b) => format!("and.b32 {d}, {}, {}", r(a), r(b)),
        Op::Or(a, b) => format!("or.b32 {d}, {}, {}", r(a), r(b)),
        Op::Xor(a, b) => format!("xor.b32 {d}, {}, {}", r(a), r(b)),
        Op::Rem(a, b) => format!("rem.u32 {d}, {}, {}", r(a), r(b)),
        Op::Clz(a) => format!("clz.b32 {d}, {}", r(a)),
        Op::Not(a) => format!("not.pred {d}, {}", r(a)),
        Op::Select(c, a, b) => format!("selp.b32 {d}, {}, {}, {}", r(a), r(b), r(c)),
    }
}

/// `0f3F800000`: a float immediate.
fn f32_imm(v: f32) -> String {
    format!("0f{:08X}", v.to_bits())
}

/// The bits of a literal as an element of `dtype` in the workspace (16-bit floats are held as
/// the `f32` of their value, as the interpreter holds them).
fn lit_bits(lit: Literal, dtype: DType) -> u32 {
    match dtype {
        DType::I32 => lit.as_i64() as i32 as u32,
        DType::U32 => lit.as_i64() as u32,
        DType::Bool => u32::from(lit.as_f64() != 0.0),
        DType::F16 => half::f16::from_f32(lit.as_f64() as f32).to_f32().to_bits(),
        DType::BF16 => half::bf16::from_f32(lit.as_f64() as f32).to_f32().to_bits(),
        DType::F32 => (lit.as_f64() as f32).to_bits(),
    }
}

/// Whether elements of `d` are 16-bit floats, which arrays hold as 2 bytes an element.
pub fn half_bits(d: DType) -> bool {
    d.bits() == 16
}

/// The PTX type name of a 16-bit float.
fn half_ty(d: DType) -> &'static str {
    if d == DType::BF16 { "bf16" } else { "f16" }
}

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// The width-suffix for comparisons and integer ops of a dtype.
fn int_ty(d: DType) -> &'static str {
    if d == DType::I32 { "s32" } else { "u32" }
}

struct Writer<'p> {
    plan: &'p Plan,
    out: String,
    regs: u32,
    regs64: u32,
    regs16: u32,
    preds: u32,
    labels: u32,
    /// The thread's index in its warpgroup (0..128).
    tid: String,
    /// The thread's warpgroup: the thread axis coordinate and its named barrier.
    warpgroup: String,
    /// The CTA's workspace region (scratch).
    workspace: String,
    /// This warpgroup's values.
    values: String,
    /// Pointer register of each `in`/`out` argument.
    args: Vec<(String, String)>,
    /// Coordinate register of each grid axis.
    coords: Vec<String>,
    /// Element origin registers of each argument's block.
    origins: Vec<(String, Vec<String>)>,
    /// What the warpgroup touched since its last barrier.
    hazards: Hazards,
    /// Values that live in registers: element `t + 128 j` of such a value is register `j` of
    /// thread `t` (see [`crate::lower::in_registers`]).
    in_registers: HashMap<String, Vec<String>>,
    /// Whether the next element loop touches a value in registers, so must be unrolled.
    unroll: bool,
    /// Inside an unrolled element loop: the element register and its `j`.
    element: Option<(String, usize)>,
}

/// The slots and arrays a warpgroup's threads wrote and read since their last barrier, by
/// whether each thread touched only its own elements (element `e` is thread `e % 128`'s in every
/// loop over a value) or other threads' too. A barrier is needed only where an access meets one
/// of another thread's: reading what another thread wrote, or writing what another thread read
/// or wrote. Elementwise chains, loads and stores of whole blocks need none between them.
#[derive(Clone, Default)]
struct Hazards {
    written_own: HashSet<String>,
    written_across: HashSet<String>,
    read_own: HashSet<String>,
    read_across: HashSet<String>,
}

impl Hazards {
    /// Whether an access would meet another thread's since the barrier.
    fn conflicts(&self, u: &Use, write: bool) -> bool {
        let n = &u.name;
        let written = self.written_across.contains(n) || (!u.own && self.written_own.contains(n));
        let read = write && (self.read_across.contains(n) || (!u.own && self.read_own.contains(n)));
        written || read
    }

    fn record(&mut self, u: &Use, write: bool) {
        let set = match (write, u.own) {
            (true, true) => &mut self.written_own,
            (true, false) => &mut self.written_across,
            (false, true) => &mut self.read_own,
            (false, false) => &mut self.read_across,
        };
        set.insert(u.name.clone());
    }

    /// What either of two paths may have left.
    fn union(&mut self, other: Hazards) {
        self.written_own.extend(other.written_own);
        self.written_across.extend(other.written_across);
        self.read_own.extend(other.read_own);
        self.read_across.extend(other.read_across);
    }
}

impl<'p> Writer<'p> {
    fn new(plan: &'p Plan) -> Writer<'p> {
        Writer {
            plan,
            out: String::new(),
            regs: 0,
            regs64: 0,
            regs16: 0,
            preds: 0,
            labels: 0,
            tid: String::new(),
            warpgroup: String::new(),
            workspace: String::new(),
            values: String::new(),
            args: Vec::new(),
            coords: Vec::new(),
            origins: Vec::new(),
            hazards: Hazards::default(),
            in_registers: HashMap::new(),
            unroll: false,
            element: None,
        }
    }

    fn r(&mut self) -> String {
        self.regs += 1;
        format!("%r{}", self.regs)
    }

    fn rd(&mut self) -> String {
        self.regs64 += 1;
        format!("%rd{}", self.regs64)
    }

    fn h(&mut self) -> String {
        self.regs16 += 1;
        format!("%h{}", self.regs16)
    }

    /// Rounds an `f32` held in `v` to the 16-bit float `d` (in place); no-op for other dtypes.
    fn round16(&mut self, d: DType, v: &str) {
        if matches!(d, DType::F16 | DType::BF16) {
            let (h, t) = (self.h(), half_ty(d));
            self.ins(format!("cvt.rn.{t}.f32 {h}, {v}"));
            self.ins(format!("cvt.f32.{t} {v}, {h}"));
        }
    }

    /// Array bits (a 16-bit float in the low half) to the workspace's `f32`, in place.
    fn widen16(&mut self, d: DType, v: &str) {
        if matches!(d, DType::F16 | DType::BF16) {
            let h = self.h();
            self.ins(format!("cvt.u16.u32 {h}, {v}"));
            self.ins(format!("cvt.f32.{} {v}, {h}", half_ty(d)));
        }
    }

    /// The workspace's `f32` to array bits of a 16-bit float, in place.
    fn narrow16(&mut self, d: DType, v: &str) {
        if matches!(d, DType::F16 | DType::BF16) {
            let h = self.h();
            self.ins(format!("cvt.rn.{}.f32 {h}, {v}", half_ty(d)));
            self.ins(format!("cvt.u32.u16 {v}, {h}"));
        }
    }

    fn p(&mut self) -> String {
        self.preds += 1;
        format!("%p{}", self.preds)
    }

    fn label(&mut self, what: &str) -> String {
        self.labels += 1;
        format!("$L_{what}_{}", self.labels)
    }

    fn ins(&mut self, s: impl AsRef<str>) {
        let _ = writeln!(self.out, "\t{};", s.as_ref());
    }

    fn place_label(&mut self, l: &str) {
        let _ = writeln!(self.out, "{l}:");
    }

    fn comment(&mut self, s: &str) {
        let _ = writeln!(self.out, "\t// {s}");
    }

    /// `v = f(args)`, the accurate maths function `f` (`tessel_plugin_api::libm`) written
    /// inline: a register per variable, branches for its `if` and `while`.
    fn maths(&mut self, v: &str, f: fn() -> &'static libm::Func, args: &[&str]) {
        let func = f();
        let mut regs: Vec<String> = Vec::with_capacity(func.types.len());
        for (i, &t) in func.types.iter().enumerate() {
            regs.push(match func.params.iter().position(|p| p.0 == i) {
                Some(a) => args[a].to_string(),
                None if t == libm::Ty::Bool => self.p(),
                None => self.r(),
            });
        }
        self.comment(func.name);
        self.libm_body(func, &func.body, &regs);
        self.ins(format!("mov.b32 {v}, {}", regs[func.result.0]));
    }

    fn libm_body(&mut self, f: &libm::Func, body: &[libm::Stmt], regs: &[String]) {
        for s in body {
            match s {
                libm::Stmt::Set(v, op) => {
                    let ins = libm_ins(f, *v, *op, regs);
                    self.ins(ins);
                }
                libm::Stmt::If(c, inner) => {
                    let end = self.label("fi");
                    self.ins(format!("@!{} bra {end}", regs[c.0]));
                    self.libm_body(f, inner, regs);
                    self.place_label(&end);
                }
                libm::Stmt::While(c, inner) => {
                    let (top, end) = (self.label("while"), self.label("wend"));
                    self.place_label(&top);
                    self.ins(format!("@!{} bra {end}", regs[c.0]));
                    self.libm_body(f, inner, regs);
                    self.ins(format!("bra {top}"));
                    self.place_label(&end);
                }
            }
        }
    }

    /// A 32-bit register holding `imm`.
    fn imm(&mut self, imm: u32) -> String {
        let r = self.r();
        self.ins(format!("mov.b32 {r}, {imm}"));
        r
    }

    fn finish(self) -> String {
        let k = self.plan.kernel.kernel();
        let mut head = String::new();
        let _ = writeln!(head, "// tessel: kernel `{}` for the Mosaic GPU backend", k.name);
        let _ = writeln!(
            head,
            "// {} CTAs of {} threads, {} bytes of {} per CTA",
            self.plan.ctas,
            self.plan.threads(),
            self.plan.workspace_per_cta,
            if self.plan.shared { "shared memory" } else { "global workspace" }
        );
        let gemm = self.plan.gemm.as_ref();
        if let Some(g) = gemm {
            let _ = writeln!(
                head,
                "// hopper: dot of {} [{}, {}] x {} on wgmma m64n{}k16 ({} warpgroup{}), operands by TMA with {}-byte swizzle, {} stages over {} steps, into {} ({})",
                g.dtype,
                g.bm,
                g.bk,
                if g.b_k_major { format!("[{}, {}]^T", g.bn, g.bk) } else { format!("[{}, {}]", g.bk, g.bn) },
                g.bn,
                g.warpgroups(),
                if g.warpgroups() == 1 { "" } else { "s" },
                crate::wgmma::SWIZZLE,
                g.stages,
                g.steps,
                g.out,
                g.out_dtype
            );
            for m in &g.maps {
                let _ = writeln!(
                    head,
                    "// tensor map {}_{}_map: {}, box {} x {}, swizzle {}",
                    self.plan.entry,
                    m.array,
                    m.array,
                    m.boxes[0],
                    m.boxes[1],
                    crate::wgmma::SWIZZLE
                );
            }
        }
        let _ = writeln!(head, ".version 8.0\n.target sm_90a\n.address_size 64\n");
        let mut params = Vec::new();
        if self.plan.shared {
            // The 128-byte swizzle repeats every 1024 bytes: its stages start on that boundary.
            let align = if gemm.is_some() { 1024 } else { 16 };
            let _ = writeln!(head, ".extern .shared .align {align} .b8 {SHARED}[];\n");
        } else {
            params.push(format!("\t.param .u64 {}_workspace", self.plan.entry));
        }
        for p in k.params.iter().filter(|p| p.kind != ParamKind::Scratch) {
            params.push(format!("\t.param .u64 {}_{}", self.plan.entry, p.name));
        }
        for m in gemm.iter().flat_map(|g| &g.maps) {
            params.push(format!("\t.param .align 64 .b8 {}_{}_map[128]", self.plan.entry, m.array));
        }
        let _ = writeln!(
            head,
            ".visible .entry {}(\n{}\n)\n.maxntid {}, 1, 1\n{{",
            self.plan.entry,
            params.join(",\n"),
            self.plan.threads()
        );
        let _ = writeln!(head, "\t.reg .pred %p<{}>;", self.preds + 1);
        let _ = writeln!(head, "\t.reg .b16 %h<{}>;", self.regs16 + 1);
        let _ = writeln!(head, "\t.reg .b32 %r<{}>;", self.regs + 1);
        let _ = writeln!(head, "\t.reg .b64 %rd<{}>;", self.regs64 + 1);
        if let Some(g) = gemm {
            let _ = writeln!(head, "\t.reg .f32 %f<{}>;", g.bn / 2 + 1);
        }
        head.push('\n');
        head + &self.out + "\tret;\n}\n"
    }

    // ---- kernel structure ----

    fn write_kernel(&mut self) {
        let plan = self.plan;
        if let Some(g) = &plan.gemm {
            return self.write_gemm(g);
        }
        let k = plan.kernel.kernel();
        let entry = plan.entry.clone();
        // Warpgroup w = tid.x / 128 runs point w of the thread axis; lanes are tid.x % 128.
        let (tid_x, cta) = self.write_ids();
        self.workspace = self.rd();
        let ws = self.workspace.clone();
        if plan.shared {
            self.comment("the CTA's workspace: its dynamic shared memory");
            self.ins(format!("mov.u64 {ws}, {SHARED}"));
            if plan.scratch_bytes > 0 {
                // Scratch starts zeroed (docs/language.md §8); shared memory does not. Every
                // thread of the CTA clears words, then the whole CTA waits.
                self.comment("zero the scratch");
                let (zero, words) = (self.imm(0), (plan.scratch_bytes / 4) as usize);
                self.count(&tid_x, words, plan.threads(), false, ("zero", "zeroed"), |w, i| {
                    let addr = w.rd();
                    w.ins(format!("mul.wide.u32 {addr}, {i}, 4"));
                    w.ins(format!("add.u64 {addr}, {ws}, {addr}"));
                    w.ins(format!("st.shared.b32 [{addr}], {zero}"));
                });
                self.ins("bar.sync 0");
            }
        } else {
            self.comment("the CTA's workspace region: workspace + ctaid.x * bytes per CTA");
            let base = self.rd();
            self.ins(format!("ld.param.u64 {base}, [{entry}_workspace]"));
            self.ins(format!("cvta.to.global.u64 {base}, {base}"));
            let off = self.rd();
            self.ins(format!("mul.wide.u32 {off}, {cta}, {}", plan.workspace_per_cta));
            self.ins(format!("add.u64 {ws}, {base}, {off}"));
        }
        let voff = self.rd();
        self.ins(format!("mul.wide.u32 {voff}, {}, {}", self.warpgroup, plan.value_bytes));
        self.values = self.rd();
        self.ins(format!("add.u64 {}, {}, {voff}", self.values, self.workspace));
        for p in k.params.iter().filter(|p| p.kind != ParamKind::Scratch) {
            let r = self.rd();
            self.ins(format!("ld.param.u64 {r}, [{entry}_{}]", p.name));
            self.ins(format!("cvta.to.global.u64 {r}, {r}"));
            self.args.push((p.name.clone(), r));
        }
        // Program coordinates of the parallel axes: row-major in ctaid.x, the last axis fastest.
        let grid = plan.kernel.grid().to_vec();
        self.coords = grid.iter().map(|_| String::new()).collect();
        let size = |a: &GridAxis| match a.size {
            AxisSize::Fixed(n) => n,
            AxisSize::Dyn => unreachable!("plan refuses dyn axes"),
        };
        let par: Vec<usize> = (0..grid.len()).filter(|&a| !grid[a].seq && Some(a) != plan.thread_axis).collect();
        let seq: Vec<usize> = (0..grid.len()).filter(|&a| grid[a].seq).collect();
        self.decode(&cta, &par);
        let steps: u64 = seq.iter().map(|&a| size(&grid[a])).product();
        // The `seq` steps of one program: `refill` when a later thread-axis point runs them again.
        let seq_loop = |w: &mut Writer<'_>, refill: bool| {
            let step = w.r();
            w.ins(format!("mov.u32 {step}, 0"));
            let top = w.label("seq");
            w.place_label(&top);
            w.decode(&step, &seq);
            w.write_origins();
            // In name order, so that the PTX is the same from run to run.
            let mut names: Vec<&String> = w.plan.in_registers.iter().collect();
            names.sort();
            for v in names {
                let n: usize = w.plan.kernel.value_type(v).numel();
                let regs = (0..n.div_ceil(THREADS as usize)).map(|_| w.r()).collect();
                w.in_registers.insert(v.clone(), regs);
            }
            w.write_body(&k.body);
            // The next step (or the next thread-axis point) writes every slot again.
            if steps > 1 || refill {
                w.barrier();
            }
            w.ins(format!("add.u32 {step}, {step}, 1"));
            let more = w.p();
            w.ins(format!("setp.lt.u32 {more}, {step}, {steps}"));
            w.ins(format!("@{more} bra.uni {top}"));
        };
        match plan.thread_axis {
            // More points of the thread axis than warpgroups: each warpgroup walks its points.
            Some(t) if plan.thread_points > plan.warpgroups => {
                self.comment(&format!("{} thread-axis points on {} warpgroups", plan.thread_points, plan.warpgroups));
                let wg = self.warpgroup.clone();
                self.count(&wg, plan.thread_points as usize, plan.warpgroups, true, ("point", "points"), |w, point| {
                    w.coords[t] = point.to_string();
                    seq_loop(w, true);
                });
            }
            Some(t) => {
                self.coords[t] = self.warpgroup.clone();
                seq_loop(self, false);
            }
            None => seq_loop(self, false),
        }
    }

    /// `%tid.x`, the thread's lane in its warpgroup (`self.tid`) and its warpgroup
    /// (`self.warpgroup`), `%ctaid.x`: the registers of `%tid.x` and `%ctaid.x`.
    fn write_ids(&mut self) -> (String, String) {
        let tid_x = self.r();
        self.ins(format!("mov.u32 {tid_x}, %tid.x"));
        self.tid = self.r();
        self.warpgroup = self.r();
        let (tid, wg) = (self.tid.clone(), self.warpgroup.clone());
        self.ins(format!("rem.u32 {tid}, {tid_x}, {THREADS}"));
        self.ins(format!("div.u32 {wg}, {tid_x}, {THREADS}"));
        let cta = self.r();
        self.ins(format!("mov.u32 {cta}, %ctaid.x"));
        (tid_x, cta)
    }

    /// The coordinates of grid `axes` from the row-major `counter` over them (the last fastest).
    fn decode(&mut self, counter: &str, axes: &[usize]) {
        let grid = self.plan.kernel.grid();
        let mut stride: u64 = 1;
        for &a in axes.iter().rev() {
            let AxisSize::Fixed(n) = grid[a].size else { unreachable!("plan refuses dyn axes") };
            let c = self.r();
            self.ins(format!("div.u32 {c}, {counter}, {stride}"));
            self.ins(format!("rem.u32 {c}, {c}, {n}"));
            self.coords[a] = c;
            stride *= n;
        }
    }

    /// The origin registers [`Writer::write_origins`] made for argument `name`.
    fn origin_of(&self, name: &str) -> Vec<String> {
        self.origins.iter().find(|(n, _)| n == name).map(|(_, o)| o.clone()).expect("origins computed")
    }

    /// Element origin of every argument's block at this grid point: `E_d * B_d`.
    fn write_origins(&mut self) {
        let k = self.plan.kernel.kernel();
        let grid = self.plan.kernel.grid().to_vec();
        self.origins.clear();
        for p in &k.params {
            let mut regs = Vec::new();
            if let Some(b) = &p.block {
                for (e, &bs) in b.index.iter().zip(&b.shape) {
                    let o = self.r();
                    self.ins(format!("mov.b32 {o}, {}", e.constant as i32));
                    for (c, name) in &e.terms {
                        let a = grid.iter().position(|g| &g.name == name).expect("verified axis");
                        let coord = self.coords[a].clone();
                        self.ins(format!("mad.lo.s32 {o}, {coord}, {}, {o}", *c as i32));
                    }
                    self.ins(format!("mul.lo.s32 {o}, {o}, {bs}"));
                    regs.push(o);
                }
            } else {
                for _ in &p.ty.shape {
                    let z = self.imm(0);
                    regs.push(z);
                }
            }
            self.origins.push((p.name.clone(), regs));
        }
    }

    /// A loop of the warpgroup's threads over `n` elements: thread `t` takes elements `t`,
    /// `t + 128`, ... `f` writes one element `e`. Barriers come from [`Writer::sync`].
    fn each(&mut self, n: usize, f: impl Fn(&mut Self, &str)) {
        let tid = self.tid.clone();
        if !std::mem::take(&mut self.unroll) {
            return self.count(&tid, n, THREADS, false, ("each", "done"), f);
        }
        // Unrolled, so that element `t + 128 j` is register `j` of a value in registers.
        for j in 0..n.div_ceil(THREADS as usize) {
            let e = self.r();
            self.ins(format!("add.u32 {e}, {tid}, {}", j * THREADS as usize));
            let skip = ((j + 1) * THREADS as usize > n).then(|| self.label("past"));
            if let Some(skip) = &skip {
                let past = self.p();
                self.ins(format!("setp.ge.u32 {past}, {e}, {n}"));
                self.ins(format!("@{past} bra {skip}"));
            }
            self.element = Some((e.clone(), j));
            f(self, &e);
            self.element = None;
            if let Some(skip) = skip {
                self.place_label(&skip);
            }
        }
    }

    /// A counted loop: `i` from `from` while below `below`, by `by`; `uniform` when the threads of
    /// a warp all take the same branches (`bra.uni`). `labels` are the loop's label stems.
    fn count(
        &mut self,
        from: &str,
        below: usize,
        by: u32,
        uniform: bool,
        labels: (&str, &str),
        body: impl FnOnce(&mut Self, &str),
    ) {
        let i = self.r();
        self.ins(format!("mov.u32 {i}, {from}"));
        let (top, end) = (self.label(labels.0), self.label(labels.1));
        self.place_label(&top);
        let done = self.p();
        let bra = if uniform { "bra.uni" } else { "bra" };
        self.ins(format!("setp.ge.u32 {done}, {i}, {below}"));
        self.ins(format!("@{done} {bra} {end}"));
        body(self, &i);
        self.ins(format!("add.u32 {i}, {i}, {by}"));
        self.ins(format!("{bra} {top}"));
        self.place_label(&end);
    }

    /// A barrier before an operation whose accesses meet another thread's since the last one;
    /// then the accesses are recorded.
    fn sync(&mut self, reads: &[Use], writes: &[Use]) {
        let h = &self.hazards;
        if reads.iter().any(|u| h.conflicts(u, false)) || writes.iter().any(|u| h.conflicts(u, true)) {
            self.barrier();
        }
        for u in reads {
            self.hazards.record(u, false);
        }
        for u in writes {
            self.hazards.record(u, true);
        }
    }

    /// The warpgroup's barrier: its threads wait for each other.
    fn barrier(&mut self) {
        self.hazards = Hazards::default();
        if self.plan.warpgroups == 1 {
            self.ins("bar.sync 0");
        } else {
            // Each warpgroup synchronises its own 128 threads (named barrier = warpgroup).
            let wg = self.warpgroup.clone();
            self.ins(format!("bar.sync {wg}, {THREADS}"));
        }
    }

    // ---- memory ----

    fn slot_addr(&mut self, name: &str, index: &str) -> String {
        // Values live in this warpgroup's copy; scratch in the region the CTA shares.
        let (slot, region) = match self.plan.values.get(name) {
            Some(s) => (s, self.values.clone()),
            None => (self.plan.scratch.get(name).unwrap_or_else(|| panic!("planned slot for {name}")), self.workspace.clone()),
        };
        let offset = slot.offset;
        let (base, wide) = (self.rd(), self.rd());
        let ws = region;
        self.ins(format!("add.u64 {base}, {ws}, {offset}"));
        self.ins(format!("mul.wide.u32 {wide}, {index}, 4"));
        self.ins(format!("add.u64 {base}, {base}, {wide}"));
        base
    }

    /// The state space of the workspace: `shared` or `global`.
    fn space(&self) -> &'static str {
        if self.plan.shared { "shared" } else { "global" }
    }

    /// Register `j` of a value in registers, where `index` is the unrolled loop's own element.
    fn register_of(&self, name: &str, index: &str) -> Option<String> {
        let regs = self.in_registers.get(name)?;
        let (e, j) = self.element.as_ref().expect("values in registers are touched in unrolled loops");
        assert_eq!(index, e, "a value in registers is read only at the thread's own element");
        Some(regs[*j].clone())
    }

    fn load_slot(&mut self, name: &str, index: &str) -> String {
        if let Some(reg) = self.register_of(name, index) {
            // A copy: callers may change what they load in place.
            let v = self.r();
            self.ins(format!("mov.b32 {v}, {reg}"));
            return v;
        }
        let addr = self.slot_addr(name, index);
        let v = self.r();
        self.ins(format!("ld.{}.b32 {v}, [{addr}]", self.space()));
        v
    }

    fn store_slot(&mut self, name: &str, index: &str, v: &str) {
        if let Some(reg) = self.register_of(name, index) {
            self.ins(format!("mov.b32 {reg}, {v}"));
            return;
        }
        let addr = self.slot_addr(name, index);
        self.ins(format!("st.{}.b32 [{addr}], {v}", self.space()));
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
            self.ins(format!("div.u32 {t}, {e}, {}", ts[d]));
            self.ins(format!("rem.u32 {t}, {t}, {}", to[d]));
            self.ins(format!("mad.lo.u32 {acc}, {t}, {}, {acc}", fs[d - lead]));
        }
        acc
    }

    fn shape_of(&self, name: &str) -> Vec<usize> {
        self.plan.values.get(name).map(|s| s.shape.clone()).unwrap_or_else(|| self.plan.kernel.value_type(name).shape.clone())
    }

    /// An operand's element for result element `e` of shape `to` (literals as `dtype`).
    fn operand(&mut self, o: &Operand, dtype: DType, e: &str, to: &[usize]) -> String {
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
    fn scalar(&mut self, o: &Operand) -> String {
        match o {
            Operand::Lit(l) => self.imm(lit_bits(*l, DType::I32)),
            Operand::Value(v) => {
                let zero = self.imm(0);
                self.load_slot(v, &zero)
            }
        }
    }

    fn dtype_of(&self, ops: &[&Operand]) -> DType {
        ops.iter()
            .find_map(|o| match o {
                Operand::Value(v) => Some(self.plan.kernel.value_type(v).dtype),
                Operand::Lit(_) => None,
            })
            .expect("verifier: one operand is a value")
    }

    // ---- body ----

    fn write_body(&mut self, body: &[Stmt]) {
        for s in body {
            let head = tessel_plugin_api::ir::print::print_stmt_head(s);
            self.comment(&head);
            self.write_stmt(s);
        }
    }

    fn write_stmt(&mut self, s: &Stmt) {
        let dst = s.results.first().cloned().unwrap_or_default();
        let ty = s.ty.clone();
        let out_shape = ty.as_ref().map(|t| t.shape.clone()).unwrap_or_default();
        let n = out_shape.iter().product::<usize>();
        let (reads, writes) = uses(&self.plan.kernel, s, &out_shape);
        self.sync(&reads, &writes);
        self.unroll = reads.iter().chain(&writes).any(|u| self.in_registers.contains_key(&u.name));
        match &s.op {
            Op::Load { src, index, mask, other } => {
                self.write_access(src, index.as_deref(), mask.as_deref(), Access::Load { dst: &dst, other: *other })
            }
            Op::Store { dst: d, index, value, mask } => {
                self.write_access(d, index.as_deref(), mask.as_deref(), Access::Store { value })
            }
            Op::ProgramId(a) | Op::NumPrograms(a) => {
                let grid = self.plan.kernel.grid().to_vec();
                let axis = match a {
                    AxisRef::Pos(p) => *p,
                    AxisRef::Name(nm) => grid.iter().position(|g| &g.name == nm).expect("verified axis"),
                };
                let is_id = matches!(s.op, Op::ProgramId(_));
                self.each(1, |w, e| {
                    let v = if is_id {
                        w.coords[axis].clone()
                    } else {
                        let AxisSize::Fixed(n) = grid[axis].size else { unreachable!("plan refuses dyn axes") };
                        w.imm(n as u32)
                    };
                    w.store_slot(&dst, e, &v);
                });
            }
            Op::Iota { dim } => {
                let st = strides(&out_shape)[*dim];
                let size = out_shape[*dim];
                self.each(n, |w, e| {
                    let v = w.r();
                    w.ins(format!("div.u32 {v}, {e}, {st}"));
                    w.ins(format!("rem.u32 {v}, {v}, {size}"));
                    w.store_slot(&dst, e, &v);
                });
            }
            Op::Full(l) => {
                let bits = lit_bits(*l, ty.as_ref().expect("typed").dtype);
                self.each(n, |w, e| {
                    let v = w.imm(bits);
                    w.store_slot(&dst, e, &v);
                });
            }
            Op::Zeros => self.each(n, |w, e| {
                let v = w.imm(0);
                w.store_slot(&dst, e, &v);
            }),
            Op::Unary(op, a) => {
                let d = self.dtype_of(&[a]);
                self.each(n, |w, e| {
                    let x = w.operand(a, d, e, &out_shape);
                    let v = w.unary(*op, d, &x);
                    w.store_slot(&dst, e, &v);
                });
            }
            Op::Binary(op, a, b) => {
                let d = self.dtype_of(&[a, b]);
                self.each(n, |w, e| {
                    let (x, y) = (w.operand(a, d, e, &out_shape), w.operand(b, d, e, &out_shape));
                    let v = w.binary(*op, d, &x, &y);
                    w.store_slot(&dst, e, &v);
                });
            }
            Op::Compare(op, a, b) => {
                let d = self.dtype_of(&[a, b]);
                self.each(n, |w, e| {
                    let (x, y) = (w.operand(a, d, e, &out_shape), w.operand(b, d, e, &out_shape));
                    let v = w.compare(*op, d, &x, &y);
                    w.store_slot(&dst, e, &v);
                });
            }
            Op::Select(c, a, b) => {
                let d = self.dtype_of(&[a, b]);
                self.each(n, |w, e| {
                    let cv = w.operand(c, DType::Bool, e, &out_shape);
                    let (x, y) = (w.operand(a, d, e, &out_shape), w.operand(b, d, e, &out_shape));
                    let (p, v) = (w.p(), w.r());
                    w.ins(format!("setp.ne.u32 {p}, {cv}, 0"));
                    w.ins(format!("selp.b32 {v}, {x}, {y}, {p}"));
                    w.store_slot(&dst, e, &v);
                });
            }
            Op::Cast(a) => {
                let from = self.dtype_of(&[a]);
                let to = ty.as_ref().expect("typed").dtype;
                self.each(n, |w, e| {
                    let x = w.operand(a, from, e, &out_shape);
                    let v = w.cast(from, to, &x);
                    w.store_slot(&dst, e, &v);
                });
            }
            Op::Bitcast(a) => {
                let from = self.dtype_of(&[a]);
                let to = ty.as_ref().expect("typed").dtype;
                self.each(n, |w, e| {
                    let x = w.operand(a, from, e, &out_shape);
                    let v = if from.bits() == 16 && from != to { w.bitcast16(from, to, &x) } else { x };
                    w.store_slot(&dst, e, &v);
                });
            }
            Op::Broadcast(a) => self.each(n, |w, e| {
                let x = w.operand(a, DType::U32, e, &out_shape);
                w.store_slot(&dst, e, &x);
            }),
            Op::Reshape(a) => {
                let Operand::Value(src) = a else { unreachable!("verifier: reshape of a value") };
                self.each(n, |w, e| {
                    let x = w.load_slot(src, e);
                    w.store_slot(&dst, e, &x);
                });
            }
            Op::Transpose { arg, perm } => {
                let Operand::Value(src) = arg else { unreachable!("verifier: transpose of a value") };
                let in_st = strides(&self.shape_of(src));
                let out_st = strides(&out_shape);
                self.each(n, |w, e| {
                    let acc = w.imm(0);
                    for (d, &p) in perm.iter().enumerate() {
                        let t = w.r();
                        w.ins(format!("div.u32 {t}, {e}, {}", out_st[d]));
                        w.ins(format!("rem.u32 {t}, {t}, {}", out_shape[d]));
                        w.ins(format!("mad.lo.u32 {acc}, {t}, {}, {acc}", in_st[p]));
                    }
                    let x = w.load_slot(src, &acc);
                    w.store_slot(&dst, e, &x);
                });
            }
            Op::Reduce { op, arg, axis, .. } => self.write_reduce(*op, arg, *axis, &dst, n),
            Op::Dot { a, b, trans_a, trans_b } => self.write_dot(a, b, *trans_a, *trans_b, &dst, &out_shape),
            Op::When { cond, body } => {
                let c = self.scalar(cond);
                let (p, end) = (self.p(), self.label("when"));
                self.ins(format!("setp.eq.u32 {p}, {c}, 0"));
                self.ins(format!("@{p} bra.uni {end}"));
                // After the body: what it left, or (skipped) what was before it.
                let before = self.hazards.clone();
                self.write_body(body);
                self.place_label(&end);
                self.hazards.union(before);
            }
            Op::For { var, lo, hi, step, iters, body } => self.write_for(var, lo, hi, step.as_ref(), iters, body, &s.results),
            Op::Yield(_) => {}
        }
    }

    fn copy_value(&mut self, from: &str, to: &str) {
        self.sync(&[Use::own(from)], &[Use::own(to)]);
        self.unroll = [from, to].iter().any(|n| self.in_registers.contains_key(*n));
        let n: usize = self.shape_of(from).iter().product();
        let (from, to) = (from.to_string(), to.to_string());
        self.each(n, |w, e| {
            let v = w.load_slot(&from, e);
            w.store_slot(&to, e, &v);
        });
    }

    #[allow(clippy::too_many_arguments, reason = "the parts of one `for` statement")]
    fn write_for(
        &mut self,
        var: &str,
        lo: &Operand,
        hi: &Operand,
        step: Option<&Operand>,
        iters: &[(String, Operand)],
        body: &[Stmt],
        results: &[String],
    ) {
        for (name, init) in iters {
            match init {
                Operand::Value(v) => self.copy_value(v, name),
                Operand::Lit(_) => unreachable!("verifier: iter initial values are values"),
            }
        }
        let (lo, hi) = (self.scalar(lo), self.scalar(hi));
        let step = match step {
            Some(s) => self.scalar(s),
            None => self.imm(1),
        };
        let i = self.r();
        self.ins(format!("mov.b32 {i}, {lo}"));
        let (top, end) = (self.label("for"), self.label("endfor"));
        let never = self.p();
        self.ins(format!("setp.le.s32 {never}, {step}, 0"));
        self.ins(format!("@{never} bra.uni {end}"));
        // Every iteration ends with a barrier, so the loop's top and its exit see only what
        // came before the loop.
        let before = self.hazards.clone();
        self.place_label(&top);
        let done = self.p();
        self.ins(format!("setp.ge.s32 {done}, {i}, {hi}"));
        self.ins(format!("@{done} bra.uni {end}"));
        let var = var.to_string();
        let iv = i.clone();
        self.sync(&[], &[Use::own(&var)]);
        self.each(1, |w, e| w.store_slot(&var, e, &iv));
        self.write_body(body);
        if let Some(Stmt { op: Op::Yield(vals), .. }) = body.last() {
            for (v, (name, _)) in vals.iter().zip(iters) {
                let Operand::Value(v) = v else { unreachable!("verifier: yields are values") };
                self.copy_value(v, &format!("{name}.next"));
            }
            for (name, _) in iters {
                self.copy_value(&format!("{name}.next"), name);
            }
        }
        self.barrier();
        self.ins(format!("add.s32 {i}, {i}, {step}"));
        self.ins(format!("bra.uni {top}"));
        self.place_label(&end);
        self.hazards = before;
        for ((name, _), r) in iters.iter().zip(results) {
            self.copy_value(name, r);
        }
    }

    fn write_reduce(&mut self, op: ReduceOp, arg: &Operand, axis: usize, dst: &str, n: usize) {
        let Operand::Value(src) = arg else { unreachable!("verifier: reduce of a value") };
        let shape = self.shape_of(src);
        let d = self.plan.kernel.value_type(src).dtype;
        let len = shape[axis];
        let inner: usize = shape[axis + 1..].iter().product();
        let (src, dst) = (src.to_string(), dst.to_string());
        self.each(n, |w, e| {
            // Output element e = (outer, in): inputs at outer*len*inner + r*inner + in, r ascending.
            let (outer, inn, base) = (w.r(), w.r(), w.r());
            w.ins(format!("div.u32 {outer}, {e}, {inner}"));
            w.ins(format!("rem.u32 {inn}, {e}, {inner}"));
            w.ins(format!("mad.lo.u32 {base}, {outer}, {}, {inn}", len * inner));
            let acc = w.load_slot(&src, &base);
            let r = w.imm(1);
            let (top, end) = (w.label("red"), w.label("endred"));
            w.place_label(&top);
            let done = w.p();
            w.ins(format!("setp.ge.u32 {done}, {r}, {len}"));
            w.ins(format!("@{done} bra {end}"));
            let idx = w.r();
            w.ins(format!("mad.lo.u32 {idx}, {r}, {inner}, {base}"));
            let x = w.load_slot(&src, &idx);
            let bop = match op {
                ReduceOp::Sum => BinaryOp::Add,
                ReduceOp::Prod => BinaryOp::Mul,
                ReduceOp::Max => BinaryOp::Max,
                ReduceOp::Min => BinaryOp::Min,
            };
            // 16-bit floats accumulate in f32 and round once, as the interpreter does.
            let v = w.binary32(bop, d, &acc, &x);
            w.ins(format!("mov.b32 {acc}, {v}"));
            w.ins(format!("add.u32 {r}, {r}, 1"));
            w.ins(format!("bra {top}"));
            w.place_label(&end);
            w.round16(d, &acc);
            w.store_slot(&dst, e, &acc);
        });
    }

    fn write_dot(&mut self, a: &Operand, b: &Operand, ta: bool, tb: bool, dst: &str, out: &[usize]) {
        let (Operand::Value(a), Operand::Value(b)) = (a, b) else { unreachable!("verifier: dot of values") };
        let d = self.plan.kernel.value_type(a).dtype;
        let sa = self.shape_of(a);
        let (m, n) = (out[0], out[1]);
        let k = if ta { sa[0] } else { sa[1] };
        let (a, b, dst) = (a.to_string(), b.to_string(), dst.to_string());
        if d.is_float() {
            let dot = Dot { a: &a, b: &b, ta, tb, dst: &dst, m, n, k, dtype: d };
            return self.write_dot_mma(&dot);
        }
        self.each(m * n, |w, e| {
            let (row, col) = (w.r(), w.r());
            w.ins(format!("div.u32 {row}, {e}, {n}"));
            w.ins(format!("rem.u32 {col}, {e}, {n}"));
            let acc = w.imm(0);
            let p = w.imm(0);
            let (top, end) = (w.label("dot"), w.label("enddot"));
            w.place_label(&top);
            let done = w.p();
            w.ins(format!("setp.ge.u32 {done}, {p}, {k}"));
            w.ins(format!("@{done} bra {end}"));
            let (ia, ib) = (w.r(), w.r());
            // a[row, p] (a[p, row] when transposed), b[p, col] (b[col, p] when transposed).
            if ta {
                w.ins(format!("mad.lo.u32 {ia}, {p}, {m}, {row}"))
            } else {
                w.ins(format!("mad.lo.u32 {ia}, {row}, {k}, {p}"))
            }
            if tb {
                w.ins(format!("mad.lo.u32 {ib}, {col}, {k}, {p}"))
            } else {
                w.ins(format!("mad.lo.u32 {ib}, {p}, {n}, {col}"))
            }
            let (x, y) = (w.load_slot(&a, &ia), w.load_slot(&b, &ib));
            let prod = w.binary32(BinaryOp::Mul, d, &x, &y);
            let sum = w.binary32(BinaryOp::Add, d, &acc, &prod);
            w.ins(format!("mov.b32 {acc}, {sum}"));
            w.ins(format!("add.u32 {p}, {p}, 1"));
            w.ins(format!("bra {top}"));
            w.place_label(&end);
            w.store_slot(&dst, e, &acc);
        });
    }

    /// Float `dot` on the tensor cores: each warp of the warpgroup takes 16x8 tiles of the result
    /// in turn and walks the contraction in steps of `mma.sync` — `m16n8k16` on `f16`/`bf16`
    /// inputs (exact products, `f32` accumulation), `m16n8k8` on `f32` inputs split exactly into
    /// three `tf32` parts each, with the six products that reach `2^-22` of `hi * hi`: `f32`
    /// accuracy, which the language's contract asks of an `f32` dot (3xTF32's two parts fell short
    /// on sums with cancellation; docs/language.md §8). Fragments are gathered from
    /// the operands' slots with the PTX ISA's layouts (`g` = lane / 4, `t` = lane % 4); elements
    /// past the operands' edges read 0, so any shape works.
    fn write_dot_mma(&mut self, dot: &Dot<'_>) {
        let kstep = dot.kstep();
        let tiles = dot.m.div_ceil(16) * dot.tiles_n();
        self.comment(&format!(
            "{} tiles of 16x8 over the 4 warps, {} steps of k = {kstep}",
            tiles,
            dot.k.div_ceil(kstep as usize)
        ));
        let (lane, warp, g, t) = (self.r(), self.r(), self.r(), self.r());
        let tid = self.tid.clone();
        self.ins(format!("and.b32 {lane}, {tid}, 31"));
        self.ins(format!("shr.u32 {warp}, {tid}, 5"));
        self.ins(format!("shr.u32 {g}, {lane}, 2"));
        self.ins(format!("and.b32 {t}, {lane}, 3"));
        let warps = THREADS / 32;
        self.count(&warp, tiles, warps, true, ("tile", "tiles"), |w, tile| w.mma_tile(dot, tile, &g, &t));
    }

    /// One 16x8 tile of a tensor-core `dot` for the warp (see [`Writer::write_dot_mma`]).
    fn mma_tile(&mut self, dot: &Dot<'_>, tile: &str, g: &str, t: &str) {
        let tiles_n = dot.tiles_n();
        let (r0, c0) = (self.r(), self.r());
        self.ins(format!("div.u32 {r0}, {tile}, {tiles_n}"));
        self.ins(format!("mul.lo.u32 {r0}, {r0}, 16"));
        self.ins(format!("rem.u32 {c0}, {tile}, {tiles_n}"));
        self.ins(format!("mul.lo.u32 {c0}, {c0}, 8"));
        // This lane's rows and columns: g and g + 8 of the tile; 2t and 2t + 1.
        let (row_lo, row_hi, col) = (self.r(), self.r(), self.r());
        self.ins(format!("add.u32 {row_lo}, {r0}, {g}"));
        self.ins(format!("add.u32 {row_hi}, {row_lo}, 8"));
        self.ins(format!("mad.lo.u32 {col}, {t}, 2, {c0}"));
        let acc: Vec<String> = (0..4).map(|_| self.imm(0)).collect();
        self.count("0", dot.k, dot.kstep(), true, ("k", "kdone"), |w, kk| {
            // The B column of this lane is c0 + g; its A rows are row_lo and row_hi.
            let bcol = w.r();
            w.ins(format!("add.u32 {bcol}, {c0}, {g}"));
            if dot.dtype == DType::F32 {
                // A: a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4); B: b0 (t, g), b1 (t+4, g).
                let (k0, k4) = (w.r(), w.r());
                w.ins(format!("add.u32 {k0}, {kk}, {t}"));
                w.ins(format!("add.u32 {k4}, {k0}, 4"));
                let a: Vec<String> = [(&row_lo, &k0), (&row_hi, &k0), (&row_lo, &k4), (&row_hi, &k4)]
                    .into_iter()
                    .map(|(r, c)| w.dot_a(dot, r, c))
                    .collect();
                let b: Vec<String> = [&k0, &k4].into_iter().map(|r| w.dot_b(dot, r, &bcol)).collect();
                let [a_hi, a_mid, a_lo] = w.split_tf32(&a);
                let [b_hi, b_mid, b_lo] = w.split_tf32(&b);
                // The six products down to 2^-22 of hi * hi, the small ones first.
                let products =
                    [(&a_lo, &b_hi), (&a_hi, &b_lo), (&a_mid, &b_mid), (&a_mid, &b_hi), (&a_hi, &b_mid), (&a_hi, &b_hi)];
                for (x, y) in products {
                    w.mma("m16n8k8.row.col.f32.tf32.tf32.f32", &acc, x, y);
                }
            } else {
                // A: a_i at row g (+8 for i = 2, 3, 6, 7), column 2t + i%2 (+8 for i >= 4), two to a
                // register, the lower index in the low half; B: b_i at row 2t + i%2 (+8 for i >= 2).
                let (k0, k1, k8, k9) = (w.r(), w.r(), w.r(), w.r());
                w.ins(format!("mad.lo.u32 {k0}, {t}, 2, {kk}"));
                w.ins(format!("add.u32 {k1}, {k0}, 1"));
                w.ins(format!("add.u32 {k8}, {k0}, 8"));
                w.ins(format!("add.u32 {k9}, {k0}, 9"));
                let pairs_a = [(&row_lo, &k0, &k1), (&row_hi, &k0, &k1), (&row_lo, &k8, &k9), (&row_hi, &k8, &k9)];
                let a: Vec<String> = pairs_a
                    .into_iter()
                    .map(|(r, c, c1)| {
                        let (x, y) = (w.dot_a(dot, r, c), w.dot_a(dot, r, c1));
                        w.pack16(dot.dtype, &x, &y)
                    })
                    .collect();
                let b: Vec<String> = [(&k0, &k1), (&k8, &k9)]
                    .into_iter()
                    .map(|(r, r1)| {
                        let (x, y) = (w.dot_b(dot, r, &bcol), w.dot_b(dot, r1, &bcol));
                        w.pack16(dot.dtype, &x, &y)
                    })
                    .collect();
                let shape = format!("m16n8k16.row.col.f32.{t}.{t}.f32", t = half_ty(dot.dtype));
                w.mma(&shape, &acc, &a, &b);
            }
        });
        // D: d_i at row g (+8 for i >= 2), column 2t + i%2; inside the result only.
        for (i, v) in acc.iter().enumerate() {
            let r = if i < 2 { &row_lo } else { &row_hi };
            let (c, idx, inside, ok) = (self.r(), self.r(), self.p(), self.p());
            self.ins(format!("add.u32 {c}, {col}, {}", i % 2));
            self.ins(format!("setp.lt.u32 {inside}, {r}, {}", dot.m));
            self.ins(format!("setp.lt.u32 {ok}, {c}, {}", dot.n));
            self.ins(format!("and.pred {ok}, {ok}, {inside}"));
            self.ins(format!("mad.lo.u32 {idx}, {r}, {}, {c}", dot.n));
            let skip = self.label("skip");
            self.ins(format!("@!{ok} bra {skip}"));
            self.store_slot(dot.dst, &idx, v);
            self.place_label(&skip);
        }
    }

    /// `a[row, col]` of a dot (`a[col, row]` when transposed), or 0 past its edges.
    fn dot_a(&mut self, dot: &Dot<'_>, row: &str, col: &str) -> String {
        self.dot_operand(dot.a, (row, col), (dot.m, dot.k), dot.ta)
    }

    /// `b[row, col]` of a dot (`b[col, row]` when transposed), or 0 past its edges.
    fn dot_b(&mut self, dot: &Dot<'_>, row: &str, col: &str) -> String {
        self.dot_operand(dot.b, (row, col), (dot.k, dot.n), dot.tb)
    }

    /// Element `(row, col)` of a `rows x cols` operand stored row-major (column-major when
    /// `transposed`), or 0 past its edges.
    fn dot_operand(&mut self, name: &str, (row, col): (&str, &str), (rows, cols): (usize, usize), transposed: bool) -> String {
        let (major, minor, stride) = if transposed { (col, row, rows) } else { (row, col, cols) };
        let (ok, inside, idx, v) = (self.p(), self.p(), self.r(), self.imm(0));
        self.ins(format!("setp.lt.u32 {ok}, {row}, {rows}"));
        self.ins(format!("setp.lt.u32 {inside}, {col}, {cols}"));
        self.ins(format!("and.pred {ok}, {ok}, {inside}"));
        self.ins(format!("mad.lo.u32 {idx}, {major}, {stride}, {minor}"));
        let addr = self.slot_addr(name, &idx);
        self.ins(format!("@{ok} ld.{}.b32 {v}, [{addr}]", self.space()));
        v
    }

    /// `f32` values split exactly into three `tf32` parts, `x = hi + mid + lo`: each part is the
    /// `tf32` rounding of what the parts before it leave (11 significant bits each; the
    /// subtractions are exact, and the last remainder has at most 3 bits).
    fn split_tf32(&mut self, xs: &[String]) -> [Vec<String>; 3] {
        let mut parts: [Vec<String>; 3] = Default::default();
        for x in xs {
            let (hi, mid, lo, rest) = (self.r(), self.r(), self.r(), self.r());
            self.ins(format!("cvt.rna.tf32.f32 {hi}, {x}"));
            self.ins(format!("sub.rn.f32 {rest}, {x}, {hi}"));
            self.ins(format!("cvt.rna.tf32.f32 {mid}, {rest}"));
            self.ins(format!("sub.rn.f32 {rest}, {rest}, {mid}"));
            self.ins(format!("cvt.rna.tf32.f32 {lo}, {rest}"));
            for (part, r) in parts.iter_mut().zip([hi, mid, lo]) {
                part.push(r);
            }
        }
        parts
    }

    /// Two 16-bit floats (held as `f32`) in one register, `lo` in the low half.
    fn pack16(&mut self, d: DType, lo: &str, hi: &str) -> String {
        let (hl, hh, v) = (self.h(), self.h(), self.r());
        self.ins(format!("cvt.rn.{}.f32 {hl}, {lo}", half_ty(d)));
        self.ins(format!("cvt.rn.{}.f32 {hh}, {hi}", half_ty(d)));
        self.ins(format!("mov.b32 {v}, {{{hl}, {hh}}}"));
        v
    }

    /// `acc = a b + acc` on the tensor cores, for the warp.
    fn mma(&mut self, shape: &str, acc: &[String], a: &[String], b: &[String]) {
        let acc = acc.join(", ");
        self.ins(format!("mma.sync.aligned.{shape} {{{acc}}}, {{{}}}, {{{}}}, {{{acc}}}", a.join(", "), b.join(", ")));
    }

    fn write_access(&mut self, name: &str, index: Option<&[Index]>, mask: Option<&str>, access: Access<'_>) {
        let k = self.plan.kernel.kernel();
        let p = k.param(name).expect("verified argument").clone();
        let block = p.block_shape().to_vec();
        let dims = p.ty.shape.clone();
        let origin = self.origin_of(name);
        // Region: a start register and a length per array dimension; which dimensions stay.
        let mut starts = Vec::new();
        let mut lens = Vec::new();
        let mut shape = Vec::new();
        for d in 0..block.len() {
            let (s, len, keep) = match index.map(|ix| &ix[d]) {
                None | Some(Index::Full) => (None, block[d], true),
                Some(Index::Slice { start, size }) => (Some(self.scalar(start)), *size, true),
                Some(Index::At(at)) => (Some(self.scalar(at)), 1, false),
            };
            let st = match s {
                Some(s) => {
                    let r = self.r();
                    self.ins(format!("add.s32 {r}, {}, {s}", origin[d]));
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
        let (base, space) = match self.args.iter().find(|(a, _)| a == name) {
            Some((_, r)) => (r.clone(), "global"),
            None => {
                let slot = self.plan.scratch[name].offset;
                let r = self.rd();
                let ws = self.workspace.clone();
                self.ins(format!("add.u64 {r}, {ws}, {slot}"));
                (r, self.space())
            }
        };
        let dtype = p.ty.dtype;
        // Arrays hold 16-bit floats as 2 bytes an element (as numpy and TMA have them); the
        // workspace holds every element as 4 bytes.
        let array = self.args.iter().any(|(a, _)| a == name);
        let (bytes, width) = if array && half_bits(dtype) { (2, "u16") } else { (4, "b32") };
        let mask_shape = mask.map(|m| self.shape_of(m));
        self.each(n, |w, e| {
            let ok = w.p();
            w.ins(format!("setp.eq.u32 {ok}, {e}, {e}"));
            let flat = w.imm(0);
            let (ls, as_) = (strides(&lens), strides(&dims));
            for d in 0..lens.len() {
                let g = w.r();
                w.ins(format!("div.u32 {g}, {e}, {}", ls[d]));
                w.ins(format!("rem.u32 {g}, {g}, {}", lens[d]));
                w.ins(format!("add.s32 {g}, {g}, {}", starts[d]));
                let inside = w.p();
                w.ins(format!("setp.lt.u32 {inside}, {g}, {}", dims[d]));
                w.ins(format!("and.pred {ok}, {ok}, {inside}"));
                w.ins(format!("mad.lo.u32 {flat}, {g}, {}, {flat}", as_[d]));
            }
            if let (Some(m), Some(ms)) = (mask, &mask_shape) {
                let i = w.broadcast_index(e, &shape, ms);
                let mv = w.load_slot(m, &i);
                let on = w.p();
                w.ins(format!("setp.ne.u32 {on}, {mv}, 0"));
                w.ins(format!("and.pred {ok}, {ok}, {on}"));
            }
            let (wide, addr) = (w.rd(), w.rd());
            w.ins(format!("mul.wide.u32 {wide}, {flat}, {bytes}"));
            w.ins(format!("add.u64 {addr}, {base}, {wide}"));
            match access {
                Access::Load { dst, other } => {
                    let (raw, v) = (w.imm(0), w.imm(lit_bits(other.unwrap_or(Literal::Int(0)), dtype)));
                    w.ins(format!("@{ok} ld.{space}.{width} {raw}, [{addr}]"));
                    w.widen16(dtype, &raw);
                    w.ins(format!("selp.b32 {v}, {raw}, {v}, {ok}"));
                    w.store_slot(dst, e, &v);
                }
                Access::Store { value } => {
                    let v = w.operand(value, dtype, e, &shape);
                    let bits = w.r();
                    w.ins(format!("mov.b32 {bits}, {v}"));
                    w.narrow16(dtype, &bits);
                    w.ins(format!("@{ok} st.{space}.{width} [{addr}], {bits}"));
                }
            }
        });
    }

    // ---- element operations ----

    fn unary(&mut self, op: UnaryOp, d: DType, x: &str) -> String {
        let v = self.unary32(op, d, x);
        self.round16(d, &v);
        v
    }

    fn unary32(&mut self, op: UnaryOp, d: DType, x: &str) -> String {
        let d = if d.is_float() { DType::F32 } else { d };
        let v = self.r();
        match (op, d) {
            (UnaryOp::Neg, DType::F32) => self.ins(format!("neg.f32 {v}, {x}")),
            (UnaryOp::Neg, _) => self.ins(format!("neg.s32 {v}, {x}")),
            (UnaryOp::Abs, DType::F32) => self.ins(format!("abs.f32 {v}, {x}")),
            (UnaryOp::Abs, DType::I32) => self.ins(format!("abs.s32 {v}, {x}")),
            (UnaryOp::Abs, _) => self.ins(format!("mov.b32 {v}, {x}")),
            (UnaryOp::Not, DType::Bool) => self.ins(format!("xor.b32 {v}, {x}, 1")),
            (UnaryOp::Not, _) => self.ins(format!("not.b32 {v}, {x}")),
            (UnaryOp::Exp, _) => self.maths(&v, libm::exp, &[x]),
            (UnaryOp::Exp2, _) => self.maths(&v, libm::exp2, &[x]),
            (UnaryOp::Log, _) => self.maths(&v, libm::log, &[x]),
            (UnaryOp::Log2, _) => self.maths(&v, libm::log2, &[x]),
            (UnaryOp::Sqrt, _) => self.ins(format!("sqrt.rn.f32 {v}, {x}")),
            (UnaryOp::Rsqrt, _) => {
                self.ins(format!("sqrt.rn.f32 {v}, {x}"));
                self.ins(format!("rcp.rn.f32 {v}, {v}"));
            }
            (UnaryOp::Sin, _) => self.maths(&v, libm::sin, &[x]),
            (UnaryOp::Cos, _) => self.maths(&v, libm::cos, &[x]),
            (UnaryOp::Tanh, _) => self.maths(&v, libm::tanh, &[x]),
            (UnaryOp::Logistic, _) => self.maths(&v, libm::logistic, &[x]),
            (UnaryOp::Floor, _) => self.ins(format!("cvt.rmi.f32.f32 {v}, {x}")),
            (UnaryOp::Ceil, _) => self.ins(format!("cvt.rpi.f32.f32 {v}, {x}")),
        }
        v
    }

    fn binary(&mut self, op: BinaryOp, d: DType, x: &str, y: &str) -> String {
        let v = self.binary32(op, d, x, y);
        self.round16(d, &v);
        v
    }

    fn binary32(&mut self, op: BinaryOp, d: DType, x: &str, y: &str) -> String {
        let v = self.r();
        let it = int_ty(d);
        let float = d.is_float();
        match op {
            BinaryOp::Add if float => self.ins(format!("add.rn.f32 {v}, {x}, {y}")),
            BinaryOp::Sub if float => self.ins(format!("sub.rn.f32 {v}, {x}, {y}")),
            BinaryOp::Mul if float => self.ins(format!("mul.rn.f32 {v}, {x}, {y}")),
            BinaryOp::Div if float => self.ins(format!("div.rn.f32 {v}, {x}, {y}")),
            BinaryOp::Rem if float => self.maths(&v, libm::fmod, &[x, y]),
            BinaryOp::Max if float => self.ins(format!("max.NaN.f32 {v}, {x}, {y}")),
            BinaryOp::Min if float => self.ins(format!("min.NaN.f32 {v}, {x}, {y}")),
            BinaryOp::Add => self.ins(format!("add.u32 {v}, {x}, {y}")),
            BinaryOp::Sub => self.ins(format!("sub.u32 {v}, {x}, {y}")),
            BinaryOp::Mul => self.ins(format!("mul.lo.u32 {v}, {x}, {y}")),
            BinaryOp::Div | BinaryOp::Rem => {
                // Zero divisors give 0; for i32, x / -1 is -x (wrapping) and x rem -1 is 0.
                let name = if op == BinaryOp::Div { "div" } else { "rem" };
                let (zero, z) = (self.p(), self.imm(0));
                self.ins(format!("{name}.{it} {v}, {x}, {y}"));
                if d == DType::I32 {
                    let minus = self.p();
                    self.ins(format!("setp.eq.s32 {minus}, {y}, -1"));
                    let alt = self.r();
                    if op == BinaryOp::Div {
                        self.ins(format!("neg.s32 {alt}, {x}"))
                    } else {
                        self.ins(format!("mov.b32 {alt}, 0"))
                    }
                    self.ins(format!("selp.b32 {v}, {alt}, {v}, {minus}"));
                }
                self.ins(format!("setp.eq.u32 {zero}, {y}, 0"));
                self.ins(format!("selp.b32 {v}, {z}, {v}, {zero}"));
            }
            BinaryOp::Max => self.ins(format!("max.{it} {v}, {x}, {y}")),
            BinaryOp::Min => self.ins(format!("min.{it} {v}, {x}, {y}")),
            BinaryOp::And => self.ins(format!("and.b32 {v}, {x}, {y}")),
            BinaryOp::Or => self.ins(format!("or.b32 {v}, {x}, {y}")),
            BinaryOp::Xor => self.ins(format!("xor.b32 {v}, {x}, {y}")),
            BinaryOp::Shl | BinaryOp::Shr => {
                let s = self.r();
                self.ins(format!("and.b32 {s}, {y}, 31"));
                if op == BinaryOp::Shl {
                    self.ins(format!("shl.b32 {v}, {x}, {s}"))
                } else {
                    self.ins(format!("shr.{it} {v}, {x}, {s}"))
                }
            }
            BinaryOp::Pow => self.maths(&v, libm::pow, &[x, y]),
        }
        v
    }

    fn compare(&mut self, op: CmpOp, d: DType, x: &str, y: &str) -> String {
        let (p, v) = (self.p(), self.r());
        let ty = match d {
            d if d.is_float() => "f32",
            DType::I32 => "s32",
            _ => "u32",
        };
        // Float `ne` is unordered (true for NaN), the others ordered, as in IEEE and Rust.
        let cmp = match (op, d.is_float()) {
            (CmpOp::Ne, true) => "neu",
            (CmpOp::Eq, _) => "eq",
            (CmpOp::Ne, _) => "ne",
            (CmpOp::Lt, _) => "lt",
            (CmpOp::Le, _) => "le",
            (CmpOp::Gt, _) => "gt",
            (CmpOp::Ge, _) => "ge",
        };
        self.ins(format!("setp.{cmp}.{ty} {p}, {x}, {y}"));
        self.ins(format!("selp.u32 {v}, 1, 0, {p}"));
        v
    }

    fn cast(&mut self, from: DType, to: DType, x: &str) -> String {
        let v = self.cast32(if from.is_float() { DType::F32 } else { from }, if to.is_float() { DType::F32 } else { to }, x);
        self.round16(to, &v);
        v
    }

    /// `bitcast` between the 16-bit floats: through their bits.
    fn bitcast16(&mut self, from: DType, to: DType, x: &str) -> String {
        let (v, h) = (self.r(), self.h());
        self.ins(format!("cvt.rn.{}.f32 {h}, {x}", half_ty(from)));
        self.ins(format!("cvt.f32.{} {v}, {h}", half_ty(to)));
        v
    }

    fn cast32(&mut self, from: DType, to: DType, x: &str) -> String {
        let v = self.r();
        match (from, to) {
            (a, b) if a == b => self.ins(format!("mov.b32 {v}, {x}")),
            (DType::F32, DType::I32) => self.ins(format!("cvt.rzi.s32.f32 {v}, {x}")),
            (DType::F32, DType::U32) => self.ins(format!("cvt.rzi.u32.f32 {v}, {x}")),
            (DType::F32, DType::Bool) => {
                let p = self.p();
                self.ins(format!("setp.neu.f32 {p}, {x}, {}", f32_imm(0.0)));
                self.ins(format!("selp.u32 {v}, 1, 0, {p}"));
            }
            (DType::I32, DType::F32) => self.ins(format!("cvt.rn.f32.s32 {v}, {x}")),
            (DType::U32 | DType::Bool, DType::F32) => self.ins(format!("cvt.rn.f32.u32 {v}, {x}")),
            (_, DType::Bool) => {
                let p = self.p();
                self.ins(format!("setp.ne.u32 {p}, {x}, 0"));
                self.ins(format!("selp.u32 {v}, 1, 0, {p}"));
            }
            _ => self.ins(format!("mov.b32 {v}, {x}")),
        }
        v
    }
}

/// The operands and shape of one `dot`: `dst[m, n] = a[m, k] b[k, n]`.
struct Dot<'a> {
    a: &'a str,
    b: &'a str,
    ta: bool,
    tb: bool,
    dst: &'a str,
    m: usize,
    n: usize,
    k: usize,
    dtype: DType,
}

impl Dot<'_> {
    /// The contraction covered by one `mma.sync`: 8 on `tf32`, 16 on 16-bit floats.
    fn kstep(&self) -> u32 {
        if self.dtype == DType::F32 { 8 } else { 16 }
    }

    /// 8-column tiles across the result.
    fn tiles_n(&self) -> usize {
        self.n.div_ceil(8)
    }
}

#[derive(Clone, Copy)]
enum Access<'a> {
    Load { dst: &'a str, other: Option<Literal> },
    Store { value: &'a Operand },
}
