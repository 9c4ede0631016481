//! Tokens of `.tk` text. Newlines are tokens: the language is one statement per line.

use logos::Logos;

use super::Span;

/// One token. Keywords are plain identifiers, recognised by the parser where they may appear.
#[derive(Logos, Clone, Debug, PartialEq)]
#[logos(skip r"[ \t\r]+")]
#[logos(skip r"#[^\n]*")]
pub(crate) enum Tok {
    #[token("\n")]
    Newline,
    #[regex(r"[A-Za-z_][A-Za-z0-9_]*", |lex| lex.slice().to_string())]
    Ident(String),
    #[regex(r"%[A-Za-z0-9_]+", |lex| lex.slice()[1..].to_string())]
    Value(String),
    #[regex(r"[0-9]+", |lex| lex.slice().to_string(), priority = 3)]
    Int(String),
    #[regex(r"[0-9]+\.[0-9]*([eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+", |lex| lex.slice().to_string())]
    Float(String),
    #[token("(")]
    LParen,
    #[token(")")]
    RParen,
    #[token("[")]
    LBracket,
    #[token("]")]
    RBracket,
    #[token("{")]
    LBrace,
    #[token("}")]
    RBrace,
    #[token(",")]
    Comma,
    #[token(":")]
    Colon,
    #[token("=")]
    Eq,
    #[token("*")]
    Star,
    #[token("+")]
    Plus,
    #[token("-")]
    Minus,
    #[token("/")]
    Slash,
    #[token("%")]
    Percent,
}

impl Tok {
    /// How the token reads in an error message.
    pub(crate) fn describe(&self) -> String {
        match self {
            Tok::Newline => "end of line".to_string(),
            Tok::Ident(s) => format!("`{s}`"),
            Tok::Value(s) => format!("`%{s}`"),
            Tok::Int(s) | Tok::Float(s) => format!("`{s}`"),
            other => format!("`{}`", other.punct()),
        }
    }

    fn punct(&self) -> &'static str {
        match self {
            Tok::LParen => "(",
            Tok::RParen => ")",
            Tok::LBracket => "[",
            Tok::RBracket => "]",
            Tok::LBrace => "{",
            Tok::RBrace => "}",
            Tok::Comma => ",",
            Tok::Colon => ":",
            Tok::Eq => "=",
            Tok::Star => "*",
            Tok::Plus => "+",
            Tok::Minus => "-",
            Tok::Slash => "/",
            Tok::Percent => "%",
            _ => "",
        }
    }
}

/// A lexing error: a character that starts no token.
pub(crate) struct BadChar {
    pub span: Span,
    pub text: String,
}

/// Splits `source` into tokens; unknown characters are returned separately so that parsing can
/// go on and report every error of the file.
pub(crate) fn lex(source: &str) -> (Vec<(Tok, Span)>, Vec<BadChar>) {
    let mut toks = Vec::new();
    let mut bad = Vec::new();
    let mut lexer = Tok::lexer(source);
    while let Some(result) = lexer.next() {
        let range = lexer.span();
        let span = Span::new(range.start, range.end);
        match result {
            Ok(tok) => toks.push((tok, span)),
            Err(()) => bad.push(BadChar { span, text: lexer.slice().to_string() }),
        }
    }
    (toks, bad)
}
