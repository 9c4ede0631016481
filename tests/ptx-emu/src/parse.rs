//! The PTX text reader: one entry's text into a [`Module`] of instructions whose operands are
//! resolved (registers numbered, labels and parameters by index). An instruction outside the
//! emulated subset is refused here, naming it, before anything runs.

use std::collections::HashMap;

use crate::hopper::Wgmma;

/// One operand.
#[derive(Clone, Debug)]
pub(crate) enum Arg {
    /// A register: (class, index).
    Reg(usize),
    /// An immediate (bits).
    Imm(u64),
    /// `%tid.x` / `%ctaid.x`.
    Tid,
    Ctaid,
    /// `%nctaid.x`: the CTAs of the launch.
    Nctaid,
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
pub(crate) enum Kind {
    Plain,
    /// `bar.sync`: wait for the barrier's threads.
    Bar,
    /// `mma.sync`: wait for the warp's 32 lanes.
    Mma(Mma),
    /// `wgmma.mma_async`: wait for the warpgroup's 128 threads.
    Wgmma(Wgmma),
    /// `wgmma.wait_group`: wait for the warpgroup's 128 threads, then each retires its
    /// products when it runs on (so another warpgroup may run between the meeting and the
    /// retiring, as on hardware, where the wait takes its time).
    WgmmaWait,
    /// `mbarrier.try_wait.parity`: wait until the phase of that parity has completed.
    MbarWait,
    /// `setmaxnreg.inc|dec`: wait for the warpgroup's 128 threads, then (for `inc`) for the
    /// CTA's pool to hold the registers asked for.
    SetMaxNReg,
    /// `shfl.sync.bfly.b32 d, a, lanes, clamp, membermask`: wait for the warp's 32 lanes, then
    /// each reads `a` of the lane whose index is its own XOR `lanes`.
    Shfl,
    Ret,
}

/// The `mma.sync` shapes and types emulated.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Mma {
    /// `m16n8k8`, `tf32` inputs.
    Tf32,
    /// `m16n8k16`, `f16` inputs.
    F16,
    /// `m16n8k16`, `bf16` inputs.
    Bf16,
}

#[derive(Clone, Debug)]
pub(crate) struct Instr {
    pub(crate) pred: Option<(usize, bool)>,
    pub(crate) op: String,
    pub(crate) kind: Kind,
    /// The state space a load or store touches, for [`Counts`](crate::cta::Counts).
    pub(crate) space: Option<Space>,
    pub(crate) args: Vec<Arg>,
    pub(crate) line: usize,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Space {
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
    "sub.s32",
    "mov.pred",
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
    "ld.shared.u16",
    "ld.shared.s16",
    "ld.shared.u8",
    "ld.shared.s8",
    "st.shared.u16",
    "st.shared.b16",
    "st.shared.u8",
    "st.shared.b8",
    "cvt.rna.tf32.f32",
    "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32",
    "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
    "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
    "ld.global.u16",
    "st.global.u16",
    "st.global.b16",
    "ld.global.s16",
    "ld.global.u8",
    "ld.global.s8",
    "st.global.u8",
    "st.global.b8",
    "cvt.s32.s8",
    "cvt.s32.s16",
    "ld.global.v2.b32",
    "st.global.v2.b32",
    "cvt.u64.u32",
    "cvt.u32.u64",
    "or.b64",
    "mov.b64",
    "cvta.param.u64",
    "mbarrier.init.shared::cta.b64",
    "mbarrier.arrive.expect_tx.shared::cta.b64",
    "mbarrier.arrive.shared::cta.b64",
    "setmaxnreg.inc.sync.aligned.u32",
    "setmaxnreg.dec.sync.aligned.u32",
    "mbarrier.try_wait.parity.shared::cta.b64",
    "fence.mbarrier_init.release.cluster",
    "fence.proxy.async.shared::cta",
    "cp.async.bulk.tensor.1d.global.shared::cta.bulk_group",
    "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group",
    "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group",
    "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group",
    "cp.async.bulk.tensor.5d.global.shared::cta.bulk_group",
    "cp.async.bulk.commit_group",
    "cp.async.bulk.wait_group",
    "cp.async.bulk.wait_group.read",
    "cp.async.bulk.tensor.1d.shared::cluster.global.mbarrier::complete_tx::bytes",
    "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes",
    "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes",
    "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes",
    "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes",
    "wgmma.fence.sync.aligned",
    "shfl.sync.bfly.b32",
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
    pub(crate) code: Vec<Instr>,
    pub(crate) registers: usize,
    /// The name of the `.extern .shared` array, if any.
    pub(crate) shared: Option<String>,
    /// The registers a thread has at entry (`.maxnreg`), which `setmaxnreg` moves between
    /// warpgroups.
    pub(crate) maxnreg: Option<u32>,
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
    let mut maxnreg = None;
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
        if let Some(rest) = line.strip_prefix(".maxnreg ") {
            maxnreg = Some(rest.trim().parse().map_err(|_| format!("line {}: {line}", n + 1))?);
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
            } else if a == "%nctaid.x" {
                Arg::Nctaid
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
            let ok = match &args[..] {
                [Arg::Vec(d), Arg::Reg(_), Arg::Reg(_), Arg::Reg(_), Arg::Imm(_), Arg::Imm(_), Arg::Imm(_), Arg::Imm(_)] => {
                    d.len() == w.n as usize / 2
                }
                [Arg::Vec(d), Arg::Vec(a), Arg::Reg(_), Arg::Reg(_), Arg::Imm(_), Arg::Imm(_), Arg::Imm(_)] => {
                    d.len() == w.n as usize / 2 && a.len() == 4
                }
                _ => false,
            };
            if !ok {
                return Err(format!(
                    "line {line}: `{op}` takes {{{} registers}}, two descriptors (or {{4 registers}} of A and B's), scale-d and four (three) immediates",
                    w.n / 2
                ));
            }
        }
        if op == "shfl.sync.bfly.b32" {
            let ok = matches!(&args[..], [Arg::Reg(_), Arg::Reg(_), Arg::Imm(l), Arg::Imm(31), Arg::Imm(m)] if *l < 32 && *m as u32 == u32::MAX);
            if !ok {
                return Err(format!("line {line}: `{op}` takes d, a, an immediate lane mask, clamp 31 and the full member mask"));
            }
        }
        let kind = match op {
            "bar.sync" => Kind::Bar,
            "shfl.sync.bfly.b32" => Kind::Shfl,
            "ret" => Kind::Ret,
            "mbarrier.try_wait.parity.shared::cta.b64" => Kind::MbarWait,
            "wgmma.wait_group.sync.aligned" => Kind::WgmmaWait,
            "setmaxnreg.inc.sync.aligned.u32" | "setmaxnreg.dec.sync.aligned.u32" => {
                let ok = matches!(args[..], [Arg::Imm(n)] if (24..=256).contains(&n) && n % 8 == 0);
                if !ok {
                    return Err(format!("line {line}: `{op}` takes a register count, a multiple of 8 from 24 to 256"));
                }
                Kind::SetMaxNReg
            }
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
    Ok(Module { entry, params, tensor_maps, code, registers, shared, maxnreg })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instruction_outside_the_subset_is_named() {
        // Approximate instructions above all: their error is the hardware's.
        let ptx = ".visible .entry k(\n)\n{\n\tsin.approx.f32 %r1, %r2;\n\tret;\n}\n";
        let err = parse(ptx).err().expect("refused");
        assert!(err.contains("`sin.approx.f32` is not in the emulated subset"), "{err}");
    }
}
