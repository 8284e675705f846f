//! A request's `model`, rewritten where it stands: the body with another
//! name in its place ([`splice`]), the rest of its bytes as the client
//! wrote them. A node's pipeline and the edge SDK both put an alias's
//! target in a request through [`splice`]; a node finds the value's span
//! in its own one-pass scan of the body, the SDK with [`span`].

use bytes::Bytes;

use crate::json::Cursor;

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
/// The body's syntax is checked as it is read ([`crate::json::Cursor`]:
/// UTF-8, strings, escapes, numbers, literals, brackets, nesting, nothing
/// after the object); a `\u` escape is checked to pair into a character
/// only in member names.
pub fn span(body: &[u8]) -> Option<(usize, usize)> {
    let mut c = Cursor::new(std::str::from_utf8(body).ok()?);
    c.ws();
    c.eat(b'{', "").ok()?;
    c.ws();
    let mut model = None;
    let mut seen = false;
    if c.peek()? == b'}' {
        c.i += 1;
    } else {
        loop {
            c.ws();
            let named = *c.name().ok()? == *b"model";
            c.ws();
            c.eat(b':', "").ok()?;
            c.ws();
            let at = c.i;
            let string = c.peek()? == b'"';
            c.value(1).ok()?;
            if named {
                if seen {
                    return None;
                }
                seen = true;
                model = string.then_some((at, c.i));
            }
            c.ws();
            match c.peek()? {
                b',' => c.i += 1,
                b'}' => {
                    c.i += 1;
                    break;
                }
                _ => return None,
            }
        }
    }
    c.end().ok()?;
    model
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
