//! Statements and bodies: result counts, result annotations, where `yield` may stand, nested
//! scopes, and `for` loops with their carried values.

use std::collections::HashMap;

use super::{BodyKind, Checked, Checker, with_article};
use crate::ir::limits::MAX_NESTING;
use crate::ir::print::print_stmt_head;
use crate::ir::*;

impl Checker<'_> {
    // ---- body ----

    pub(super) fn body(&mut self, body: &mut [Stmt], kind: BodyKind) {
        let nested = usize::from(!matches!(kind, BodyKind::Kernel));
        if nested == 1 && self.nesting >= MAX_NESTING {
            // Built without the parser, which stops at the same depth; nothing inside is checked.
            let span = body.first().map_or(Span::NONE, |s| s.span);
            self.err(
                span,
                format!("this body is nested {} deep, past the limit of {MAX_NESTING}", self.nesting + 1),
                format!("expected at most {MAX_NESTING} `when`, `for` and `if` bodies inside one another"),
            );
            return;
        }
        self.nesting += nested;
        self.body_statements(body, kind);
        self.nesting -= nested;
    }

    fn body_statements(&mut self, body: &mut [Stmt], kind: BodyKind) {
        let n = body.len();
        for (i, s) in body.iter_mut().enumerate() {
            let last = i + 1 == n;
            if let Op::Yield(_) = &s.op
                && !(last && matches!(kind, BodyKind::For { .. } | BodyKind::If { .. }))
            {
                self.err(
                    s.span,
                    "`yield` is only allowed as the last statement of a `for` body or an `if` branch",
                    "expected `yield` to end a `for` loop body or an `if` branch",
                );
                continue;
            }
            self.stmt(s);
        }
        let yields = matches!(body.last().map(|s| &s.op), Some(Op::Yield(_)));
        // An empty body's missing `yield` is reported at its loop or `if`.
        let last = body.last().map(|s| s.span);
        match kind {
            BodyKind::For { iters, at } if iters > 0 && !yields => self.err(
                last.unwrap_or(at),
                format!("the `for` body does not end with `yield` for its {iters} `iter` value{}", plural(iters)),
                "expected `yield` with the next value of each `iter` argument as the last statement",
            ),
            BodyKind::If { results, at } if results > 0 && !yields => self.err(
                last.unwrap_or(at),
                format!("an `if` branch does not end with `yield` for its {results} result{}", plural(results)),
                "expected `yield` with a value for each result as the last statement of both branches",
            ),
            _ => {}
        }
    }

    fn stmt(&mut self, s: &mut Stmt) {
        self.snippet = if s.span.is_known() { None } else { Some(print_stmt_head(s)) };
        let span = s.span;
        // Result count.
        let want = match &s.op {
            Op::Store { .. } | Op::When { .. } | Op::Yield(_) | Op::Sync(_) => 0,
            Op::For(ForLoop { iters, .. }) => iters.len(),
            // As many as its branches yield.
            Op::If(_) => s.results.len(),
            _ => 1,
        };
        if s.results.len() != want {
            let m = s.op.mnemonic();
            let msg = match want {
                0 => format!(
                    "`{m}` defines no value, but {} result name{} given",
                    s.results.len(),
                    if s.results.len() == 1 { " is" } else { "s are" }
                ),
                1 => format!("`{m}` defines one value, but {} result names are given", s.results.len()),
                n => {
                    format!("this `for` carries {n} `iter` values, so it defines {n} results, but {} are given", s.results.len())
                }
            };
            self.err(
                span,
                msg,
                if want == 0 {
                    "expected no `%name =` before it".to_string()
                } else {
                    format!("expected {want} result name{}", if want == 1 { "" } else { "s" })
                },
            );
        }
        if s.op.needs_annotation() && s.ty.is_none() {
            let m = s.op.mnemonic();
            self.err(
                span,
                format!("`{m}` needs a result type"),
                format!("expected `: TYPE` saying what to make, as in `{m} ... : f32[16, 16]`"),
            );
        }
        if let Op::If(_) = s.op {
            let types = self.if_else(&mut s.op, &s.results, span);
            for (r, t) in s.results.iter().zip(types) {
                self.define(r, t, span);
            }
            return;
        }
        let ann = s.ty.clone();
        let ty = self.op(&mut s.op, ann.as_ref(), span);
        if let (Some(t), Some(a), false) = (&ty, &ann, s.op.needs_annotation())
            && t != a
            && s.op.has_single_result()
        {
            self.err(
                span,
                format!("the result type is written as `{a}`, but `{}` gives `{t}`", s.op.mnemonic()),
                format!("expected `: {t}` or no annotation"),
            );
        }
        if s.op.has_single_result() {
            if let Some(t) = &ty {
                s.ty = Some(t.clone());
            }
            if let Some(r) = s.results.first() {
                self.define(r, ty, span);
            }
        } else if matches!(s.op, Op::For(ForLoop { .. })) {
            let types = std::mem::take(&mut self.for_results);
            for (r, t) in s.results.iter().zip(types) {
                self.define(r, t, span);
            }
        }
    }

    pub(super) fn for_loop(&mut self, op: &mut Op, span: Span) {
        let Op::For(ForLoop { var, lo, hi, step, iters, cond, body }) = op else { unreachable!("called on a for") };
        self.scalar_int(lo, span, "the lower bound", true);
        self.scalar_int(hi, span, "the upper bound", true);
        if let Some(s) = step {
            self.scalar_int(s, span, "the step", true);
            if let Operand::Lit(Literal::Int(v)) = s
                && *v <= 0
            {
                self.err(span, format!("the loop step is {v}"), "expected a positive step");
            }
        }
        let inits: Vec<Checked<Type>> = iters
            .iter()
            .map(|(n, v)| {
                let what = format!("the initial value of `%{n}`");
                self.val(v, span, &what)
            })
            .collect();
        if let Some(c) = cond {
            let carried = iters.iter().position(|(n, _)| n == c);
            let ok = carried.is_some_and(|k| inits[k].as_ref().is_none_or(|t| *t == Type::scalar(DType::Bool)));
            if !ok {
                let what = match carried {
                    None => "which the loop does not carry".to_string(),
                    Some(k) => format!("which is {}", inits[k].as_ref().map_or("?".to_string(), ToString::to_string)),
                };
                self.err(
                    span,
                    format!("`while %{c}` names `%{c}`, {what}"),
                    "expected a carried `bool` scalar, as in `iter (..., %go = %c) while %go`",
                );
            }
        }
        self.scopes.push(HashMap::new());
        self.define(var, Some(Type::scalar(DType::I32)), span);
        for ((n, _), t) in iters.iter().zip(&inits) {
            self.define(n, t.clone(), span);
        }
        self.body(body, BodyKind::For { iters: iters.len(), at: span });
        // `yield` must give each carried value its own type.
        if let Some(Stmt { op: Op::Yield(vals), span: ys, .. }) = body.last() {
            let ys = *ys;
            if vals.len() != iters.len() {
                self.err(
                    ys,
                    format!(
                        "`yield` gives {} value{}, but the loop carries {}",
                        vals.len(),
                        if vals.len() == 1 { "" } else { "s" },
                        iters.len()
                    ),
                    format!(
                        "expected one value per `iter` argument ({})",
                        iters.iter().map(|(n, _)| format!("%{n}")).collect::<Vec<_>>().join(", ")
                    ),
                );
            } else {
                for ((v, (n, _)), init) in vals.iter().zip(iters.iter()).zip(&inits) {
                    let Some(want) = init else { continue };
                    let got = self.val(v, ys, "a yielded value");
                    if let Some(got) = got
                        && &got != want
                    {
                        self.err(
                            ys,
                            format!("`yield` gives {got} for `%{n}`, which is {want}"),
                            format!("expected {} value", with_article(want)),
                        );
                    }
                }
            }
        }
        self.scopes.pop();
        // Results are defined after the loop, with the carried types.
        // (Names are taken from the statement by the caller: see `stmt_for_results`.)
        self.for_results = inits;
    }
}

impl Checker<'_> {
    /// An `if` defining `results`: a scalar `bool` condition, each branch in its own scope
    /// ending with a `yield` of a value per result, the two branches yielding the same types. The
    /// result types (a branch's where the other's are poisoned).
    fn if_else(&mut self, op: &mut Op, results: &[String], span: Span) -> Vec<Checked<Type>> {
        let Op::If(IfElse { cond, then, els }) = op else { unreachable!("called on an if") };
        let arity = results.len();
        self.condition(cond, span, "if");
        let mut branches = Vec::new();
        for body in [then, els] {
            self.scopes.push(HashMap::new());
            self.body(body, BodyKind::If { results: arity, at: span });
            let types = match body.last() {
                Some(Stmt { op: Op::Yield(vals), span: ys, .. }) => {
                    let ys = *ys;
                    if vals.len() == arity {
                        vals.iter().map(|v| self.val(v, ys, "a yielded value")).collect()
                    } else {
                        self.err(
                            ys,
                            format!("`yield` gives {} value{}, but the `if` has {arity} result{}", vals.len(), plural(vals.len()), plural(arity)),
                            format!("expected {arity} value{}, one per result name before `= if`", plural(arity)),
                        );
                        vec![None; arity]
                    }
                }
                _ => vec![None; arity],
            };
            self.scopes.pop();
            branches.push(types);
        }
        let els = branches.pop().expect("two branches");
        let then = branches.pop().expect("two branches");
        then.into_iter()
            .zip(els)
            .enumerate()
            .map(|(k, (a, b))| match (a, b) {
                (Some(a), Some(b)) if a != b => {
                    self.err(
                        span,
                        format!("the `if` branches yield {a} and {b} for `%{}`", results[k]),
                        "expected both branches to yield values of one type for each result",
                    );
                    None
                }
                (a, b) => a.or(b),
            })
            .collect()
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}
