//! IR to canonical `.tk` text: the one textual form (logs, errors, snapshots, the plugin boundary).
//!
//! Header lines in the order grid, `in`, `out`, `scratch` (declaration order within each kind),
//! two-space indent per level, one operation per line, single spaces after commas, result types
//! written wherever known, comments dropped.

use std::fmt::{self, Write};

use super::*;

/// The canonical text of a module; kernels are separated by one blank line.
pub fn print_module(module: &Module) -> String {
    let mut w = Writer { out: String::new(), level: 0 };
    for (n, k) in module.kernels.iter().enumerate() {
        if n > 0 {
            w.out.push('\n');
        }
        w.write_kernel(k).expect("writing to a String cannot fail");
    }
    w.finish()
}

/// The canonical text of one kernel.
pub fn print_kernel(kernel: &Kernel) -> String {
    let mut w = Writer { out: String::new(), level: 0 };
    w.write_kernel(kernel).expect("writing to a String cannot fail");
    w.finish()
}

/// One statement on one line, without indent or nested bodies (for messages).
pub fn print_stmt_head(stmt: &Stmt) -> String {
    let mut w = Writer { out: String::new(), level: 0 };
    w.write_stmt_head(stmt).expect("writing to a String cannot fail");
    w.finish()
}

/// A literal as it is written in text.
pub fn literal_text(lit: Literal) -> String {
    match lit {
        Literal::Int(v) => v.to_string(),
        Literal::Bool(b) => b.to_string(),
        Literal::Float(v) if v.is_nan() => "nan".to_string(),
        Literal::Float(v) if v.is_infinite() => if v > 0.0 { "inf" } else { "-inf" }.to_string(),
        // `{:?}` is the shortest text that reads back to the same f64, and always has `.` or `e`.
        Literal::Float(v) => format!("{v:?}"),
    }
}

impl fmt::Display for Operand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Operand::Value(v) => write!(f, "%{v}"),
            Operand::Lit(l) => f.write_str(&literal_text(*l)),
        }
    }
}

impl fmt::Display for Index {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Index::Full => f.write_str(":"),
            Index::Slice { start, size, stride: 1 } => write!(f, "ds({start}, {size})"),
            Index::Slice { start, size, stride } => write!(f, "ds({start}, {size}, {stride})"),
            Index::At(v) | Index::Gather { index: v, .. } => write!(f, "{v}"),
        }
    }
}

impl fmt::Display for AxisRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AxisRef::Name(n) => f.write_str(n),
            AxisRef::Pos(p) => write!(f, "{p}"),
        }
    }
}

/// A grid axis's role as written after its size.
fn role(a: &GridAxis) -> &'static str {
    match (a.seq, a.thread) {
        (true, _) => " seq",
        (false, true) => " thread",
        (false, false) => "",
    }
}

impl fmt::Display for BarrierAt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}]", self.name, self.index)
    }
}

impl fmt::Display for RefAt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)?;
        if let Some(ix) = &self.index {
            write!(f, "[{}]", comma_list(ix))?;
        }
        Ok(())
    }
}

impl fmt::Display for MmaLhs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MmaLhs::Ref(r) => write!(f, "{r}"),
            MmaLhs::Value(v) => write!(f, "{v}"),
        }
    }
}

impl fmt::Display for SyncOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.mnemonic();
        match self {
            SyncOp::Arrive(b) | SyncOp::Wait(b) => write!(f, "{m} {b}"),
            SyncOp::Copy { dst, src, arrive } => {
                write!(f, "{m} {dst}, {src}")?;
                if let Some(b) = arrive {
                    write!(f, " arrive {b}")?;
                }
                Ok(())
            }
            SyncOp::CommitCopies | SyncOp::Fence => f.write_str(m),
            SyncOp::WaitCopies { pending, reads } => write!(f, "{m} {pending}{}", if *reads { " reads" } else { "" }),
            SyncOp::Mma { acc, a, b, trans_a, trans_b } => {
                write!(
                    f,
                    "{m} {acc}, {a}, {b}{}{}",
                    if *trans_a { " trans_a" } else { "" },
                    if *trans_b { " trans_b" } else { "" }
                )
            }
            SyncOp::MmaWait { pending } => write!(f, "{m} {pending}"),
            SyncOp::MaxRegisters { count, increase } => {
                write!(f, "{m} {count} {}", if *increase { "increase" } else { "decrease" })
            }
        }
    }
}

fn comma_list<T: fmt::Display>(items: &[T]) -> String {
    items.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

struct Writer {
    out: String,
    level: usize,
}

impl Writer {
    fn finish(self) -> String {
        self.out
    }

    fn indent(&mut self) {
        for _ in 0..self.level {
            self.out.push_str("  ");
        }
    }

    fn write_kernel(&mut self, k: &Kernel) -> fmt::Result {
        writeln!(self.out, "kernel {}", k.name)?;
        if let Some(grid) = &k.grid {
            let axes: Vec<String> = grid.iter().map(|a| format!("{}: {}{}", a.name, a.size_text(), role(a))).collect();
            writeln!(self.out, "  grid ({})", axes.join(", "))?;
        }
        for kind in [ParamKind::In, ParamKind::Out, ParamKind::Scratch] {
            for p in k.params_of(kind) {
                self.write_param(p)?;
            }
        }
        for b in &k.barriers {
            writeln!(self.out, "  barrier {}[{}] arrivals {}", b.name, b.count, b.arrivals)?;
        }
        writeln!(self.out, "{{")?;
        self.level = 1;
        self.write_body(&k.body)?;
        self.level = 0;
        writeln!(self.out, "}}")
    }

    fn write_param(&mut self, p: &Param) -> fmt::Result {
        let kw = match p.kind {
            ParamKind::In => "in ",
            ParamKind::Out => "out",
            ParamKind::Scratch => "scratch",
        };
        write!(self.out, "  {kw} {}: {}", p.name, p.ty)?;
        if let Some(b) = &p.block {
            write!(self.out, " block [{}] at ({})", comma_list(&b.shape), comma_list(&b.index))?;
        }
        writeln!(self.out)
    }

    fn write_body(&mut self, body: &[Stmt]) -> fmt::Result {
        for s in body {
            self.indent();
            self.write_stmt_head(s)?;
            if !s.op.has_body() {
                self.out.push('\n');
            }
            for (i, body) in s.op.bodies().enumerate() {
                self.out.push_str(if i == 0 { " {\n" } else { " else {\n" });
                self.level += 1;
                self.write_body(body)?;
                self.level -= 1;
                self.indent();
                self.out.push('}');
            }
            if s.op.has_body() {
                self.out.push('\n');
            }
        }
        Ok(())
    }

    fn write_stmt_head(&mut self, s: &Stmt) -> fmt::Result {
        if !s.results.is_empty() {
            let names: Vec<String> = s.results.iter().map(|r| format!("%{r}")).collect();
            write!(self.out, "{} = ", names.join(", "))?;
        }
        self.write_op(&s.op)?;
        if let (Some(ty), true) = (&s.ty, s.op.has_single_result()) {
            write!(self.out, " : {ty}")?;
        }
        Ok(())
    }

    fn write_op(&mut self, op: &Op) -> fmt::Result {
        let m = op.mnemonic();
        let o = &mut self.out;
        match op {
            Op::Load { src, index, mask, other } => {
                write!(o, "load {src}")?;
                if let Some(ix) = index {
                    write!(o, "[{}]", comma_list(ix))?;
                }
                if let Some(mk) = mask {
                    write!(o, " mask %{mk}")?;
                }
                if let Some(l) = other {
                    write!(o, " other {}", literal_text(*l))?;
                }
                Ok(())
            }
            Op::Store { dst, index, value, mask } => {
                write!(o, "store {dst}")?;
                if let Some(ix) = index {
                    write!(o, "[{}]", comma_list(ix))?;
                }
                write!(o, ", {value}")?;
                if let Some(mk) = mask {
                    write!(o, " mask %{mk}")?;
                }
                Ok(())
            }
            Op::ProgramId(a) | Op::NumPrograms(a) => write!(o, "{m} {a}"),
            Op::Iota { dim } => write!(o, "iota {dim}"),
            Op::Full(l) => write!(o, "full {}", literal_text(*l)),
            Op::Zeros => write!(o, "zeros"),
            Op::Unary(_, a) | Op::Cast(a) | Op::Bitcast(a) | Op::Broadcast(a) | Op::Reshape(a) => write!(o, "{m} {a}"),
            Op::Binary(_, a, b) | Op::Compare(_, a, b) => write!(o, "{m} {a}, {b}"),
            Op::Select(c, a, b) => write!(o, "select {c}, {a}, {b}"),
            Op::Transpose { arg, perm } => write!(o, "transpose {arg} perm ({})", comma_list(perm)),
            Op::Tile { arg, reps } => write!(o, "tile {arg} reps ({})", comma_list(reps)),
            Op::Repeat { arg, times, axis } => write!(o, "repeat {arg} times {times} axis {axis}"),
            Op::Concatenate { args, axis } => write!(o, "concatenate {} axis {axis}", comma_list(args)),
            Op::Slice { arg, start, stride } if stride.iter().all(|&k| k == 1) => {
                write!(o, "slice {arg} start ({})", comma_list(start))
            }
            Op::Slice { arg, start, stride } => {
                write!(o, "slice {arg} start ({}) stride ({})", comma_list(start), comma_list(stride))
            }
            Op::Reduce { arg, axis, keepdims, .. } => {
                write!(o, "{m} {arg} axis {axis}{}", if *keepdims { " keepdims" } else { "" })
            }
            Op::Dot { a, b, trans_a, trans_b } => {
                write!(o, "dot {a}, {b}{}{}", if *trans_a { " trans_a" } else { "" }, if *trans_b { " trans_b" } else { "" })
            }
            Op::When { cond, .. } => write!(o, "when {cond}"),
            Op::If(IfElse { cond, .. }) => write!(o, "if {cond}"),
            Op::For(ForLoop { var, lo, hi, step, iters, cond, .. }) => {
                write!(o, "for %{var} = {lo} to {hi}")?;
                if let Some(s) = step {
                    write!(o, " step {s}")?;
                }
                if !iters.is_empty() {
                    let its: Vec<String> = iters.iter().map(|(n, v)| format!("%{n} = {v}")).collect();
                    write!(o, " iter ({})", its.join(", "))?;
                }
                if let Some(c) = cond {
                    write!(o, " while %{c}")?;
                }
                Ok(())
            }
            Op::Yield(vals) if vals.is_empty() => write!(o, "yield"),
            Op::Yield(vals) => write!(o, "yield {}", comma_list(vals)),
            Op::Sync(s) => write!(o, "{s}"),
        }
    }
}
