//! Fuzz target: the engine pool's HTTP/1.1 response-head parser
//! (`pair_http::h1::parse_response`), which reads every answer a local
//! engine sends. It must never panic; an accepted head carries no
//! hop-by-hop header, frames its body as RFC 9112 §6.3 says (none for HEAD,
//! 1xx, 204 and 304; to the connection's end only when nothing else says),
//! never keeps a connection whose framing is unsure, and the verdict does
//! not depend on how the bytes were split across reads.
#![no_main]

use bytes::BytesMut;
use http::header::{CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
use libfuzzer_sys::fuzz_target;
use pair_http::h1::{self, BodyLen, FramingError, ParsedResponse};

fn parse(
    bytes: &[u8],
    head_request: bool,
) -> (Result<Option<ParsedResponse>, FramingError>, BytesMut) {
    let mut buf = BytesMut::from(bytes);
    let r = h1::parse_response(&mut buf, head_request);
    (r, buf)
}

fuzz_target!(|input: &[u8]| {
    // First byte: the request was a HEAD (low bit), where a first read
    // would have stopped (the rest).
    let Some((&pick, data)) = input.split_first() else {
        return;
    };
    let head_request = pick & 1 == 1;
    let (whole, rest) = parse(data, head_request);
    if let Ok(Some(head)) = &whole {
        check_head(data, head, &rest, head_request);
    }
    if let Ok(None) = &whole {
        // Interim answers are taken off; nothing else is, nor changed.
        assert!(
            data.ends_with(&rest),
            "an incomplete head changed the buffer"
        );
    }
    let cut = usize::from(pick >> 1) * data.len() / 127;
    let (first, _) = parse(&data[..cut], head_request);
    match (first, &whole) {
        (Ok(None), _) => {}
        (Ok(Some(a)), Ok(Some(b))) => {
            assert_eq!(
                (a.status, a.body, a.keep_alive),
                (b.status, b.body, b.keep_alive)
            );
            let fields = |h: &ParsedResponse| {
                h.fields
                    .iter()
                    .map(|(k, v)| (k.to_vec(), v.to_vec()))
                    .collect::<Vec<_>>()
            };
            assert_eq!(fields(&a), fields(b), "a split read kept other fields");
        }
        (Err(a), Err(b)) => assert_eq!(&a, b, "a split read failed otherwise"),
        (a, b) => panic!("cut at {cut}: {a:?}, whole: {b:?}"),
    }
});

fn check_head(data: &[u8], head: &ParsedResponse, rest: &[u8], head_request: bool) {
    assert!(
        data.ends_with(rest),
        "the buffer does not end as the input did"
    );
    assert!(
        !head.status.is_informational() || head.status == 101,
        "an interim answer returned"
    );
    for (name, _) in head.fields.iter() {
        for hop in [TRANSFER_ENCODING, CONNECTION] {
            assert!(
                !name.eq_ignore_ascii_case(hop.as_str().as_bytes()),
                "hop-by-hop {hop} kept"
            );
        }
        assert!(
            !name.eq_ignore_ascii_case(b"keep-alive"),
            "hop-by-hop keep-alive kept"
        );
    }
    let bodiless = h1::bodiless(head.status, head_request);
    if bodiless {
        assert_eq!(head.body, BodyLen::Length(0), "a body on a bodiless answer");
    }
    if head.fields.contains(&CONTENT_LENGTH) {
        assert!(
            bodiless,
            "Content-Length kept beside a body that carries its own"
        );
    }
    if head.body == BodyLen::Close {
        assert!(!head.keep_alive, "kept a connection read to its end");
    }
}
