//! Diagnostics: errors with a position, the offending text and what was expected.

use std::fmt;

/// A byte range in the source text. `Span::NONE` marks IR made without text (the builder).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Span {
    /// First byte.
    pub start: u32,
    /// One past the last byte.
    pub end: u32,
}

impl Span {
    /// No position (IR built in Rust).
    pub const NONE: Span = Span { start: 0, end: 0 };

    /// The range `start..end`.
    pub fn new(start: usize, end: usize) -> Span {
        let clamp = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
        Span { start: clamp(start), end: clamp(end) }
    }

    /// Whether this span points into source text.
    pub fn is_known(self) -> bool {
        self != Span::NONE
    }

    /// The smallest span covering both.
    pub fn to(self, other: Span) -> Span {
        if !self.is_known() {
            return other;
        }
        if !other.is_known() {
            return self;
        }
        Span { start: self.start.min(other.start), end: self.end.max(other.end) }
    }
}

/// One error: what is wrong, where, and what would be right.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    /// Where; `Span::NONE` when the IR has no text.
    pub span: Span,
    /// The fact, one line: "unknown value `%q`".
    pub message: String,
    /// What was expected or would work, one line.
    pub expected: Option<String>,
    /// The offending text when there is no source to quote (builder IR): a canonical rendering.
    pub snippet: Option<String>,
}

impl Diagnostic {
    /// An error at `span`.
    pub fn new(span: Span, message: impl Into<String>) -> Diagnostic {
        Diagnostic { span, message: message.into(), expected: None, snippet: None }
    }

    /// Adds what was expected.
    pub fn expected(mut self, expected: impl Into<String>) -> Diagnostic {
        self.expected = Some(expected.into());
        self
    }

    /// Adds the offending construct in canonical text, for IR without source.
    pub fn snippet(mut self, snippet: impl Into<String>) -> Diagnostic {
        self.snippet = Some(snippet.into());
        self
    }
}

/// All errors found in one file or kernel, in source order.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Diagnostics(pub Vec<Diagnostic>);

impl Diagnostics {
    /// Renders every error against `source`, named `file` in the messages:
    ///
    /// ```text
    /// add.tk:9:17: error: unknown value `%q`
    ///    9 |   %c = add %a, %q
    ///      |                ^^ expected a value defined above, such as `%a` or `%b`
    /// ```
    pub fn render(&self, file: &str, source: &str) -> String {
        let map = SourceMap::new(source);
        let mut out = String::new();
        for d in &self.0 {
            map.render_one(&mut out, file, d);
        }
        let n = self.0.len();
        out.push_str(&format!("{n} error{} in {file}\n", if n == 1 { "" } else { "s" }));
        out
    }

    /// Whether there are no errors.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for Diagnostics {
    /// Without source: one line per error, with the canonical snippet when there is one.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for d in &self.0 {
            write!(f, "error: {}", d.message)?;
            if let Some(s) = &d.snippet {
                write!(f, "\n  | {s}")?;
            }
            if let Some(e) = &d.expected {
                write!(f, "\n  = {e}")?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

impl std::error::Error for Diagnostics {}

/// Byte offsets to `line:column` (both from 1; columns count characters).
pub struct SourceMap<'a> {
    source: &'a str,
    line_starts: Vec<usize>,
}

impl<'a> SourceMap<'a> {
    /// Indexes the line starts of `source`.
    pub fn new(source: &'a str) -> SourceMap<'a> {
        let mut line_starts = vec![0];
        line_starts.extend(source.match_indices('\n').map(|(i, _)| i + 1));
        SourceMap { source, line_starts }
    }

    /// `(line, column)` of byte `offset`.
    pub fn line_col(&self, offset: usize) -> (usize, usize) {
        let offset = offset.min(self.source.len());
        let line = self.line_starts.partition_point(|&s| s <= offset) - 1;
        let start = self.line_starts[line];
        let col = self.source.get(start..offset).map_or(offset - start, |s| s.chars().count());
        (line + 1, col + 1)
    }

    fn line_text(&self, line: usize) -> &'a str {
        let start = self.line_starts[line - 1];
        let end = self.line_starts.get(line).map_or(self.source.len(), |e| e - 1);
        self.source[start..end].trim_end_matches('\r')
    }

    fn render_one(&self, out: &mut String, file: &str, d: &Diagnostic) {
        use std::fmt::Write as _;
        if !d.span.is_known() {
            let _ = writeln!(out, "{file}: error: {}", d.message);
            if let Some(s) = &d.snippet {
                let _ = writeln!(out, "  | {s}");
            }
            if let Some(e) = &d.expected {
                let _ = writeln!(out, "  = {e}");
            }
            return;
        }
        let (line, col) = self.line_col(d.span.start as usize);
        let text = self.line_text(line);
        let _ = writeln!(out, "{file}:{line}:{col}: error: {}", d.message);
        let gutter = line.to_string().len();
        let _ = writeln!(out, "{:>gutter$} | {text}", line);
        // Underline the span on its first line (at least one caret).
        let line_end_col = text.chars().count() + 1;
        let (end_line, end_col) = self.line_col(d.span.end as usize);
        let last = if end_line == line { end_col.max(col + 1) } else { line_end_col.max(col + 1) };
        let carets = "^".repeat(last - col);
        let _ = write!(out, "{:>gutter$} | {}{carets}", "", " ".repeat(col - 1));
        match &d.expected {
            Some(e) => {
                let _ = writeln!(out, " {e}");
            }
            None => out.push('\n'),
        }
    }
}
