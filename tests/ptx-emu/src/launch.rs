//! Scheduling a launch: CTAs one after another; inside a CTA each thread runs until it waits
//! (a barrier, a warp's `mma.sync`, a warpgroup's `wgmma` or `wgmma.wait_group`, an mbarrier
//! phase) or ends, in thread order (all of them each round) or in reverse (each round only the
//! last warpgroup with a thread that can run: a kernel's later warpgroups, its producer, run
//! ahead of the others), and waits are released once every thread they need has arrived. A wait
//! nothing can release is a deadlock, reported with where the threads stand.

use crate::cta::{Counts, Cta, Registers, Thread, Wait};
use crate::exec::{exec, mma, wgmma};
use crate::hopper::{Async, Pending, TensorMap};
use crate::memory::Memory;
use crate::parse::{Arg, Kind, Module, Space};

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
                Kind::Shfl => th.wait = Wait::Shfl(th.pc),
                Kind::WgmmaWait if th.met => {
                    th.met = false;
                    th.pc += 1;
                    exec(ins, th, cta, tid).map_err(|e| format!("line {} `{}`: {e}", ins.line, ins.op))?;
                }
                Kind::WgmmaWait => th.wait = Wait::WgmmaGroup(th.pc),
                Kind::SetMaxNReg => th.wait = Wait::SetMaxNReg(th.pc),
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
            .map(|_| Thread { regs: vec![0; self.registers], pc: 0, wait: Wait::No, pending: Pending::default(), met: false })
            .collect();
        let order: Vec<u32> = if reverse { (0..block).rev().collect() } else { (0..block).collect() };
        let mut steps: u64 = 0;
        loop {
            // In order, every thread steps; in reverse, only the first warpgroup (from the last)
            // with a thread that can run: it runs ahead of the others as far as it can.
            let alone = reverse.then(|| order.iter().find(|&&t| threads[t as usize].wait == Wait::No).map(|t| t / 128)).flatten();
            for &t in order.iter().filter(|&&t| alone.is_none_or(|g| t / 128 == g)) {
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
            // Warps whose 32 lanes all wait at the same `shfl.sync`: every lane's source read
            // before any lane's destination is written.
            for warp in threads.chunks_mut(32) {
                let Wait::Shfl(pc) = warp[0].wait else { continue };
                if warp.len() == 32 && warp.iter().all(|t| t.wait == Wait::Shfl(pc)) {
                    let ins = &self.code[pc];
                    let [Arg::Reg(d), Arg::Reg(a), Arg::Imm(lanes), ..] = ins.args[..] else { unreachable!("parse checks") };
                    let sources: Vec<u64> = warp.iter().map(|t| t.regs[a]).collect();
                    for (lane, t) in warp.iter_mut().enumerate() {
                        t.regs[d] = sources[lane ^ lanes as usize];
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
                    wgmma(ins, group, &cta.shared, &mut cta.asynchronous)
                        .map_err(|e| format!("line {} `{}`: {e}", ins.line, ins.op))?;
                    cta.counts.wgmma += 1;
                    for t in group.iter_mut() {
                        t.pc += 1;
                        t.wait = Wait::No;
                    }
                    moved = true;
                }
            }
            // Warpgroups whose 128 threads all wait at the same `wgmma.wait_group`: each retires
            // its products when it runs on.
            for group in threads.chunks_mut(128) {
                let Wait::WgmmaGroup(pc) = group[0].wait else { continue };
                if group.len() == 128 && group.iter().all(|t| t.wait == Wait::WgmmaGroup(pc)) {
                    for t in group.iter_mut() {
                        t.wait = Wait::No;
                        t.met = true;
                    }
                    moved = true;
                }
            }
            // Warpgroups whose 128 threads all wait at the same `setmaxnreg`, where the registers
            // are there.
            for (g, group) in threads.chunks_mut(128).enumerate() {
                let Wait::SetMaxNReg(pc) = group[0].wait else { continue };
                if group.len() == 128 && group.iter().all(|t| t.wait == Wait::SetMaxNReg(pc)) {
                    let ins = &self.code[pc];
                    let [Arg::Imm(n)] = ins.args[..] else { unreachable!("parse checks") };
                    let registers = cta.registers.as_mut().ok_or(format!(
                        "line {}: setmaxnreg in a kernel without .maxnreg (ptxas cannot tell the registers at entry, C7508, and drops it)",
                        ins.line
                    ))?;
                    if registers.set(g, n as u32, ins.op.contains(".inc.")).map_err(|e| format!("line {}: {e}", ins.line))? {
                        for t in group.iter_mut() {
                            t.pc += 1;
                            t.wait = Wait::No;
                        }
                        moved = true;
                    }
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
            if !moved && !threads.iter().any(|t| t.wait == Wait::No) {
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
        // The SM's register file: 64K 32-bit registers for the CTA's threads at entry.
        if let Some(n) = self.maxnreg
            && u64::from(n) * u64::from(block) > 65_536
        {
            return Err(format!(
                "{} asks for {n} registers a thread (.maxnreg) for {block} threads: more than an SM's 65536",
                self.entry
            ));
        }
        let mut counts = Counts::default();
        for id in 0..grid {
            let mut cta = Cta {
                mem,
                shared: Memory::shared(shared),
                params,
                tensor_maps,
                id,
                grid,
                registers: self.maxnreg.map(|n| Registers { per_thread: vec![n; block.div_ceil(128) as usize], pool: 0 }),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::parse;

    /// An entry with one `.u64` parameter `out` around `body`.
    fn module(body: &str, shared: bool) -> Module {
        let decl = if shared { ".extern .shared .align 16 .b8 smem[];\n" } else { "" };
        let ptx = format!(
            ".version 8.0\n.target sm_90a\n.address_size 64\n{decl}.visible .entry k(\n\t.param .u64 k_out\n)\n{{\n{body}\n\tret;\n}}\n"
        );
        parse(&ptx).unwrap_or_else(|e| panic!("{e}\n{ptx}"))
    }

    /// Two warpgroups at `.maxnreg 128`: the second gives registers back (`dec` to 40), the
    /// first takes them (`inc`); an `inc` past what the pool can hold waits forever, and a
    /// kernel without `.maxnreg` has no pool to move registers through.
    #[test]
    fn setmaxnreg_moves_registers_through_the_ctas_pool() {
        let run = |inc: u32, maxnreg: &str| {
            let ptx = format!(
                ".version 8.0\n.target sm_90a\n.address_size 64\n.visible .entry k(\n\t.param .u64 k_out\n)\n.maxntid 256, 1, 1\n{maxnreg}{{\n\
                 \tmov.u32 %r1, %tid.x;\n\tsetp.lt.u32 %p1, %r1, 128;\n\t@%p1 bra $L_consume;\n\tsetmaxnreg.dec.sync.aligned.u32 40;\n\
                 \tbra.uni $L_end;\n$L_consume:\n\tsetmaxnreg.inc.sync.aligned.u32 {inc};\n$L_end:\n\tret;\n}}\n"
            );
            let m = parse(&ptx).unwrap_or_else(|e| panic!("{e}\n{ptx}"));
            let mut mem = Memory::default();
            let out = mem.alloc(4);
            m.launch(&mut mem, &[out], 1, 256, 0, false)
        };
        assert!(run(216, ".maxnreg 128\n").is_ok());
        let err = run(224, ".maxnreg 128\n").expect_err("the pool holds 88 x 128 registers");
        assert!(err.contains("deadlock") && err.contains("SetMaxNReg"), "{err}");
        let err = run(216, "").expect_err("no pool");
        assert!(err.contains("without .maxnreg"), "{err}");
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
