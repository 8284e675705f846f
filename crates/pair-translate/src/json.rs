//! One JSON syntax cursor for the readers that must not build a tree of a
//! request: the proxy's one pass over a body for what routing needs, and
//! [`crate::model::span`], which finds the model's name to replace it.
//! It checks RFC 8259 syntax as it moves (strings, escapes, numbers,
//! literals, brackets) and skips a value without allocating, however deep,
//! up to [`MAX_DEPTH`]. Member names with escapes are decoded as
//! `serde_json` decodes them, so a reader compares names as serde would
//! and refuses what serde refuses (a lone surrogate escape).

use std::borrow::Cow;

/// How deep arrays and objects may nest in a body, the body's own object
/// included: as deep as `serde_json` parses a value.
pub const MAX_DEPTH: usize = 127;

/// Where and why a body is not JSON.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} at byte {at}")]
pub struct JsonError {
    pub what: &'static str,
    pub at: usize,
}

/// One step of a read: its result, or where the JSON went wrong.
pub type Step<T> = Result<T, JsonError>;

/// A cursor over a document already checked to be UTF-8.
#[derive(Debug)]
pub struct Cursor<'a> {
    text: &'a str,
    /// The byte the cursor is at.
    pub i: usize,
}

impl<'a> Cursor<'a> {
    /// A cursor at the start of `text`.
    #[inline]
    pub fn new(text: &'a str) -> Self {
        Self { text, i: 0 }
    }

    /// The whole document.
    #[inline]
    pub fn text(&self) -> &'a str {
        self.text
    }

    /// The whole document's bytes.
    #[inline]
    pub fn bytes(&self) -> &'a [u8] {
        self.text.as_bytes()
    }

    /// An error here.
    #[inline]
    pub fn err<T>(&self, what: &'static str) -> Step<T> {
        Err(JsonError { what, at: self.i })
    }

    /// Skips whitespace.
    #[inline]
    pub fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.bytes().get(self.i) {
            self.i += 1;
        }
    }

    /// The byte at the cursor.
    #[inline]
    pub fn peek(&self) -> Option<u8> {
        self.bytes().get(self.i).copied()
    }

    /// Whether the text at the cursor starts with `word`.
    #[inline]
    pub fn at_word(&self, word: &[u8]) -> bool {
        self.bytes()[self.i..].starts_with(word)
    }

    /// Steps over `c`, else the error `what`.
    #[inline]
    pub fn eat(&mut self, c: u8, what: &'static str) -> Step<()> {
        if self.peek() == Some(c) {
            self.i += 1;
            Ok(())
        } else {
            self.err(what)
        }
    }

    /// Nothing but whitespace is left.
    pub fn end(&mut self) -> Step<()> {
        self.ws();
        if self.i < self.bytes().len() {
            return self.err("trailing characters");
        }
        Ok(())
    }

    /// A member name at the cursor, decoded where it has escapes (rare;
    /// by `serde_json`, whose rules it follows).
    pub fn name(&mut self) -> Step<Cow<'a, [u8]>> {
        if self.peek() != Some(b'"') {
            return self.err("expected a field name");
        }
        let at = self.i;
        let (raw, escaped) = self.string()?;
        if !escaped {
            return Ok(Cow::Borrowed(raw));
        }
        match serde_json::from_str::<String>(&self.text[at..self.i]) {
            Ok(name) => Ok(Cow::Owned(name.into_bytes())),
            Err(_) => Err(JsonError {
                what: "invalid escape in a field name",
                at,
            }),
        }
    }

    /// A skipped object's member name and its colon.
    fn member_name(&mut self) -> Step<()> {
        self.name()?;
        self.ws();
        self.eat(b':', "expected ':'")
    }

    /// Skips one value of any kind, checking its syntax, inside `outer`
    /// open containers. Iterative: the open containers are a stack of bits
    /// (set: an object), so nothing is allocated however deep the value
    /// (up to [`MAX_DEPTH`] with the outer ones).
    pub fn value(&mut self, outer: usize) -> Step<()> {
        let mut objects = 0u128;
        let mut depth = 0usize;
        let room = MAX_DEPTH.saturating_sub(outer);
        loop {
            // A value starts here.
            self.ws();
            match self.peek() {
                Some(b'"') => {
                    self.string()?;
                }
                Some(b'-' | b'0'..=b'9') => self.number()?,
                Some(b't') => self.literal(b"true")?,
                Some(b'f') => self.literal(b"false")?,
                Some(b'n') => self.literal(b"null")?,
                Some(c @ (b'[' | b'{')) => {
                    if depth >= room {
                        return self.err("nesting too deep");
                    }
                    self.i += 1;
                    self.ws();
                    let close = if c == b'[' { b']' } else { b'}' };
                    if self.peek() == Some(close) {
                        self.i += 1;
                    } else {
                        objects = objects << 1 | u128::from(c == b'{');
                        depth += 1;
                        if c == b'{' {
                            self.member_name()?;
                        }
                        continue;
                    }
                }
                Some(_) => return self.err("expected a value"),
                None => return self.err("unexpected end of body"),
            }
            // A value ended: close what it ends, or go on to the next one.
            loop {
                if depth == 0 {
                    return Ok(());
                }
                let object = objects & 1 == 1;
                self.ws();
                match self.peek() {
                    Some(b',') => {
                        self.i += 1;
                        if object {
                            self.ws();
                            self.member_name()?;
                        }
                        break;
                    }
                    Some(b'}') if object => {
                        self.i += 1;
                        objects >>= 1;
                        depth -= 1;
                    }
                    Some(b']') if !object => {
                        self.i += 1;
                        objects >>= 1;
                        depth -= 1;
                    }
                    Some(_) => return self.err("expected ',' or a closing bracket"),
                    None => return self.err("unexpected end of body"),
                }
            }
        }
    }

    /// `true`, `false` or `null`.
    fn literal(&mut self, word: &'static [u8]) -> Step<()> {
        if self.at_word(word) {
            self.i += word.len();
            Ok(())
        } else {
            self.err("expected a value")
        }
    }

    /// A number's syntax: `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`.
    pub fn number(&mut self) -> Step<()> {
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        match self.peek() {
            Some(b'0') => {
                self.i += 1;
                if self.peek().is_some_and(|c| c.is_ascii_digit()) {
                    return self.err("invalid number");
                }
            }
            Some(b'1'..=b'9') => self.digits(),
            _ => return self.err("invalid number"),
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            self.some_digits()?;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.i += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.i += 1;
            }
            self.some_digits()?;
        }
        Ok(())
    }

    fn digits(&mut self) {
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.i += 1;
        }
    }

    fn some_digits(&mut self) -> Step<()> {
        let from = self.i;
        self.digits();
        if self.i == from {
            return self.err("invalid number");
        }
        Ok(())
    }

    /// A string at the cursor (its opening quote): returns the bytes
    /// between the quotes and whether they hold an escape.
    #[inline]
    pub fn string(&mut self) -> Step<(&'a [u8], bool)> {
        let b = self.bytes();
        let start = self.i + 1;
        let mut i = start;
        let mut escaped = false;
        loop {
            i = special(b, i);
            match b.get(i) {
                Some(b'"') => {
                    self.i = i + 1;
                    return Ok((&b[start..i], escaped));
                }
                Some(b'\\') => {}
                Some(_) => {
                    self.i = i;
                    return self.err("control character in a string");
                }
                None => {
                    self.i = i;
                    return self.err("unterminated string");
                }
            }
            escaped = true;
            match b.get(i + 1) {
                Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => i += 2,
                Some(b'u')
                    if b.get(i + 2..i + 6)
                        .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) =>
                {
                    i += 6;
                }
                Some(_) => {
                    self.i = i;
                    return self.err("invalid escape in a string");
                }
                None => {
                    self.i = b.len();
                    return self.err("unterminated string");
                }
            }
        }
    }
}

/// The first byte from `i` on that ends a run of plain string text: a
/// quote, a backslash or a control character (or `b.len()`). Eight bytes
/// at a time: a byte's high bit is set in `found` where it is one of
/// those (exact for the lowest such byte, which is all that is used).
#[inline]
fn special(b: &[u8], mut i: usize) -> usize {
    const ONES: u64 = u64::from_ne_bytes([1; 8]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    let zero = |x: u64| x.wrapping_sub(ONES) & !x;
    while let Some(chunk) = b.get(i..i + 8) {
        let w = u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8]));
        let found = (zero(w ^ (ONES * u64::from(b'"')))
            | zero(w ^ (ONES * u64::from(b'\\')))
            | (w.wrapping_sub(ONES * 0x20) & !w))
            & HIGH;
        if found != 0 {
            return i + (found.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while let Some(&c) = b.get(i) {
        if c == b'"' || c == b'\\' || c < 0x20 {
            break;
        }
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    fn skips(text: &str) -> Step<usize> {
        let mut c = Cursor::new(text);
        c.value(0)?;
        c.end()?;
        Ok(c.i)
    }

    #[test]
    fn a_value_is_skipped_whole_and_checked() {
        let doc = r#" {"a": [1, -2.5e3, "x\"y", true, null, {}], "b": {"c": false}} "#;
        assert_eq!(skips(doc), Ok(doc.len()));
        for bad in [
            "{",
            "[1,]",
            "01",
            "1.",
            "\"a",
            "\"\\x\"",
            "{\"a\" 1}",
            "[1 2]",
            "tru",
            "\"\u{1}\"",
            "{} x",
        ] {
            assert!(skips(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn nesting_stops_at_the_bound() {
        let nest = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(skips(&nest(MAX_DEPTH)).is_ok());
        assert_eq!(
            skips(&nest(MAX_DEPTH + 1)).map_err(|e| e.what),
            Err("nesting too deep")
        );
    }

    #[test]
    fn names_are_decoded_as_serde_decodes_them() {
        let name = |t: &str| Cursor::new(t).name().map(|n| n.into_owned());
        assert_eq!(name(r#""model""#), Ok(b"model".to_vec()));
        assert_eq!(name(r#""mod\u0065l""#), Ok(b"model".to_vec()));
        assert!(name(r#""\ud800""#).is_err(), "a lone surrogate");
        assert!(name("1").is_err());
    }

    /// The eight-byte scan finds the same byte as a plain one, wherever it
    /// falls in a word.
    #[test]
    fn the_word_scan_finds_the_first_special_byte() {
        for at in 0..20 {
            for special_byte in [b'"', b'\\', 0x1f, 0] {
                let mut b = vec![b'a'; 20];
                b[at] = special_byte;
                b.push(b'"');
                assert_eq!(special(&b, 0), at);
            }
        }
        assert_eq!(special(b"abc", 0), 3);
    }
}
