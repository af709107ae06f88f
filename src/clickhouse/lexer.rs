//! A small lexer of ClickHouse SQL, for text the operator did not write: statements read from a
//! bucket (a restore) and statements that may carry credentials (error messages and logs).
//!
//! It splits a statement into words, quoted names, string literals, numbers and punctuation,
//! dropping whitespace and comments, and refuses what it does not know (heredoc strings,
//! unterminated quotes, bytes outside the SQL alphabet). [`render`] writes tokens back in one
//! canonical form, names and strings quoted by the operator's own rules, so a statement rebuilt
//! from checked tokens says exactly what the checks saw. [`summary`] and [`mask_literals`]
//! describe a statement without any of its string literals, where credentials live.

use std::fmt;

/// One token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Token {
    /// A bare word: a keyword, a function, an engine or a name (`[A-Za-z_][A-Za-z0-9_]*`).
    Word(String),
    /// A name in backquotes or double quotes, unescaped.
    Quoted(String),
    /// A string literal in single quotes, unescaped.
    Str(String),
    /// A number as written (`1`, `0.5`, `1e-3`, `0x1F`).
    Number(String),
    /// Punctuation or an operator (`(`, `,`, `.`, `::`, `->`, `<=`, …).
    Punct(&'static str),
}

impl Token {
    /// Whether this is the bare word `kw` (keywords are case-insensitive).
    pub fn is_word(&self, kw: &str) -> bool {
        matches!(self, Token::Word(w) if w.eq_ignore_ascii_case(kw))
    }

    /// The name this token gives, bare or quoted.
    pub fn name(&self) -> Option<&str> {
        match self {
            Token::Word(w) | Token::Quoted(w) => Some(w),
            _ => None,
        }
    }

    pub fn is(&self, punct: &str) -> bool {
        matches!(self, Token::Punct(p) if *p == punct)
    }
}

/// Why a text is not a statement this lexer accepts.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LexError {
    #[error("an unterminated {0} at byte {1}")]
    Unterminated(&'static str, usize),
    #[error("an unexpected character {0:?} at byte {1}")]
    Unexpected(char, usize),
    #[error("an invalid escape in a quoted text at byte {0}")]
    Escape(usize),
}

const PUNCTUATION: &[&str] = &[
    "::", "->", "<=", ">=", "!=", "<>", "==", "||", "(", ")", "[", "]", "{", "}", ",", ";", ".",
    ":", "+", "-", "*", "/", "%", "=", "<", ">", "?", "@", "^", "!", "&", "|",
];

/// The tokens of `text`.
pub fn tokenize(text: &str) -> Result<Vec<Token>, LexError> {
    let bytes = text.as_bytes();
    let mut out: Vec<Token> = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        match c {
            b' ' | b'\t' | b'\n' | b'\r' | b'\x0c' => i += 1,
            b'-' if bytes.get(i + 1) == Some(&b'-') => i = line_end(bytes, i),
            b'#' if matches!(bytes.get(i + 1), Some(b' ' | b'!')) => i = line_end(bytes, i),
            b'/' if bytes.get(i + 1) == Some(&b'*') => i = comment_end(bytes, i)?,
            b'\'' => {
                let (s, next) = quoted(text, i, b'\'', "string")?;
                out.push(Token::Str(s));
                i = next;
            }
            b'`' => {
                let (s, next) = quoted(text, i, b'`', "quoted name")?;
                out.push(Token::Quoted(s));
                i = next;
            }
            b'"' => {
                let (s, next) = quoted(text, i, b'"', "quoted name")?;
                out.push(Token::Quoted(s));
                i = next;
            }
            b'a'..=b'z' | b'A'..=b'Z' | b'_' => {
                let start = i;
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                    i += 1;
                }
                out.push(Token::Word(text[start..i].to_string()));
            }
            b'0'..=b'9' => i = number(text, i, &mut out),
            b'.' if bytes.get(i + 1).is_some_and(u8::is_ascii_digit) && !after_operand(&out) => {
                i = number(text, i, &mut out)
            }
            _ => {
                let p = PUNCTUATION
                    .iter()
                    .find(|p| text[i..].starts_with(**p))
                    .ok_or_else(|| {
                        LexError::Unexpected(text[i..].chars().next().unwrap_or('?'), i)
                    })?;
                out.push(Token::Punct(p));
                i += p.len();
            }
        }
    }
    Ok(out)
}

/// Whether the last token ends an operand, so that a `.` after it is member access (`t.1`).
fn after_operand(tokens: &[Token]) -> bool {
    matches!(
        tokens.last(),
        Some(Token::Word(_) | Token::Quoted(_) | Token::Punct(")") | Token::Punct("]"))
    )
}

fn line_end(bytes: &[u8], mut i: usize) -> usize {
    while i < bytes.len() && bytes[i] != b'\n' {
        i += 1;
    }
    i
}

/// The end of a `/* … */` comment, which ClickHouse lets nest.
fn comment_end(bytes: &[u8], start: usize) -> Result<usize, LexError> {
    let mut depth = 0;
    let mut i = start;
    while i + 1 < bytes.len() {
        match (bytes[i], bytes[i + 1]) {
            (b'/', b'*') => {
                depth += 1;
                i += 2;
            }
            (b'*', b'/') => {
                depth -= 1;
                i += 2;
                if depth == 0 {
                    return Ok(i);
                }
            }
            _ => i += 1,
        }
    }
    Err(LexError::Unterminated("comment", start))
}

fn number(text: &str, start: usize, out: &mut Vec<Token>) -> usize {
    let bytes = text.as_bytes();
    let mut i = start;
    while i < bytes.len() {
        let b = bytes[i];
        let exponent_sign = matches!(b, b'+' | b'-')
            && i > start
            && matches!(bytes[i - 1], b'e' | b'E' | b'p' | b'P')
            && !text[start..i].starts_with("0x")
            && !text[start..i].starts_with("0X");
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || exponent_sign {
            i += 1;
        } else {
            break;
        }
    }
    out.push(Token::Number(text[start..i].to_string()));
    i
}

/// A quoted text starting at `start`: its unescaped content and the index after it.
fn quoted(
    text: &str,
    start: usize,
    quote: u8,
    what: &'static str,
) -> Result<(String, usize), LexError> {
    let bytes = text.as_bytes();
    let mut out: Vec<u8> = Vec::new();
    let mut i = start + 1;
    while i < bytes.len() {
        let b = bytes[i];
        if b == quote {
            if bytes.get(i + 1) == Some(&quote) {
                out.push(quote);
                i += 2;
                continue;
            }
            let s = String::from_utf8(out).map_err(|_| LexError::Escape(start))?;
            return Ok((s, i + 1));
        }
        if b == b'\\' {
            let e = *bytes
                .get(i + 1)
                .ok_or(LexError::Unterminated(what, start))?;
            i += 2;
            match e {
                b'n' => out.push(b'\n'),
                b't' => out.push(b'\t'),
                b'r' => out.push(b'\r'),
                b'0' => out.push(0),
                b'b' => out.push(8),
                b'f' => out.push(12),
                b'a' => out.push(7),
                b'v' => out.push(11),
                b'e' => out.push(27),
                b'x' | b'X' => {
                    let hex = text.get(i..i + 2).ok_or(LexError::Escape(i))?;
                    out.push(u8::from_str_radix(hex, 16).map_err(|_| LexError::Escape(i))?);
                    i += 2;
                }
                // any other escaped character stands for itself (`\'`, `\\`, `` \` ``, `\"`, …)
                other => out.push(other),
            }
            continue;
        }
        out.push(b);
        i += 1;
    }
    Err(LexError::Unterminated(what, start))
}

/// A name quoted the operator's way: backquotes, with `` ` `` and `\` escaped and control
/// characters as `\xHH`.
pub fn quote_name(name: &str) -> String {
    quote(name, '`')
}

/// A string literal quoted the operator's way (see [`quote_name`]).
pub fn quote_string(value: &str) -> String {
    quote(value, '\'')
}

fn quote(value: &str, q: char) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push(q);
    for c in value.chars() {
        match c {
            c if c == q || c == '\\' => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02X}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push(q);
    out
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Token::Word(w) | Token::Number(w) => f.write_str(w),
            Token::Quoted(n) => f.write_str(&quote_name(n)),
            Token::Str(s) => f.write_str(&quote_string(s)),
            Token::Punct(p) => f.write_str(p),
        }
    }
}

/// Tokens written back as one statement: separated by single spaces, none around `.` and none
/// inside brackets' edges or before a comma.
pub fn render(tokens: &[Token]) -> String {
    let mut out = String::new();
    let mut glue = true;
    for t in tokens {
        let tight = t.is(".") || t.is(",") || t.is(")") || t.is("]");
        if !glue && !tight {
            out.push(' ');
        }
        out.push_str(&t.to_string());
        glue = t.is(".") || t.is("(") || t.is("[");
    }
    out
}

/// `statement` with every string literal replaced by `'…'`: what may be logged of a statement
/// whose literals may hold credentials (an engine's password, an S3 key). A text the lexer
/// refuses is reduced to its first word.
pub fn mask_literals(statement: &str) -> String {
    match tokenize(statement) {
        Ok(tokens) => render(
            &tokens
                .into_iter()
                .map(|t| match t {
                    Token::Str(_) => Token::Word("'…'".into()),
                    t => t,
                })
                .collect::<Vec<_>>(),
        ),
        Err(_) => format!("{} …", first_word(statement)),
    }
}

fn first_word(statement: &str) -> String {
    statement
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
        .take(32)
        .collect()
}

/// What a statement is, for an error message: its leading words and names up to its first
/// bracket or literal, at most eight tokens (`CREATE TABLE IF NOT EXISTS db.t`, `BACKUP
/// DATABASE db TO S3`, `ALTER TABLE db.t ATTACH PART`). Never a string literal.
pub fn summary(statement: &str) -> String {
    let Ok(tokens) = tokenize(statement) else {
        return format!("{} …", first_word(statement));
    };
    let mut head: Vec<Token> = Vec::new();
    for t in tokens.iter() {
        if matches!(t, Token::Str(_)) || t.is("(") || t.is(";") || head.len() == 8 {
            break;
        }
        head.push(t.clone());
    }
    let mut s = render(&head);
    if head.len() < tokens.len() {
        s.push_str(" …");
    }
    s
}

/// `message` with every string literal of `statement` of three or more characters replaced by
/// `'…'`: a server's error text may quote the statement it failed on, credentials included.
pub fn hide_literals_of(statement: &str, message: &str) -> String {
    let literals: Vec<String> = match tokenize(statement) {
        Ok(tokens) => tokens
            .into_iter()
            .filter_map(|t| match t {
                Token::Str(s) if s.chars().count() >= 3 => Some(s),
                _ => None,
            })
            .collect(),
        // not lexed: hide every quoted run of the statement's text
        Err(_) => statement
            .split('\'')
            .skip(1)
            .step_by(2)
            .filter(|s| s.chars().count() >= 3)
            .map(str::to_string)
            .collect(),
    };
    let mut out = message.to_string();
    let mut sorted = literals;
    sorted.sort_by_key(|s| std::cmp::Reverse(s.len()));
    for l in &sorted {
        out = out.replace(l.as_str(), "…");
        // the server may quote the literal with its escapes
        let escaped = quote_string(l);
        let inner = &escaped[1..escaped.len() - 1];
        if inner != l {
            out = out.replace(inner, "…");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<Token> {
        tokenize(s).unwrap()
    }

    #[test]
    fn statements_split_into_words_names_strings_and_punctuation() {
        assert_eq!(
            words(
                "CREATE TABLE `d``b`.\"t\\\"x\" (x UInt8 DEFAULT 'it''s\\n') -- c\n/* a /* b */ */"
            ),
            vec![
                Token::Word("CREATE".into()),
                Token::Word("TABLE".into()),
                Token::Quoted("d`b".into()),
                Token::Punct("."),
                Token::Quoted("t\"x".into()),
                Token::Punct("("),
                Token::Word("x".into()),
                Token::Word("UInt8".into()),
                Token::Word("DEFAULT".into()),
                Token::Str("it's\n".into()),
                Token::Punct(")"),
            ]
        );
        assert_eq!(
            words("t.1 + .5e-3 - 0x1F"),
            vec![
                Token::Word("t".into()),
                Token::Punct("."),
                Token::Number("1".into()),
                Token::Punct("+"),
                Token::Number(".5e-3".into()),
                Token::Punct("-"),
                Token::Number("0x1F".into()),
            ]
        );
    }

    #[test]
    fn what_the_lexer_does_not_know_is_refused() {
        assert!(matches!(
            tokenize("SELECT 'open"),
            Err(LexError::Unterminated("string", 7))
        ));
        assert!(matches!(
            tokenize("SELECT $$x$$"),
            Err(LexError::Unexpected('$', 7))
        ));
        assert!(tokenize("SELECT /* never closed").is_err());
        assert!(tokenize("SELECT `a").is_err());
        assert!(
            tokenize("SELECT 'é'").is_ok(),
            "UTF-8 inside literals is fine"
        );
        assert!(tokenize("SELECT é").is_err(), "outside, it is not SQL");
    }

    /// A statement rebuilt from its tokens means what the tokens say: quotes and escapes
    /// cannot end a literal or name early, comments are gone, control characters are escaped.
    #[test]
    fn rendering_quotes_names_and_strings_canonically() {
        let t = words(
            "CREATE TABLE db.t(x String DEFAULT 'a\\'; DROP', `y``z` Array(UInt8)) ENGINE=Log -- x",
        );
        assert_eq!(
            render(&t),
            "CREATE TABLE db.t (x String DEFAULT 'a\\'; DROP', `y\\`z` Array (UInt8)) ENGINE = Log"
        );
        assert_eq!(render(&words("SELECT '\x01\\\\'")), "SELECT '\\x01\\\\'");
        // what rendering writes, lexing reads back the same
        let again = words(&render(&t));
        assert_eq!(again, t);
    }

    /// Decision 35: what is logged of, or said about, a statement holds none of its literals.
    #[test]
    fn summaries_and_masks_hold_no_literal() {
        let backup = "BACKUP DATABASE `db` TO S3('http://s3/b/', 'AKIA', 'very-secret') ASYNC";
        assert_eq!(summary(backup), "BACKUP DATABASE `db` TO S3 …");
        assert_eq!(
            mask_literals(backup),
            "BACKUP DATABASE `db` TO S3 ('…', '…', '…') ASYNC"
        );
        let mysql = "CREATE TABLE db.m (x UInt8) ENGINE = MySQL('h:3306', 'd', 't', 'u', 'pw-123')";
        assert_eq!(summary(mysql), "CREATE TABLE db.m …");
        assert!(!mask_literals(mysql).contains("pw-123"));
        assert_eq!(
            summary("SYSTEM SYNC REPLICA db.t"),
            "SYSTEM SYNC REPLICA db.t"
        );
        assert_eq!(
            summary("SELECT 'x"),
            "SELECT …",
            "not lexed: the first word only"
        );
        let message =
            "Code: 62. Syntax error: failed at position 40 ('very-secret'): 'very-secret') ASYNC";
        let hidden = hide_literals_of(backup, message);
        assert!(!hidden.contains("very-secret"), "{hidden}");
        assert!(!hide_literals_of(backup, "S3 said AKIA is unknown").contains("AKIA"));
        let escaped = "INSERT INTO t VALUES ('it\\'s-secret')";
        assert!(!hide_literals_of(escaped, "failed at ('it\\'s-secret')").contains("secret"));
    }
}
