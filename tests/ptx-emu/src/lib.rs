//! A small emulator for the subset of PTX that tessel's Mosaic GPU backend emits, so that the
//! lowering can be checked against the reference interpreter on machines without a GPU.
//!
//! It is a test tool, not a GPU model: CTAs run one after another; inside a CTA every thread runs
//! until it reaches `bar.sync` (or `ret`), in thread order or in reverse thread order, so a missing
//! barrier shows up as a difference between the two orders. Approximate instructions
//! (`ex2.approx`, `sin.approx`, ...) are computed exactly; the tests compare within tolerances.
//! An instruction outside the subset is an error naming it, never a silent guess.

use std::collections::HashMap;

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
}

#[derive(Clone, Debug)]
struct Instr {
    pred: Option<(usize, bool)>,
    op: String,
    /// `op` as an index into [`OPS`] (`usize::MAX` for `setp`).
    code: usize,
    args: Vec<Arg>,
    line: usize,
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
    "ex2.approx.f32",
    "lg2.approx.f32",
    "sin.approx.f32",
    "cos.approx.f32",
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
];

/// A parsed kernel.
pub struct Module {
    /// Entry name.
    pub entry: String,
    /// Parameter names in order.
    pub params: Vec<String>,
    code: Vec<Instr>,
    registers: usize,
}

fn parse_imm(s: &str) -> Option<u64> {
    if let Some(hex) = s.strip_prefix("0f") {
        return u32::from_str_radix(hex, 16).ok().map(u64::from);
    }
    s.parse::<i64>().ok().map(|v| v as u64)
}

/// Parses the PTX text of one entry.
pub fn parse(ptx: &str) -> Result<Module, String> {
    let mut regs: HashMap<String, usize> = HashMap::new();
    let mut labels: HashMap<String, usize> = HashMap::new();
    let mut params = Vec::new();
    let mut entry = String::new();
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
        for a in operands.split(',').map(str::trim).filter(|a| !a.is_empty()) {
            args.push(if a == "%tid.x" {
                Arg::Tid
            } else if a == "%ctaid.x" {
                Arg::Ctaid
            } else if let Some(inner) = a.strip_prefix('[').and_then(|a| a.strip_suffix(']')) {
                if inner.starts_with('%') {
                    Arg::Mem(reg(inner))
                } else {
                    Arg::Param(params.iter().position(|p| p == inner).ok_or(format!("line {line}: unknown param {inner}"))?)
                }
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
        let opc = match OPS.iter().position(|o| *o == op) {
            Some(i) => i,
            None if op.starts_with("setp.") => usize::MAX,
            None => return Err(format!("line {line}: `{op}` is not in the emulated subset")),
        };
        code.push(Instr { pred, op: op.to_string(), code: opc, args, line });
    }
    let registers = regs.len();
    Ok(Module { entry, params, code, registers })
}

/// Device memory: one growing byte array; addresses start above zero.
#[derive(Default)]
pub struct Memory {
    bytes: Vec<u8>,
}

const BASE: u64 = 4096;

impl Memory {
    /// Allocates `len` zeroed bytes (16-aligned) and returns the address.
    pub fn alloc(&mut self, len: usize) -> u64 {
        let at = self.bytes.len().div_ceil(16) * 16;
        self.bytes.resize(at + len.max(16), 0);
        BASE + at as u64
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

    fn index(&self, addr: u64) -> Result<usize, String> {
        let i = addr.checked_sub(BASE).ok_or(format!("access below memory at {addr:#x}"))? as usize;
        if i + 4 > self.bytes.len() {
            return Err(format!("access past memory at {addr:#x}"));
        }
        if !i.is_multiple_of(4) {
            return Err(format!("misaligned access at {addr:#x}"));
        }
        Ok(i)
    }

    fn load(&self, addr: u64) -> Result<u32, String> {
        let i = self.index(addr)?;
        Ok(u32::from_le_bytes(self.bytes[i..i + 4].try_into().expect("4 bytes")))
    }

    fn store(&mut self, addr: u64, v: u32) -> Result<(), String> {
        let i = self.index(addr)?;
        self.bytes[i..i + 4].copy_from_slice(&v.to_le_bytes());
        Ok(())
    }
}

const BAR: usize = 67;
const RET: usize = 68;

struct Thread {
    regs: Vec<u64>,
    pc: usize,
    done: bool,
}

fn f(v: u64) -> f32 {
    f32::from_bits(v as u32)
}

fn b(v: f32) -> u64 {
    u64::from(v.to_bits())
}

impl Module {
    fn run_group(
        &self,
        mem: &mut Memory,
        params: &[u64],
        cta: u32,
        tids: std::ops::Range<u32>,
        reverse: bool,
    ) -> Result<(), String> {
        let mut threads: Vec<(u32, Thread)> =
            tids.map(|t| (t, Thread { regs: vec![0; self.registers], pc: 0, done: false })).collect();
        if reverse {
            threads.reverse();
        }
        let mut steps: u64 = 0;
        loop {
            for (tid, th) in threads.iter_mut() {
                while !th.done {
                    steps += 1;
                    if steps > 4_000_000_000 {
                        return Err("the kernel runs too long (an endless loop?)".into());
                    }
                    let ins = self.code.get(th.pc).ok_or("ran off the end of the code")?;
                    th.pc += 1;
                    if let Some((p, neg)) = ins.pred
                        && (th.regs[p] != 0) == neg
                    {
                        continue;
                    }
                    if ins.code == BAR {
                        break;
                    }
                    if ins.code == RET {
                        th.done = true;
                        break;
                    }
                    exec(ins, th, mem, params, *tid, cta).map_err(|e| format!("line {} `{}`: {e}", ins.line, ins.op))?;
                }
            }
            if threads.iter().all(|(_, t)| t.done) {
                return Ok(());
            }
            if threads.iter().any(|(_, t)| t.done) {
                return Err("some threads ended while others wait at a barrier".into());
            }
            let pc = threads[0].1.pc;
            if threads.iter().any(|(_, t)| t.pc != pc) {
                return Err("threads wait at different barriers".into());
            }
        }
    }

    /// Runs the entry over `grid` CTAs of `block` threads with the parameter values `params`.
    pub fn launch(&self, mem: &mut Memory, params: &[u64], grid: u32, block: u32, reverse: bool) -> Result<(), String> {
        if params.len() != self.params.len() {
            return Err(format!("{} takes {} parameters, got {}", self.entry, self.params.len(), params.len()));
        }
        // `bar.sync w, 128` is a barrier per warpgroup of 128 threads: warpgroups run one after
        // another (they share only the CTA's scratch), threads of one group to each barrier.
        let group = block.min(128);
        for cta in 0..grid {
            let mut groups: Vec<u32> = (0..block.div_ceil(group)).collect();
            if reverse {
                groups.reverse();
            }
            for g in groups {
                let lo = g * group;
                let hi = (lo + group).min(block);
                self.run_group(mem, params, cta, lo..hi, reverse)?;
            }
        }
        Ok(())
    }
}

fn exec(ins: &Instr, th: &mut Thread, mem: &mut Memory, params: &[u64], tid: u32, cta: u32) -> Result<(), String> {
    let val = |a: &Arg, th: &Thread| -> u64 {
        match a {
            Arg::Reg(r) => th.regs[*r],
            Arg::Imm(v) => *v,
            Arg::Tid => u64::from(tid),
            Arg::Ctaid => u64::from(cta),
            Arg::Param(p) => params[*p],
            Arg::Mem(r) => th.regs[*r],
            Arg::Label(l) => *l as u64,
        }
    };
    let a = &ins.args;
    let dst = match a.first() {
        Some(Arg::Reg(r)) => Some(*r),
        _ => None,
    };
    let x = |i: usize, th: &Thread| val(&a[i], th);
    let (u, s) = (|v: u64| v as u32, |v: u64| v as u32 as i32);
    let op = if ins.code == usize::MAX { ins.op.as_str() } else { OPS[ins.code] };
    let out: u64 = match op {
        "mov.u32" | "mov.b32" | "ld.param.u64" | "cvta.to.global.u64" => {
            if op == "ld.param.u64" {
                x(1, th)
            } else {
                x(1, th) & if op == "cvta.to.global.u64" { u64::MAX } else { 0xFFFF_FFFF }
            }
        }
        "bra" | "bra.uni" => {
            th.pc = x(0, th) as usize;
            return Ok(());
        }
        "ld.global.b32" => u64::from(mem.load(x(1, th))?),
        "st.global.b32" => {
            mem.store(x(0, th), u(x(1, th)))?;
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
        "ex2.approx.f32" => b(f(x(1, th)).exp2()),
        "lg2.approx.f32" => b(f(x(1, th)).log2()),
        "sin.approx.f32" => b(f(x(1, th)).sin()),
        "cos.approx.f32" => b(f(x(1, th)).cos()),
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
