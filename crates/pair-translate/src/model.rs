//! A request's `model`, rewritten where it stands: the body with another
//! name in its place ([`splice`]), the rest of its bytes as the client
//! wrote them. A node's pipeline and the edge SDK both put an alias's
//! target in a request through [`splice`]; a node finds the value's span
//! in its own one-pass scan of the body, the SDK with [`span`].

use bytes::Bytes;

/// The body with `model`, as a JSON string, where `at` (a value's span,
/// quotes included: [`span`]'s, or a node's scan's) was; every other byte
/// as it came. `at` lies within `body` (it panics otherwise).
pub fn splice(body: &[u8], at: (usize, usize), model: &str) -> Bytes {
    let (start, end) = at;
    let mut out = Vec::with_capacity(body.len() - (end - start) + model.len() + 2);
    out.extend_from_slice(&body[..start]);
    quote(model, &mut out);
    out.extend_from_slice(&body[end..]);
    Bytes::from(out)
}

/// Appends `s` as a JSON string, escaped as `serde_json` writes it: `"`,
/// `\` and control characters, nothing else.
fn quote(s: &str, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut plain = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let short: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0..0x20 => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[plain..i]);
        if short.is_empty() {
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(b >> 4)]);
            out.push(HEX[usize::from(b & 0xf)]);
        } else {
            out.extend_from_slice(short);
        }
        plain = i + 1;
    }
    out.extend_from_slice(&bytes[plain..]);
    out.push(b'"');
}

/// Where the value of the body's top-level `model` is, quotes included,
/// when it is a string. `None` when the body is not a JSON object, has no
/// top-level `model`, has one that is not a string, or has it twice (a
/// node refuses such a body). A field name is compared as JSON decodes it
/// (`"mod\u0065l"` is `model`); members of nested values are skipped, so
/// their `model`s are not the request's.
///
/// The body's syntax is checked as it is read (UTF-8, strings, escapes,
/// numbers, literals, brackets, nothing after the object), but not that a
/// `\u` escape pairs into a character.
pub fn span(body: &[u8]) -> Option<(usize, usize)> {
    std::str::from_utf8(body).ok()?;
    let mut s = Scan { b: body, i: 0 };
    s.ws();
    s.eat(b'{')?;
    s.ws();
    let mut model = None;
    let mut seen = false;
    if s.peek()? == b'}' {
        s.i += 1;
    } else {
        loop {
            s.ws();
            let named = s.key()?;
            s.ws();
            s.eat(b':')?;
            s.ws();
            let at = s.i;
            let string = s.peek()? == b'"';
            s.value()?;
            if named {
                if seen {
                    return None;
                }
                seen = true;
                model = string.then_some((at, s.i));
            }
            s.ws();
            match s.peek()? {
                b',' => s.i += 1,
                b'}' => {
                    s.i += 1;
                    break;
                }
                _ => return None,
            }
        }
    }
    s.ws();
    if s.i != body.len() {
        return None;
    }
    model
}

/// A cursor over a body; each step is `None` where the body is not JSON.
struct Scan<'a> {
    b: &'a [u8],
    i: usize,
}

impl Scan<'_> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.peek() {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        (self.peek()? == c).then(|| self.i += 1)
    }

    /// A member name at the cursor: whether it is `model`.
    fn key(&mut self) -> Option<bool> {
        let at = self.i;
        let escaped = self.string()?;
        let quoted = &self.b[at..self.i];
        if !escaped {
            return Some(quoted == b"\"model\"");
        }
        serde_json::from_slice::<String>(quoted)
            .ok()
            .map(|name| name == "model")
    }

    /// A member name and its colon, inside a skipped value.
    fn member(&mut self) -> Option<()> {
        self.string()?;
        self.ws();
        self.eat(b':')
    }

    /// A string at the cursor; whether it holds an escape.
    fn string(&mut self) -> Option<bool> {
        self.eat(b'"')?;
        let mut escaped = false;
        loop {
            match self.peek()? {
                b'"' => {
                    self.i += 1;
                    return Some(escaped);
                }
                b'\\' => {
                    escaped = true;
                    match self.b.get(self.i + 1)? {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => self.i += 2,
                        b'u' => {
                            let hex = self.b.get(self.i + 2..self.i + 6)?;
                            if !hex.iter().all(u8::is_ascii_hexdigit) {
                                return None;
                            }
                            self.i += 6;
                        }
                        _ => return None,
                    }
                }
                0..0x20 => return None,
                _ => self.i += 1,
            }
        }
    }

    /// Skips one value of any kind. Iterative: the closing brackets owed
    /// are a stack.
    fn value(&mut self) -> Option<()> {
        let mut owed = Vec::new();
        loop {
            self.ws();
            match self.peek()? {
                b'"' => {
                    self.string()?;
                }
                b't' => self.literal(b"true")?,
                b'f' => self.literal(b"false")?,
                b'n' => self.literal(b"null")?,
                b'-' | b'0'..=b'9' => self.number()?,
                open @ (b'{' | b'[') => {
                    let close = if open == b'{' { b'}' } else { b']' };
                    self.i += 1;
                    self.ws();
                    if self.peek()? == close {
                        self.i += 1;
                    } else {
                        owed.push(close);
                        if close == b'}' {
                            self.member()?;
                        }
                        continue;
                    }
                }
                _ => return None,
            }
            // A value ended: close what it ends, or go on to the next.
            loop {
                let Some(&close) = owed.last() else {
                    return Some(());
                };
                self.ws();
                match self.peek()? {
                    b',' => {
                        self.i += 1;
                        if close == b'}' {
                            self.ws();
                            self.member()?;
                        }
                        break;
                    }
                    c if c == close => {
                        self.i += 1;
                        owed.pop();
                    }
                    _ => return None,
                }
            }
        }
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        self.b[self.i..]
            .starts_with(word)
            .then(|| self.i += word.len())
    }

    /// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`
    fn number(&mut self) -> Option<()> {
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        match self.peek()? {
            b'0' => self.i += 1,
            b'1'..=b'9' => self.digits(),
            _ => return None,
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
        Some(())
    }

    fn digits(&mut self) {
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.i += 1;
        }
    }

    fn some_digits(&mut self) -> Option<()> {
        let from = self.i;
        self.digits();
        (self.i > from).then_some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{Value, json};

    fn spliced(body: &str, model: &str) -> Option<String> {
        let at = span(body.as_bytes())?;
        Some(String::from_utf8(splice(body.as_bytes(), at, model).to_vec()).unwrap())
    }

    #[test]
    fn finds_the_top_level_model_only() {
        let body = r#" { "messages" : [{"model":"no"}], "options": {"model": "nor"},
            "model"	:	"m:7b" , "stream":true } "#;
        let (start, end) = span(body.as_bytes()).unwrap();
        assert_eq!(&body[start..end], r#""m:7b""#);
        assert_eq!(
            spliced(body, "target").unwrap(),
            body.replace(r#""m:7b""#, r#""target""#),
            "every other byte as it came"
        );
        // A name with escapes is the name it decodes to; a value's escapes
        // are kept in the span.
        let body = r#"{"mod\u0065l":"a\"b\u00e9","x":"model"}"#;
        let (start, end) = span(body.as_bytes()).unwrap();
        assert_eq!(&body[start..end], r#""a\"b\u00e9""#);
        assert_eq!(span(br#"{"x":{"model":"m"},"model":"n"}"#), Some((27, 30)));
    }

    #[test]
    fn refuses_what_has_no_single_model_string() {
        for body in [
            r#"{"model":7}"#,
            r#"{"model":null}"#,
            r#"{"model":["m"]}"#,
            r#"{"models":"m"}"#,
            r#"{"x":{"model":"m"}}"#,
            r#"{"model":"m","model":"n"}"#,
            r#"{"model":null,"model":"n"}"#,
            r#"["model","m"]"#,
            r#""model""#,
            r#"{"model":"m"} x"#,
            r#"{"model":"m",}"#,
            r#"{"model":"m""#,
            r#"{"model":"m","x":[1}]}"#,
            r#"{"model":"m","x":01}"#,
            r#"{"model":"m","x":tru}"#,
            r#"{"model":"a\qb"}"#,
            "{\"model\":\"a\nb\"}",
            "",
            "{",
        ] {
            assert_eq!(span(body.as_bytes()), None, "{body}");
        }
        assert_eq!(span(b"{\"model\":\"\xff\"}"), None, "not UTF-8");
        assert_eq!(span(b"{}"), None);
    }

    #[test]
    fn quotes_as_serde_json_does() {
        let odd = "a\"b\\c/d\u{1}\u{1f}\u{7f}\u{8}\u{c}\n\r\té日😀";
        let mut out = Vec::new();
        quote(odd, &mut out);
        assert_eq!(out, serde_json::to_vec(odd).unwrap());
    }

    /// JSON values a few levels deep, with `model` among the names.
    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            (-1e6f64..1e6).prop_map(Value::from),
            any::<String>().prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 24, 5, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::vec((name(), inner), 0..5)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    fn name() -> impl Strategy<Value = String> {
        prop_oneof![Just("model".to_owned()), "[a-z_\"\\\\é]{0,8}"]
    }

    /// A request: an object whose `model` is mostly a string.
    fn request() -> impl Strategy<Value = Value> {
        let model = prop_oneof![
            4 => any::<String>().prop_map(Value::String),
            1 => json_value(),
        ];
        (
            prop::collection::vec((name(), json_value()), 0..5),
            prop::option::weighted(0.9, model),
        )
            .prop_map(|(members, model)| {
                let mut object: serde_json::Map<String, Value> = members.into_iter().collect();
                match model {
                    Some(m) => object.insert("model".to_owned(), m),
                    None => object.remove("model"),
                };
                Value::Object(object)
            })
    }

    proptest! {
        #[test]
        fn splicing_is_a_serde_round_trip(
            request in request(),
            pretty in any::<bool>(),
            model in any::<String>(),
        ) {
            let body = if pretty {
                serde_json::to_vec_pretty(&request).unwrap()
            } else {
                serde_json::to_vec(&request).unwrap()
            };
            let at = span(&body);
            prop_assert_eq!(at.is_some(), request["model"].is_string());
            if let Some(at) = at {
                let mut expected: Value = serde_json::from_slice(&body).unwrap();
                expected["model"] = Value::String(model.clone());
                let out: Value = serde_json::from_slice(&splice(&body, at, &model)).unwrap();
                prop_assert_eq!(out, expected);
            }
        }

        #[test]
        fn the_span_is_the_models_value(request in request()) {
            let body = serde_json::to_vec(&request).unwrap();
            if let Some((start, end)) = span(&body) {
                let value: Value = serde_json::from_slice(&body[start..end]).unwrap();
                prop_assert_eq!(&value, &request["model"]);
            }
        }

        #[test]
        fn finds_nothing_in_what_serde_refuses(
            bytes in prop::collection::vec(any::<u8>(), 0..64),
        ) {
            let at = span(&bytes);
            if serde_json::from_slice::<Value>(&bytes).is_err() {
                prop_assert_eq!(at, None);
            }
        }

        #[test]
        fn reads_a_damaged_body_as_serde_does(
            request in request(),
            at in any::<prop::sample::Index>(),
            byte in prop::sample::select(b"{}[]:,\" -0.eE\x01\xff".to_vec()),
        ) {
            let mut body = serde_json::to_vec(&request).unwrap();
            let i = at.index(body.len());
            body[i] = byte;
            let at = span(&body);
            match serde_json::from_slice::<Value>(&body) {
                Ok(whole) => match at {
                    Some((start, end)) => {
                        let value: Value = serde_json::from_slice(&body[start..end]).unwrap();
                        prop_assert_eq!(&value, &whole["model"]);
                    }
                    None => prop_assert!(!whole["model"].is_string()),
                },
                // Numbers past f64 are the only JSON serde refuses that
                // this scan reads.
                Err(e) if e.to_string().starts_with("number out of range") => {}
                Err(_) => prop_assert_eq!(at, None),
            }
        }
    }

    #[test]
    fn a_model_next_to_nested_models_is_replaced_alone() {
        let request = json!({"model": "alias", "tools": [{"model": "alias"}], "n": {"model": 1}});
        let body = request.to_string();
        let out: Value = serde_json::from_str(&spliced(&body, "target").unwrap()).unwrap();
        assert_eq!(
            out,
            json!({"model": "target", "tools": [{"model": "alias"}], "n": {"model": 1}})
        );
    }
}
