//! A small emulator for the subset of PTX that tessel's Mosaic GPU backend emits, so that the
//! lowering can be checked against the reference interpreter on machines without a GPU.
//!
//! It is a test tool, not a GPU model: CTAs run one after another; inside a CTA every thread runs
//! until it reaches `bar.sync`, a warp-wide `mma.sync` or `ret`, in thread order or in reverse
//! thread order, so a missing barrier shows up as a difference between the two orders. A barrier
//! (`bar.sync 0` for the whole CTA, `bar.sync id, count` for `count` threads) opens when as many
//! threads as it expects wait at it; a warp's `mma.sync` runs once all 32 lanes reach it. Dynamic
//! shared memory starts filled with a NaN pattern, as a GPU's starts with whatever was there, so
//! a read before a write shows. There are no approximate instructions (`ex2.approx`,
//! `sin.approx`, ...): their error is the hardware's, which an emulator cannot know, so the
//! backend writes its maths from exactly rounded ones and a use of them here is an error.
//! Tensor-core products are summed in `f64` and rounded once; the tests compare within
//! tolerances. An instruction outside the subset is an error naming it, never a
//! silent guess.
//!
//! The `mma` fragment layouts follow the PTX ISA's tables ("Matrix Fragments for mma.m16n8k8" and
//! "... mma.m16n8k16 with floating point type"): they are written here once, as the ISA states
//! them, apart from the backend's emitter.

use std::collections::HashMap;

mod hopper;

use hopper::{Async, Descriptor, Mbarrier, Pending, Wgmma};
pub use hopper::{TensorMap, swizzle};

/// One operand.
#[derive(Clone, Debug)]
enum Arg {
    /// A register: (class, index).
    Reg(usize),
    /// An immediate (bits).
    Imm(u64),
    /// `%tid.x` / `%ctaid.x`.
    Tid,
    Ctaid,
    /// `[%rd]`.
    Mem(usize),
    /// `[param]`.
    Param(usize),
    /// A branch target.
    Label(usize),
    /// The address of the dynamic shared memory (its symbol).
    Shared,
    /// `{%a, %b, ...}`: registers of a vector operand.
    Vec(Vec<usize>),
    /// A tensor-map parameter's address (`mov.b64 %rd, name`).
    TensorMap(usize),
    /// `[%rd, {%r, %r}]`: a tensor map and the coordinates of a tensor copy.
    Tensor(usize, Vec<usize>),
}

/// How an instruction affects scheduling.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Plain,
    /// `bar.sync`: wait for the barrier's threads.
    Bar,
    /// `mma.sync`: wait for the warp's 32 lanes.
    Mma(Mma),
    /// `wgmma.mma_async`: wait for the warpgroup's 128 threads.
    Wgmma(Wgmma),
    /// `mbarrier.try_wait.parity`: wait until the phase of that parity has completed.
    MbarWait,
    Ret,
}

/// The `mma.sync` shapes and types emulated.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mma {
    /// `m16n8k8`, `tf32` inputs.
    Tf32,
    /// `m16n8k16`, `f16` inputs.
    F16,
    /// `m16n8k16`, `bf16` inputs.
    Bf16,
}

#[derive(Clone, Debug)]
struct Instr {
    pred: Option<(usize, bool)>,
    op: String,
    kind: Kind,
    /// The state space a load or store touches, for [`Counts`].
    space: Option<Space>,
    args: Vec<Arg>,
    line: usize,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Space {
    Global,
    Shared,
    /// A tensor copy from global to shared memory.
    Tensor,
}

/// The emulated instructions, by name; `exec` matches on the index.
const OPS: &[&str] = &[
    "mov.u32",
    "mov.b32",
    "ld.param.u64",
    "cvta.to.global.u64",
    "bra",
    "bra.uni",
    "ld.global.b32",
    "st.global.b32",
    "mul.wide.u32",
    "add.u64",
    "add.u32",
    "add.s32",
    "sub.u32",
    "mul.lo.u32",
    "mul.lo.s32",
    "mad.lo.u32",
    "mad.lo.s32",
    "div.u32",
    "rem.u32",
    "div.s32",
    "rem.s32",
    "max.u32",
    "min.u32",
    "max.s32",
    "min.s32",
    "neg.s32",
    "abs.s32",
    "not.b32",
    "and.b32",
    "or.b32",
    "xor.b32",
    "shl.b32",
    "shr.u32",
    "shr.s32",
    "and.pred",
    "or.pred",
    "not.pred",
    "selp.b32",
    "selp.u32",
    "add.rn.f32",
    "sub.rn.f32",
    "mul.rn.f32",
    "div.rn.f32",
    "max.NaN.f32",
    "min.NaN.f32",
    "neg.f32",
    "abs.f32",
    "sqrt.rn.f32",
    "rcp.rn.f32",
    "fma.rn.f32",
    "cvt.rni.f32.f32",
    "mul.hi.u32",
    "clz.b32",
    "xor.pred",
    "copysign.f32",
    "cvt.rmi.f32.f32",
    "cvt.rpi.f32.f32",
    "cvt.rzi.f32.f32",
    "cvt.rzi.s32.f32",
    "cvt.rzi.u32.f32",
    "cvt.rn.f32.s32",
    "cvt.rn.f32.u32",
    "cvt.u16.u32",
    "cvt.u32.u16",
    "cvt.f32.f16",
    "cvt.f32.bf16",
    "cvt.rn.f16.f32",
    "cvt.rn.bf16.f32",
    "bar.sync",
    "ret",
    "mov.u64",
    "ld.shared.b32",
    "st.shared.b32",
    "cvt.rna.tf32.f32",
    "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32",
    "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
    "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
    "ld.global.u16",
    "st.global.u16",
    "st.global.b16",
    "ld.global.v2.b32",
    "st.global.v2.b32",
    "cvt.u64.u32",
    "or.b64",
    "mov.b64",
    "cvta.param.u64",
    "mbarrier.init.shared::cta.b64",
    "mbarrier.arrive.expect_tx.shared::cta.b64",
    "mbarrier.try_wait.parity.shared::cta.b64",
    "fence.mbarrier_init.release.cluster",
    "fence.proxy.async.shared::cta",
    "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes",
    "wgmma.fence.sync.aligned",
    "wgmma.commit_group.sync.aligned",
    "wgmma.wait_group.sync.aligned",
];

/// A parsed kernel.
pub struct Module {
    /// Entry name.
    pub entry: String,
    /// Names of the `.u64` parameters in order.
    pub params: Vec<String>,
    /// Names of the tensor-map parameters (`.param .align 64 .b8 NAME[128]`) in order.
    pub tensor_maps: Vec<String>,
    code: Vec<Instr>,
    registers: usize,
    /// The name of the `.extern .shared` array, if any.
    shared: Option<String>,
}

/// Splits operands at the commas outside `{...}` and `[...]`.
fn operands(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in s.char_indices() {
        match c {
            '{' | '[' => depth += 1,
            '}' | ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(s[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(s[start..].trim());
    out.into_iter().filter(|a| !a.is_empty()).collect()
}

fn parse_imm(s: &str) -> Option<u64> {
    if let Some(hex) = s.strip_prefix("0f") {
        return u32::from_str_radix(hex, 16).ok().map(u64::from);
    }
    if let Some(hex) = s.strip_prefix("0x") {
        return u64::from_str_radix(hex, 16).ok();
    }
    s.parse::<i64>().ok().map(|v| v as u64)
}

/// Parses the PTX text of one entry.
pub fn parse(ptx: &str) -> Result<Module, String> {
    let mut regs: HashMap<String, usize> = HashMap::new();
    let mut labels: HashMap<String, usize> = HashMap::new();
    let mut params = Vec::new();
    let mut tensor_maps: Vec<String> = Vec::new();
    let mut entry = String::new();
    let mut shared = None;
    let mut raw: Vec<(usize, String)> = Vec::new();
    for (n, line) in ptx.lines().enumerate() {
        let line = line.split("//").next().unwrap_or("").trim();
        if line.is_empty()
            || line.starts_with(".version")
            || line.starts_with(".target")
            || line.starts_with(".address_size")
            || line.starts_with(".maxntid")
            || line.starts_with(".reg")
            || line == "{"
            || line == "}"
            || line == ")"
        {
            continue;
        }
        if let Some(rest) = line.strip_prefix(".extern .shared .align ") {
            let name = rest.split_whitespace().last().unwrap_or_default();
            shared = Some(name.trim_end_matches(';').trim_end_matches("[]").to_string());
            continue;
        }
        if let Some(rest) = line.strip_prefix(".param .align 64 .b8 ") {
            let name = rest.trim_end_matches(',').strip_suffix("[128]").ok_or(format!("line {}: {line}", n + 1))?;
            tensor_maps.push(name.to_string());
            continue;
        }
        if let Some(rest) = line.strip_prefix(".visible .entry ") {
            entry = rest.trim_end_matches('(').to_string();
            continue;
        }
        if let Some(rest) = line.strip_prefix(".param .u64 ") {
            params.push(rest.trim_end_matches(',').to_string());
            continue;
        }
        if let Some(l) = line.strip_suffix(':') {
            labels.insert(l.to_string(), raw.len());
            continue;
        }
        raw.push((n + 1, line.trim_end_matches(';').to_string()));
    }
    let mut reg = |name: &str| {
        let next = regs.len();
        *regs.entry(name.to_string()).or_insert(next)
    };
    let mut code = Vec::new();
    for (line, text) in raw {
        let (pred, rest) = match text.strip_prefix('@') {
            Some(r) => {
                let (p, rest) = r.split_once(' ').ok_or(format!("line {line}: bad predicate"))?;
                let (neg, p) = match p.strip_prefix('!') {
                    Some(p) => (true, p),
                    None => (false, p),
                };
                (Some((reg(p), neg)), rest.trim())
            }
            None => (None, text.as_str()),
        };
        let (op, operands) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
        let mut args = Vec::new();
        for a in self::operands(operands) {
            args.push(if a == "%tid.x" {
                Arg::Tid
            } else if a == "%ctaid.x" {
                Arg::Ctaid
            } else if let Some(inner) = a.strip_prefix('[').and_then(|a| a.strip_suffix(']')) {
                if let Some((map, coords)) = inner.split_once(',') {
                    let coords = coords.trim().strip_prefix('{').and_then(|c| c.strip_suffix('}'));
                    let coords = coords.ok_or(format!("line {line}: cannot read operand `{a}` of `{op}`"))?;
                    Arg::Tensor(reg(map.trim()), coords.split(',').map(|r| reg(r.trim())).collect())
                } else if inner.starts_with('%') {
                    Arg::Mem(reg(inner))
                } else {
                    Arg::Param(params.iter().position(|p| p == inner).ok_or(format!("line {line}: unknown param {inner}"))?)
                }
            } else if let Some(inner) = a.strip_prefix('{').and_then(|a| a.strip_suffix('}')) {
                Arg::Vec(inner.split(',').map(|r| reg(r.trim())).collect())
            } else if Some(a) == shared.as_deref() {
                Arg::Shared
            } else if let Some(i) = tensor_maps.iter().position(|t| t == a) {
                Arg::TensorMap(i)
            } else if a.starts_with('%') {
                Arg::Reg(reg(a))
            } else if let Some(v) = parse_imm(a) {
                Arg::Imm(v)
            } else if op.starts_with("bra") {
                Arg::Label(*labels.get(a).ok_or(format!("line {line}: unknown label {a}"))?)
            } else {
                return Err(format!("line {line}: cannot read operand `{a}` of `{op}`"));
            });
        }
        let wgmma = Wgmma::parse(op);
        if !OPS.contains(&op) && !op.starts_with("setp.") && wgmma.is_none() {
            return Err(format!("line {line}: `{op}` is not in the emulated subset"));
        }
        if let Some(w) = wgmma {
            let ok = matches!(&args[..], [Arg::Vec(d), Arg::Reg(_), Arg::Reg(_), Arg::Reg(_), Arg::Imm(_), Arg::Imm(_), Arg::Imm(_), Arg::Imm(_)] if d.len() == w.n as usize / 2);
            if !ok {
                return Err(format!(
                    "line {line}: `{op}` takes {{{} registers}}, two descriptors, scale-d and four immediates",
                    w.n / 2
                ));
            }
        }
        let kind = match op {
            "bar.sync" => Kind::Bar,
            "ret" => Kind::Ret,
            "mbarrier.try_wait.parity.shared::cta.b64" => Kind::MbarWait,
            _ if wgmma.is_some() => Kind::Wgmma(wgmma.expect("parsed")),
            "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" => Kind::Mma(Mma::Tf32),
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" => Kind::Mma(Mma::F16),
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" => Kind::Mma(Mma::Bf16),
            _ => Kind::Plain,
        };
        if let Kind::Mma(_) = kind {
            let want = [4, 4, 2, 4];
            let got: Vec<usize> = args.iter().map(|a| if let Arg::Vec(v) = a { v.len() } else { 0 }).collect();
            if got != want {
                return Err(format!("line {line}: `{op}` takes vectors of {want:?} registers, got {got:?}"));
            }
        }
        let space = match op.split('.').take(2).collect::<Vec<_>>()[..] {
            ["cp", "async"] => Some(Space::Tensor),
            ["ld" | "st", "global"] => Some(Space::Global),
            ["ld" | "st", "shared"] => Some(Space::Shared),
            _ => None,
        };
        code.push(Instr { pred, op: op.to_string(), kind, space, args, line });
    }
    let registers = regs.len();
    Ok(Module { entry, params, tensor_maps, code, registers, shared })
}

/// The bytes of one state space: global memory (one growing array, addresses from 4096) or a
/// CTA's dynamic shared memory (addresses from 0).
pub struct Memory {
    bytes: Vec<u8>,
    base: u64,
    space: &'static str,
}

impl Default for Memory {
    fn default() -> Memory {
        Memory { bytes: Vec::new(), base: 4096, space: "global" }
    }
}

/// Shared memory starts as this word (a NaN), not as zeros.
const POISON: u32 = 0x7FBA_DBAD;

impl Memory {
    /// A CTA's dynamic shared memory of `len` bytes, filled with [`POISON`].
    fn shared(len: usize) -> Memory {
        let mut bytes = POISON.to_le_bytes().repeat(len.div_ceil(4));
        bytes.truncate(len);
        Memory { bytes, base: 0, space: "dynamic shared" }
    }

    /// Allocates `len` zeroed bytes (16-aligned) and returns the address.
    pub fn alloc(&mut self, len: usize) -> u64 {
        let at = self.bytes.len().div_ceil(16) * 16;
        self.bytes.resize(at + len.max(16), 0);
        self.base + at as u64
    }

    /// Writes 32-bit words at `addr`.
    pub fn write_words(&mut self, addr: u64, words: &[u32]) {
        for (i, w) in words.iter().enumerate() {
            self.store(addr + 4 * i as u64, *w).expect("in bounds");
        }
    }

    /// Reads `n` 32-bit words at `addr`.
    pub fn read_words(&self, addr: u64, n: usize) -> Vec<u32> {
        (0..n).map(|i| self.load(addr + 4 * i as u64).expect("in bounds")).collect()
    }

    /// Writes 16-bit halves at `addr`.
    pub fn write_halves(&mut self, addr: u64, halves: &[u16]) {
        for (i, h) in halves.iter().enumerate() {
            self.store_n(addr + 2 * i as u64, 2, u32::from(*h)).expect("in bounds");
        }
    }

    /// Reads `n` 16-bit halves at `addr`.
    pub fn read_halves(&self, addr: u64, n: usize) -> Vec<u16> {
        (0..n).map(|i| self.load_n(addr + 2 * i as u64, 2).expect("in bounds") as u16).collect()
    }

    fn index(&self, addr: u64, size: usize) -> Result<usize, String> {
        let space = self.space;
        let i = addr.checked_sub(self.base).ok_or(format!("{space} access below its memory at {addr:#x}"))?;
        let i = usize::try_from(i).map_err(|_| format!("{space} access at {addr:#x}"))?;
        if i + size > self.bytes.len() {
            return Err(format!("{space} access at {addr:#x}, past the {} bytes of {space} memory", self.bytes.len()));
        }
        if !i.is_multiple_of(size) {
            return Err(format!("misaligned {space} access at {addr:#x}"));
        }
        Ok(i)
    }

    fn load(&self, addr: u64) -> Result<u32, String> {
        self.load_n(addr, 4)
    }

    fn store(&mut self, addr: u64, v: u32) -> Result<(), String> {
        self.store_n(addr, 4, v)
    }

    /// `size` (1, 2 or 4) little-endian bytes at `addr`.
    fn load_n(&self, addr: u64, size: usize) -> Result<u32, String> {
        let i = self.index(addr, size)?;
        Ok(self.bytes[i..i + size].iter().rev().fold(0, |acc, b| (acc << 8) | u32::from(*b)))
    }

    fn store_n(&mut self, addr: u64, size: usize, v: u32) -> Result<(), String> {
        let i = self.index(addr, size)?;
        self.bytes[i..i + size].copy_from_slice(&v.to_le_bytes()[..size]);
        Ok(())
    }
}

/// Why a thread is not running.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Wait {
    /// Runs.
    No,
    /// At barrier `id`, which opens for `count` threads.
    Bar { id: u64, count: u64 },
    /// At the `mma.sync` at this pc, for the warp.
    Mma(usize),
    /// At the `wgmma.mma_async` at this pc, for the warpgroup.
    Wgmma(usize),
    /// At an `mbarrier.try_wait.parity` on the barrier at this address for the phase of this parity.
    Mbar { addr: u64, parity: u32 },
    /// Ended.
    Done,
}

struct Thread {
    regs: Vec<u64>,
    pc: usize,
    wait: Wait,
    /// `wgmma` results not yet retired.
    pending: Pending,
}

fn f(v: u64) -> f32 {
    f32::from_bits(v as u32)
}

fn b(v: f32) -> u64 {
    u64::from(v.to_bits())
}

/// What a launch executed, summed over its threads (predicated-off instructions not counted):
/// a cost model of the PTX, not a timing.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Counts {
    /// Instructions executed, `mma.sync` and `bar.sync` included.
    pub instructions: u64,
    /// `ld.global` and `st.global`.
    pub global: u64,
    /// `ld.shared` and `st.shared`.
    pub shared: u64,
    /// Barriers opened (one per barrier, however many threads wait at it).
    pub barriers: u64,
    /// Warp-wide `mma.sync`s.
    pub mma: u64,
    /// Warpgroup-wide `wgmma.mma_async`s.
    pub wgmma: u64,
    /// Bytes brought into shared memory by tensor copies (`cp.async.bulk.tensor`).
    pub tensor_bytes: u64,
}

impl std::ops::AddAssign for Counts {
    fn add_assign(&mut self, c: Counts) {
        self.instructions += c.instructions;
        self.global += c.global;
        self.shared += c.shared;
        self.barriers += c.barriers;
        self.mma += c.mma;
        self.wgmma += c.wgmma;
        self.tensor_bytes += c.tensor_bytes;
    }
}

/// The state one CTA's threads share.
struct Cta<'m> {
    mem: &'m mut Memory,
    shared: Memory,
    params: &'m [u64],
    tensor_maps: &'m [TensorMap],
    id: u32,
    counts: Counts,
    /// Its mbarriers and tensor copies in flight.
    asynchronous: Async,
}

/// A tensor-map parameter's address as the emulator hands it out: a tag and the parameter's index.
const TENSOR_MAP_TAG: u64 = 0x7E45_0000_0000_0000;

impl Cta<'_> {
    /// Lands the tensor copies in flight on the mbarrier at `addr` (a thread waits on it), then
    /// whether the phase of `parity` has completed.
    fn phase_done(&mut self, addr: u64, parity: u32) -> Result<bool, String> {
        let (mine, rest): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.asynchronous.copies).into_iter().partition(|c| c.bar == addr);
        self.asynchronous.copies = rest;
        let bar = self
            .asynchronous
            .barriers
            .get_mut(&addr)
            .ok_or(format!("wait on shared address {addr:#x}, which holds no mbarrier"))?;
        for copy in mine {
            for (at, v) in &copy.writes {
                self.shared.store_n(*at, 1, u32::from(*v))?;
            }
            bar.tx -= copy.writes.len() as i64;
            bar.settle();
        }
        Ok(bar.phase % 2 != parity % 2)
    }
}

impl Module {
    /// Runs one thread until it waits or ends.
    fn step(&self, th: &mut Thread, tid: u32, cta: &mut Cta<'_>, steps: &mut u64) -> Result<(), String> {
        while th.wait == Wait::No {
            *steps += 1;
            if *steps > 4_000_000_000 {
                return Err("the kernel runs too long (an endless loop?)".into());
            }
            let ins = self.code.get(th.pc).ok_or("ran off the end of the code")?;
            if let Some((p, neg)) = ins.pred
                && (th.regs[p] != 0) == neg
            {
                th.pc += 1;
                continue;
            }
            cta.counts.instructions += 1;
            match ins.space {
                Some(Space::Global) => cta.counts.global += 1,
                Some(Space::Shared) => cta.counts.shared += 1,
                Some(Space::Tensor) | None => {}
            }
            match ins.kind {
                Kind::Ret => th.wait = Wait::Done,
                Kind::Mma(_) => th.wait = Wait::Mma(th.pc),
                Kind::Wgmma(_) => th.wait = Wait::Wgmma(th.pc),
                Kind::MbarWait => {
                    let (Some(Arg::Reg(p)), Some(Arg::Mem(a)), Some(parity)) =
                        (ins.args.first(), ins.args.get(1), ins.args.get(2))
                    else {
                        return Err(format!("line {}: mbarrier.try_wait.parity takes a predicate, [address], parity", ins.line));
                    };
                    let parity = match parity {
                        Arg::Imm(v) => *v as u32,
                        Arg::Reg(r) => th.regs[*r] as u32,
                        _ => return Err(format!("line {}: the parity is a register or an immediate", ins.line)),
                    };
                    let addr = th.regs[*a] & 0xFFFF_FFFF;
                    if cta.phase_done(addr, parity).map_err(|e| format!("line {}: {e}", ins.line))? {
                        th.regs[*p] = 1;
                        th.pc += 1;
                    } else {
                        th.wait = Wait::Mbar { addr, parity };
                    }
                }
                Kind::Bar => {
                    th.pc += 1;
                    let val = |a: Option<&Arg>| match a {
                        Some(Arg::Imm(v)) => Some(*v),
                        Some(Arg::Reg(r)) => Some(th.regs[*r] & 0xFFFF_FFFF),
                        _ => None,
                    };
                    let id = val(ins.args.first()).ok_or(format!("line {}: bar.sync needs a barrier", ins.line))?;
                    // Without a count, the barrier waits for every thread of the CTA.
                    th.wait = Wait::Bar { id, count: val(ins.args.get(1)).unwrap_or(0) };
                }
                Kind::Plain => {
                    th.pc += 1;
                    exec(ins, th, cta, tid).map_err(|e| format!("line {} `{}`: {e}", ins.line, ins.op))?;
                }
            }
        }
        Ok(())
    }

    fn run_cta(&self, cta: &mut Cta<'_>, block: u32, reverse: bool) -> Result<(), String> {
        let mut threads: Vec<Thread> = (0..block)
            .map(|_| Thread { regs: vec![0; self.registers], pc: 0, wait: Wait::No, pending: Pending::default() })
            .collect();
        let order: Vec<u32> = if reverse { (0..block).rev().collect() } else { (0..block).collect() };
        let mut steps: u64 = 0;
        loop {
            for &t in &order {
                self.step(&mut threads[t as usize], t, cta, &mut steps)?;
            }
            if threads.iter().all(|t| t.wait == Wait::Done) {
                return Ok(());
            }
            let mut moved = false;
            // Warps whose 32 lanes all wait at the same `mma.sync`.
            for warp in threads.chunks_mut(32) {
                let Wait::Mma(pc) = warp[0].wait else { continue };
                if warp.len() == 32 && warp.iter().all(|t| t.wait == Wait::Mma(pc)) {
                    let ins = &self.code[pc];
                    let Kind::Mma(kind) = ins.kind else { unreachable!("waits at an mma") };
                    mma(kind, &ins.args, warp);
                    cta.counts.mma += 1;
                    for t in warp.iter_mut() {
                        t.pc += 1;
                        t.wait = Wait::No;
                    }
                    moved = true;
                }
            }
            // Warpgroups whose 128 threads all wait at the same `wgmma.mma_async`.
            for group in threads.chunks_mut(128) {
                let Wait::Wgmma(pc) = group[0].wait else { continue };
                if group.len() == 128 && group.iter().all(|t| t.wait == Wait::Wgmma(pc)) {
                    let ins = &self.code[pc];
                    wgmma(ins, group, &cta.shared).map_err(|e| format!("line {} `{}`: {e}", ins.line, ins.op))?;
                    cta.counts.wgmma += 1;
                    for t in group.iter_mut() {
                        t.pc += 1;
                        t.wait = Wait::No;
                    }
                    moved = true;
                }
            }
            // Threads waiting on an mbarrier whose phase has completed.
            for th in threads.iter_mut() {
                let Wait::Mbar { addr, parity } = th.wait else { continue };
                if cta.phase_done(addr, parity)? {
                    let Some(Arg::Reg(p)) = self.code[th.pc].args.first() else { unreachable!("parse checks") };
                    th.regs[*p] = 1;
                    th.pc += 1;
                    th.wait = Wait::No;
                    moved = true;
                }
            }
            // Barriers with all their threads.
            let mut ids: Vec<u64> =
                threads.iter().filter_map(|t| if let Wait::Bar { id, .. } = t.wait { Some(id) } else { None }).collect();
            ids.sort_unstable();
            ids.dedup();
            for id in ids {
                let at: Vec<usize> =
                    (0..threads.len()).filter(|&i| matches!(threads[i].wait, Wait::Bar { id: j, .. } if j == id)).collect();
                let counts: Vec<u64> = at
                    .iter()
                    .map(|&i| match threads[i].wait {
                        Wait::Bar { count: 0, .. } => u64::from(block),
                        Wait::Bar { count, .. } => count,
                        _ => unreachable!("waits at a barrier"),
                    })
                    .collect();
                if counts.iter().any(|c| *c != counts[0]) {
                    return Err(format!("threads wait at barrier {id} expecting different thread counts {counts:?}"));
                }
                let n = at.len() as u64;
                if n > counts[0] {
                    return Err(format!("{n} threads wait at barrier {id}, which expects {}", counts[0]));
                }
                if n == counts[0] {
                    let pcs: Vec<usize> = at.iter().map(|&i| threads[i].pc).collect();
                    if pcs.iter().any(|p| *p != pcs[0]) {
                        return Err(format!("threads meet at barrier {id} from different places in the code"));
                    }
                    for i in at {
                        threads[i].wait = Wait::No;
                    }
                    cta.counts.barriers += 1;
                    moved = true;
                }
            }
            if !moved {
                let done = threads.iter().filter(|t| t.wait == Wait::Done).count();
                let waits: Vec<String> = threads
                    .iter()
                    .enumerate()
                    .filter(|(_, t)| t.wait != Wait::Done)
                    .take(4)
                    .map(|(i, t)| format!("thread {i}: {:?} at line {}", t.wait, self.code.get(t.pc).map_or(0, |c| c.line)))
                    .collect();
                return Err(format!("deadlock: {done} threads ended, the others wait ({})", waits.join("; ")));
            }
        }
    }

    /// Runs the entry over `grid` CTAs of `block` threads with the parameter values `params` and
    /// `shared` bytes of dynamic shared memory per CTA; what it executed.
    pub fn launch(
        &self,
        mem: &mut Memory,
        params: &[u64],
        grid: u32,
        block: u32,
        shared: usize,
        reverse: bool,
    ) -> Result<Counts, String> {
        self.launch_with_maps(mem, params, &[], grid, block, shared, reverse)
    }

    /// [`Module::launch`] with the tensor maps of the entry's tensor-map parameters, in order.
    #[allow(clippy::too_many_arguments, reason = "a launch's configuration")]
    pub fn launch_with_maps(
        &self,
        mem: &mut Memory,
        params: &[u64],
        tensor_maps: &[TensorMap],
        grid: u32,
        block: u32,
        shared: usize,
        reverse: bool,
    ) -> Result<Counts, String> {
        if params.len() != self.params.len() {
            return Err(format!("{} takes {} parameters, got {}", self.entry, self.params.len(), params.len()));
        }
        if tensor_maps.len() != self.tensor_maps.len() {
            return Err(format!("{} takes {} tensor maps, got {}", self.entry, self.tensor_maps.len(), tensor_maps.len()));
        }
        if self.shared.is_some() && shared == 0 {
            return Err(format!("{} uses dynamic shared memory, but the launch gives it none", self.entry));
        }
        let mut counts = Counts::default();
        for id in 0..grid {
            let mut cta = Cta {
                mem,
                shared: Memory::shared(shared),
                params,
                tensor_maps,
                id,
                counts: Counts::default(),
                asynchronous: Async::default(),
            };
            self.run_cta(&mut cta, block, reverse)?;
            if !cta.asynchronous.copies.is_empty() {
                return Err(format!("CTA {id} ended with {} tensor copies nobody waited for", cta.asynchronous.copies.len()));
            }
            counts += cta.counts;
        }
        Ok(counts)
    }
}

/// Rounds an `f32` to `tf32` (10 fraction bits), to nearest with ties away from zero.
fn tf32_rna(bits: u32) -> u32 {
    if bits & 0x7F80_0000 == 0x7F80_0000 {
        return if bits & 0x007F_FFFF != 0 { 0x7FFF_FFFF } else { bits };
    }
    bits.wrapping_add(0x1000) & 0xFFFF_E000
}

/// One warp's `mma.sync`: D = A B + C for a 16x8 tile, with the fragments of the PTX ISA's tables
/// (`g` = lane >> 2, `t` = lane % 4).
fn mma(kind: Mma, args: &[Arg], warp: &mut [Thread]) {
    let regs = |i: usize| match &args[i] {
        Arg::Vec(v) => v.clone(),
        _ => unreachable!("parse checks the vectors"),
    };
    let (d, ra, rb, rc) = (regs(0), regs(1), regs(2), regs(3));
    let k = if kind == Mma::Tf32 { 8 } else { 16 };
    let mut a = [[0f64; 16]; 16];
    let mut bm = [[0f64; 8]; 16];
    let mut c = [[0f64; 8]; 16];
    let half = |bits: u64| match kind {
        Mma::Bf16 => f64::from(half::bf16::from_bits(bits as u16).to_f32()),
        _ => f64::from(half::f16::from_bits(bits as u16).to_f32()),
    };
    for (lane, th) in warp.iter().enumerate() {
        let (g, t) = (lane / 4, lane % 4);
        match kind {
            Mma::Tf32 => {
                // A: a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4); B: b0 (t, g), b1 (t+4, g).
                for i in 0..4 {
                    let v = f64::from(f32::from_bits(th.regs[ra[i]] as u32 & 0xFFFF_E000));
                    a[g + 8 * (i % 2)][t + 4 * (i / 2)] = v;
                }
                for i in 0..2 {
                    bm[t + 4 * i][g] = f64::from(f32::from_bits(th.regs[rb[i]] as u32 & 0xFFFF_E000));
                }
            }
            Mma::F16 | Mma::Bf16 => {
                // A: a_i, two to a register (low half first): row g (+8 for i = 2, 3, 6, 7),
                // column 2t + i%2 (+8 for i >= 4). B: b_i at row 2t + i%2 (+8 for i >= 2), column g.
                for i in 0..8 {
                    let v = half(th.regs[ra[i / 2]] >> (16 * (i % 2)));
                    a[g + 8 * ((i / 2) % 2)][2 * t + i % 2 + 8 * (i / 4)] = v;
                }
                for i in 0..4 {
                    bm[2 * t + i % 2 + 8 * (i / 2)][g] = half(th.regs[rb[i / 2]] >> (16 * (i % 2)));
                }
            }
        }
        // C and D: c_i at row g (+8 for i >= 2), column 2t + i%2.
        for i in 0..4 {
            c[g + 8 * (i / 2)][2 * t + i % 2] = f64::from(f(th.regs[rc[i]]));
        }
    }
    let mut out = [[0f32; 8]; 16];
    for (r, row) in out.iter_mut().enumerate() {
        for (col, o) in row.iter_mut().enumerate() {
            *o = ((0..k).map(|p| a[r][p] * bm[p][col]).sum::<f64>() + c[r][col]) as f32;
        }
    }
    for (lane, th) in warp.iter_mut().enumerate() {
        let (g, t) = (lane / 4, lane % 4);
        for i in 0..4 {
            th.regs[d[i]] = b(out[g + 8 * (i / 2)][2 * t + i % 2]);
        }
    }
}

/// One warpgroup's `wgmma.mma_async`: descriptors, scale-d and immediates are the same in every
/// thread (the instruction is `.aligned`). The accumulator it reads is what the registers will
/// hold once the `wgmma`s before it retire; what it writes waits in each thread's [`Pending`].
fn wgmma(ins: &Instr, group: &mut [Thread], shared: &Memory) -> Result<(), String> {
    let Kind::Wgmma(w) = ins.kind else { unreachable!("waits at a wgmma") };
    let [Arg::Vec(d), Arg::Reg(da), Arg::Reg(db), Arg::Reg(scale), Arg::Imm(sa), Arg::Imm(sb), Arg::Imm(ta), Arg::Imm(tb)] =
        &ins.args[..]
    else {
        unreachable!("parse checks the operands")
    };
    let uniform = |r: usize| {
        let v = group[0].regs[r];
        if group.iter().all(|t| t.regs[r] == v) {
            Ok(v)
        } else {
            Err("the warpgroup's threads give different operands".to_string())
        }
    };
    let (a, b) = (Descriptor::decode(uniform(*da)?)?, Descriptor::decode(uniform(*db)?)?);
    let accumulate = uniform(*scale)? != 0;
    let negate = |v: u64| match v as i64 {
        1 => Ok(false),
        -1 => Ok(true),
        _ => Err(format!("scale {} is not 1 or -1", v as i64)),
    };
    let mut acc: Vec<Vec<u64>> =
        group.iter().map(|t| d.iter().map(|&r| t.pending.latest(r).unwrap_or(t.regs[r])).collect()).collect();
    w.run(a, b, (negate(*sa)?, negate(*sb)?), (*ta != 0, *tb != 0), accumulate, &mut acc, |at| {
        shared.load_n(at, 2).map(|v| v as u16)
    })?;
    for (t, values) in group.iter_mut().zip(acc) {
        t.pending.open.extend(d.iter().copied().zip(values));
    }
    Ok(())
}

fn exec(ins: &Instr, th: &mut Thread, cta: &mut Cta<'_>, tid: u32) -> Result<(), String> {
    let (params, id) = (cta.params, cta.id);
    let val = |a: &Arg, th: &Thread| -> u64 {
        match a {
            Arg::Reg(r) => th.regs[*r],
            Arg::Imm(v) => *v,
            Arg::Tid => u64::from(tid),
            Arg::Ctaid => u64::from(id),
            Arg::Param(p) => params[*p],
            Arg::Mem(r) => th.regs[*r],
            Arg::Label(l) => *l as u64,
            // The shared window's first byte.
            Arg::Shared => 0,
            // `{lo, hi}`: 16-bit halves packed into 32 bits, the first in the low half.
            Arg::Vec(v) => v.iter().rev().fold(0, |acc, r| (acc << 16) | (th.regs[*r] & 0xFFFF)),
            Arg::TensorMap(i) => TENSOR_MAP_TAG | *i as u64,
            Arg::Tensor(r, _) => th.regs[*r],
        }
    };
    let a = &ins.args;
    let dst = match a.first() {
        Some(Arg::Reg(r)) => Some(*r),
        _ => None,
    };
    let x = |i: usize, th: &Thread| val(&a[i], th);
    let (u, s) = (|v: u64| v as u32, |v: u64| v as u32 as i32);
    let op = ins.op.as_str();
    let out: u64 = match op {
        "mov.u32" | "mov.b32" => x(1, th) & 0xFFFF_FFFF,
        "ld.param.u64" | "cvta.to.global.u64" | "mov.u64" => x(1, th),
        "ld.shared.b32" => u64::from(cta.shared.load(x(1, th))?),
        "st.shared.b32" => {
            cta.shared.store(x(0, th), u(x(1, th)))?;
            return Ok(());
        }
        "cvt.rna.tf32.f32" => u64::from(tf32_rna(u(x(1, th)))),
        "bra" | "bra.uni" => {
            th.pc = x(0, th) as usize;
            return Ok(());
        }
        "ld.global.b32" => u64::from(cta.mem.load(x(1, th))?),
        "ld.global.u16" => u64::from(cta.mem.load_n(x(1, th), 2)?),
        // Two 32-bit registers at an 8-byte-aligned address.
        "st.global.v2.b32" => {
            let Arg::Vec(v) = &a[1] else { return Err("takes [address], {a, b}".into()) };
            for (at, r) in vector(x(0, th), v)? {
                cta.mem.store(at, th.regs[*r] as u32)?;
            }
            return Ok(());
        }
        "ld.global.v2.b32" => {
            let Arg::Vec(v) = &a[0] else { return Err("takes {a, b}, [address]".into()) };
            for (at, r) in vector(x(1, th), v)? {
                th.regs[*r] = u64::from(cta.mem.load(at)?);
            }
            return Ok(());
        }
        "st.global.u16" | "st.global.b16" => {
            cta.mem.store_n(x(0, th), 2, u(x(1, th)) & 0xFFFF)?;
            return Ok(());
        }
        "cvt.u64.u32" => x(1, th) & 0xFFFF_FFFF,
        "or.b64" => x(1, th) | x(2, th),
        "mov.b64" | "cvta.param.u64" => x(1, th),
        "fence.mbarrier_init.release.cluster" | "fence.proxy.async.shared::cta" | "wgmma.fence.sync.aligned" => return Ok(()),
        "mbarrier.init.shared::cta.b64" => {
            let n = u(x(1, th));
            let bar = Mbarrier { expected: n, pending: n, tx: 0, phase: 0 };
            cta.asynchronous.barriers.insert(x(0, th) & 0xFFFF_FFFF, bar);
            return Ok(());
        }
        "mbarrier.arrive.expect_tx.shared::cta.b64" => {
            let addr = x(1, th) & 0xFFFF_FFFF;
            let bar = cta.asynchronous.barriers.get_mut(&addr).ok_or(format!("arrive on {addr:#x}, which holds no mbarrier"))?;
            bar.tx += i64::from(u(x(2, th)));
            bar.pending = bar.pending.checked_sub(1).ok_or("more arrivals than the mbarrier expects")?;
            bar.settle();
            // The state operand: the phase arrived on.
            u64::from(bar.phase)
        }
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes" => {
            let (Arg::Tensor(map, coords), Arg::Mem(bar)) = (&a[1], &a[2]) else {
                return Err("takes [dst], [tensor map, {x, y}], [mbarrier]".into());
            };
            let handle = th.regs[*map];
            let map = (handle & !0xFFFF == TENSOR_MAP_TAG)
                .then(|| cta.tensor_maps.get((handle & 0xFFFF) as usize))
                .flatten()
                .ok_or(format!("{handle:#x} is not the address of a tensor-map parameter"))?;
            let c = [s(th.regs[coords[0]]).into(), s(th.regs[coords[1]]).into()];
            let dst = x(0, th) & 0xFFFF_FFFF;
            let mem = &*cta.mem;
            let writes = hopper::box_writes(map, dst, c, |at| mem.load_n(at, 1).map(|b| b as u8))?;
            cta.counts.tensor_bytes += writes.len() as u64;
            cta.asynchronous.copies.push(hopper::Copy { bar: th.regs[*bar] & 0xFFFF_FFFF, writes });
            return Ok(());
        }
        "wgmma.commit_group.sync.aligned" => {
            th.pending.commit();
            return Ok(());
        }
        "wgmma.wait_group.sync.aligned" => {
            for (r, v) in th.pending.wait(x(0, th) as usize) {
                th.regs[r] = v;
            }
            return Ok(());
        }
        "st.global.b32" => {
            cta.mem.store(x(0, th), u(x(1, th)))?;
            return Ok(());
        }
        "mul.wide.u32" => u64::from(u(x(1, th))) * u64::from(u(x(2, th))),
        "add.u64" => x(1, th).wrapping_add(x(2, th)),
        "add.u32" | "add.s32" => u64::from(u(x(1, th)).wrapping_add(u(x(2, th)))),
        "sub.u32" => u64::from(u(x(1, th)).wrapping_sub(u(x(2, th)))),
        "mul.lo.u32" | "mul.lo.s32" => u64::from(u(x(1, th)).wrapping_mul(u(x(2, th)))),
        "mad.lo.u32" | "mad.lo.s32" => u64::from(u(x(1, th)).wrapping_mul(u(x(2, th))).wrapping_add(u(x(3, th)))),
        "div.u32" => u64::from(u(x(1, th)).checked_div(u(x(2, th))).unwrap_or(u32::MAX)),
        "rem.u32" => u64::from(u(x(1, th)).checked_rem(u(x(2, th))).unwrap_or(u32::MAX)),
        "div.s32" => u64::from(s(x(1, th)).checked_div(s(x(2, th))).unwrap_or(-1) as u32),
        "rem.s32" => u64::from(s(x(1, th)).checked_rem(s(x(2, th))).unwrap_or(-1) as u32),
        "max.u32" => u64::from(u(x(1, th)).max(u(x(2, th)))),
        "min.u32" => u64::from(u(x(1, th)).min(u(x(2, th)))),
        "max.s32" => u64::from(s(x(1, th)).max(s(x(2, th))) as u32),
        "min.s32" => u64::from(s(x(1, th)).min(s(x(2, th))) as u32),
        "neg.s32" => u64::from(s(x(1, th)).wrapping_neg() as u32),
        "abs.s32" => u64::from(s(x(1, th)).wrapping_abs() as u32),
        "not.b32" => u64::from(!u(x(1, th))),
        "and.b32" => u64::from(u(x(1, th)) & u(x(2, th))),
        "or.b32" => u64::from(u(x(1, th)) | u(x(2, th))),
        "xor.b32" => u64::from(u(x(1, th)) ^ u(x(2, th))),
        "shl.b32" => u64::from(u(x(1, th)).checked_shl(u(x(2, th))).unwrap_or(0)),
        "shr.u32" => u64::from(u(x(1, th)).checked_shr(u(x(2, th))).unwrap_or(0)),
        "shr.s32" => u64::from((s(x(1, th)) >> u(x(2, th)).min(31)) as u32),
        "and.pred" => x(1, th) & x(2, th),
        "or.pred" => x(1, th) | x(2, th),
        "not.pred" => u64::from(x(1, th) == 0),
        "selp.b32" | "selp.u32" => {
            if x(3, th) != 0 {
                x(1, th) & 0xFFFF_FFFF
            } else {
                x(2, th) & 0xFFFF_FFFF
            }
        }
        "add.rn.f32" => b(f(x(1, th)) + f(x(2, th))),
        "sub.rn.f32" => b(f(x(1, th)) - f(x(2, th))),
        "mul.rn.f32" => b(f(x(1, th)) * f(x(2, th))),
        "div.rn.f32" => b(f(x(1, th)) / f(x(2, th))),
        "max.NaN.f32" | "min.NaN.f32" => {
            let (p, q) = (f(x(1, th)), f(x(2, th)));
            b(if p.is_nan() || q.is_nan() {
                f32::NAN
            } else if op == "max.NaN.f32" {
                p.max(q)
            } else {
                p.min(q)
            })
        }
        "neg.f32" => b(-f(x(1, th))),
        "abs.f32" => b(f(x(1, th)).abs()),
        "sqrt.rn.f32" => b(f(x(1, th)).sqrt()),
        "rcp.rn.f32" => b(1.0 / f(x(1, th))),
        "fma.rn.f32" => b(f(x(1, th)).mul_add(f(x(2, th)), f(x(3, th)))),
        "cvt.rni.f32.f32" => b(f(x(1, th)).round_ties_even()),
        "mul.hi.u32" => (u64::from(u(x(1, th))) * u64::from(u(x(2, th)))) >> 32,
        "clz.b32" => u64::from(u(x(1, th)).leading_zeros()),
        "xor.pred" => x(1, th) ^ x(2, th),
        "copysign.f32" => b(f(x(2, th)).copysign(f(x(1, th)))),
        "cvt.rmi.f32.f32" => b(f(x(1, th)).floor()),
        "cvt.rpi.f32.f32" => b(f(x(1, th)).ceil()),
        "cvt.rzi.f32.f32" => b(f(x(1, th)).trunc()),
        "cvt.rzi.s32.f32" => u64::from(f(x(1, th)) as i32 as u32),
        "cvt.rzi.u32.f32" => u64::from(f(x(1, th)) as u32),
        "cvt.rn.f32.s32" => b(s(x(1, th)) as f32),
        "cvt.rn.f32.u32" => b(u(x(1, th)) as f32),
        "cvt.u16.u32" => x(1, th) & 0xFFFF,
        "cvt.u32.u16" => x(1, th) & 0xFFFF,
        "cvt.f32.f16" => b(half::f16::from_bits(x(1, th) as u16).to_f32()),
        "cvt.f32.bf16" => b(half::bf16::from_bits(x(1, th) as u16).to_f32()),
        "cvt.rn.f16.f32" => u64::from(half::f16::from_f32(f(x(1, th))).to_bits()),
        "cvt.rn.bf16.f32" => u64::from(half::bf16::from_f32(f(x(1, th))).to_bits()),
        _ if op.starts_with("setp.") => {
            let parts: Vec<&str> = op.split('.').collect();
            let (cmp, ty) = (parts[1], parts[2]);
            let (p, q) = (x(1, th), x(2, th));
            let r = match ty {
                "f32" => {
                    let (p, q) = (f(p), f(q));
                    match cmp {
                        "eq" => p == q,
                        "neu" => p != q,
                        "lt" => p < q,
                        "le" => p <= q,
                        "gt" => p > q,
                        "ge" => p >= q,
                        _ => return Err(format!("comparison {cmp}")),
                    }
                }
                "s32" => cmp_int(cmp, s(p), s(q))?,
                _ => cmp_int(cmp, u(p), u(q))?,
            };
            u64::from(r)
        }
        _ => return Err("not in the emulated subset".into()),
    };
    let d = dst.ok_or("no destination register")?;
    th.regs[d] = out;
    Ok(())
}

/// The addresses of a vector access's 32-bit elements, each with its register; the access is
/// aligned to its whole size.
fn vector(addr: u64, regs: &[usize]) -> Result<impl Iterator<Item = (u64, &usize)>, String> {
    let size = 4 * regs.len() as u64;
    if !addr.is_multiple_of(size) {
        return Err(format!("misaligned {size}-byte access at {addr:#x}"));
    }
    Ok(regs.iter().enumerate().map(move |(i, r)| (addr + 4 * i as u64, r)))
}

fn cmp_int<T: PartialOrd>(cmp: &str, p: T, q: T) -> Result<bool, String> {
    Ok(match cmp {
        "eq" => p == q,
        "ne" => p != q,
        "lt" => p < q,
        "le" => p <= q,
        "gt" => p > q,
        "ge" => p >= q,
        _ => return Err(format!("comparison {cmp}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry with one `.u64` parameter `out` around `body`.
    fn module(body: &str, shared: bool) -> Module {
        let decl = if shared { ".extern .shared .align 16 .b8 smem[];\n" } else { "" };
        let ptx = format!(
            ".version 8.0\n.target sm_90a\n.address_size 64\n{decl}.visible .entry k(\n\t.param .u64 k_out\n)\n{{\n{body}\n\tret;\n}}\n"
        );
        parse(&ptx).unwrap_or_else(|e| panic!("{e}\n{ptx}"))
    }

    #[test]
    fn an_instruction_outside_the_subset_is_named() {
        // Approximate instructions above all: their error is the hardware's.
        let ptx = ".visible .entry k(\n)\n{\n\tsin.approx.f32 %r1, %r2;\n\tret;\n}\n";
        let err = parse(ptx).err().expect("refused");
        assert!(err.contains("`sin.approx.f32` is not in the emulated subset"), "{err}");
    }

    #[test]
    fn a_barrier_some_threads_skip_is_a_deadlock() {
        let m = module("\tmov.u32 %r1, %tid.x;\n\tsetp.eq.u32 %p1, %r1, 0;\n\t@%p1 bra $L_end;\n\tbar.sync 0;\n$L_end:", false);
        let mut mem = Memory::default();
        let out = mem.alloc(4);
        let err = m.launch(&mut mem, &[out], 1, 64, 0, false).expect_err("thread 0 never arrives");
        assert!(err.contains("deadlock: 1 threads ended"), "{err}");
    }

    #[test]
    fn a_named_barrier_opens_for_its_count() {
        // Two groups of 32 threads, each with its own barrier: thread t writes word t, waits
        // for its group, then reads its neighbour's word in the group.
        let body = "\tmov.u32 %r1, %tid.x;\n\tld.param.u64 %rd1, [k_out];\n\tcvta.to.global.u64 %rd1, %rd1;\n\
                    \tmul.wide.u32 %rd2, %r1, 4;\n\tadd.u64 %rd3, %rd1, %rd2;\n\tst.global.b32 [%rd3], %r1;\n\
                    \tdiv.u32 %r2, %r1, 32;\n\tbar.sync %r2, 32;\n\txor.b32 %r3, %r1, 1;\n\
                    \tmul.wide.u32 %rd4, %r3, 4;\n\tadd.u64 %rd5, %rd1, %rd4;\n\tld.global.b32 %r4, [%rd5];\n\
                    \tadd.u32 %r5, %r1, 64;\n\tmul.wide.u32 %rd6, %r5, 4;\n\tadd.u64 %rd7, %rd1, %rd6;\n\tst.global.b32 [%rd7], %r4;";
        let m = module(body, false);
        for reverse in [false, true] {
            let mut mem = Memory::default();
            let out = mem.alloc(128 * 4);
            let counts = m.launch(&mut mem, &[out], 1, 64, 0, reverse).expect("runs");
            // Two barriers (one a group) opened once each; a store, a load, a store a thread.
            assert_eq!((counts.barriers, counts.global, counts.shared), (2, 64 * 3, 0));
            let words = mem.read_words(out + 64 * 4, 64);
            assert!(words.iter().enumerate().all(|(t, w)| *w == (t as u32 ^ 1)), "{words:?}");
        }
    }

    #[test]
    fn shared_memory_starts_as_a_nan_pattern_and_is_bounded() {
        let body = "\tmov.u64 %rd1, smem;\n\tld.shared.b32 %r1, [%rd1];\n\tld.param.u64 %rd2, [k_out];\n\
                    \tcvta.to.global.u64 %rd2, %rd2;\n\tst.global.b32 [%rd2], %r1;";
        let m = module(body, true);
        let mut mem = Memory::default();
        let out = mem.alloc(4);
        m.launch(&mut mem, &[out], 1, 1, 16, false).expect("runs");
        assert!(f32::from_bits(mem.read_words(out, 1)[0]).is_nan());
        let m = module("\tmov.u64 %rd1, smem;\n\tadd.u64 %rd1, %rd1, 16;\n\tld.shared.b32 %r1, [%rd1];", true);
        let err = m.launch(&mut mem, &[out], 1, 1, 16, false).expect_err("past the end");
        assert!(err.contains("past the 16 bytes of dynamic shared memory"), "{err}");
    }

    /// A warp whose lane registers hold A, B and C of an `m16n8k8` tf32 `mma` as the PTX ISA lays
    /// them out, written here from the ISA's formulas.
    #[test]
    fn mma_tf32_computes_a_16x8_tile() {
        let a = |r: usize, c: usize| (r * 8 + c) as f32 / 16.0 - 3.0;
        let bm = |r: usize, c: usize| (r as f32 - c as f32) / 4.0;
        let cm = |r: usize, c: usize| (r + c) as f32;
        let (d, ra, rb, rc) = ([0, 1, 2, 3], [4, 5, 6, 7], [8, 9], [10, 11, 12, 13]);
        let mut warp: Vec<Thread> = (0..32)
            .map(|lane| {
                let (g, t) = (lane / 4, lane % 4);
                let mut regs = vec![0u64; 14];
                // a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4)
                for (i, (r, c)) in [(g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4)].into_iter().enumerate() {
                    regs[ra[i]] = b(a(r, c));
                }
                // b0 (t, g), b1 (t+4, g)
                regs[rb[0]] = b(bm(t, g));
                regs[rb[1]] = b(bm(t + 4, g));
                // c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1)
                for (i, (r, c)) in [(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)].into_iter().enumerate() {
                    regs[rc[i]] = b(cm(r, c));
                }
                Thread { regs, pc: 0, wait: Wait::No, pending: Pending::default() }
            })
            .collect();
        let args = [Arg::Vec(d.to_vec()), Arg::Vec(ra.to_vec()), Arg::Vec(rb.to_vec()), Arg::Vec(rc.to_vec())];
        mma(Mma::Tf32, &args, &mut warp);
        for (lane, th) in warp.iter().enumerate() {
            let (g, t) = (lane / 4, lane % 4);
            for (i, (r, c)) in [(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)].into_iter().enumerate() {
                // The inputs are exact in tf32 (few significant bits), so the tile is exact.
                let want: f32 = (0..8).map(|p| a(r, p) * bm(p, c)).sum::<f32>() + cm(r, c);
                assert_eq!(f(th.regs[d[i]]), want, "D[{r}, {c}]");
            }
        }
    }

    #[test]
    fn tf32_rounding_is_to_nearest_ties_away() {
        // 1 + 2^-11 is halfway between two tf32 values (10 fraction bits): away from zero.
        assert_eq!(f32::from_bits(tf32_rna((1.0f32 + 2f32.powi(-11)).to_bits())), 1.0 + 2f32.powi(-10));
        assert_eq!(f32::from_bits(tf32_rna((1.0f32 + 2f32.powi(-12)).to_bits())), 1.0);
        assert_eq!(f32::from_bits(tf32_rna((-1.0f32 - 2f32.powi(-11)).to_bits())), -1.0 - 2f32.powi(-10));
        assert!(f32::from_bits(tf32_rna(f32::NAN.to_bits())).is_nan());
        assert_eq!(f32::from_bits(tf32_rna(f32::INFINITY.to_bits())), f32::INFINITY);
    }

    #[test]
    fn an_mma_half_the_warp_skips_is_a_deadlock() {
        let body = "\tmov.u32 %r1, %tid.x;\n\tsetp.ge.u32 %p1, %r1, 16;\n\t@%p1 bra $L_end;\n\
                    \tmma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%r2, %r3, %r4, %r5}, {%r6, %r7, %r8, %r9}, {%r10, %r11}, {%r2, %r3, %r4, %r5};\n$L_end:";
        let m = module(body, false);
        let mut mem = Memory::default();
        let out = mem.alloc(4);
        let err = m.launch(&mut mem, &[out], 1, 32, 0, false).expect_err("diverged warp");
        assert!(err.contains("deadlock") && err.contains("Mma"), "{err}");
    }
}
