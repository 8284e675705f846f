//! Fuzz target: the face's own HTTP/1.1 request-head parser
//! (`pair_http::h1::parse_request`), the first thing a local client's bytes
//! meet on the hot path. It must never panic; a head it accepts is exactly a
//! prefix of the input, its body framing is what its headers say (RFC 9112
//! §6), an error leaves the buffer as it was, and the verdict does not
//! depend on how the bytes were split across reads.
#![no_main]

use bytes::BytesMut;
use http::Version;
use http::header::{CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
use libfuzzer_sys::fuzz_target;
use pair_http::h1::{self, BodyLen, FramingError, MAX_HEAD, ParsedRequest};

fn parse(bytes: &[u8]) -> (Result<Option<ParsedRequest>, FramingError>, BytesMut) {
    let mut buf = BytesMut::from(bytes);
    let r = h1::parse_request(&mut buf);
    (r, buf)
}

fuzz_target!(|input: &[u8]| {
    // The first byte picks where a first read would have stopped.
    let Some((&split, data)) = input.split_first() else {
        return;
    };
    let (whole, rest) = parse(data);
    match &whole {
        Ok(Some(head)) => check_head(data, head, &rest),
        Ok(None) => {
            assert_eq!(&rest[..], data, "an incomplete head took bytes");
            assert!(data.len() <= MAX_HEAD, "an over-long head waits for more");
        }
        Err(_) => assert_eq!(&rest[..], data, "an error changed the buffer"),
    }
    // The same bytes, the first read cut short: a head complete in it is the
    // same head, an error in it is the same error.
    let cut = usize::from(split) * data.len() / 255;
    let (first, _) = parse(&data[..cut]);
    match (first, &whole) {
        (Ok(None), _) => {}
        (Ok(Some(a)), Ok(Some(b))) => {
            assert_eq!(a.raw, b.raw, "a split read parsed another head");
            assert_eq!(
                (a.body, a.keep_alive, a.special),
                (b.body, b.keep_alive, b.special)
            );
        }
        (Err(a), Err(b)) => assert_eq!(&a, b, "a split read failed otherwise"),
        (a, b) => panic!("cut at {cut}: {a:?}, whole: {b:?}"),
    }
});

fn check_head(data: &[u8], head: &ParsedRequest, rest: &[u8]) {
    let n = head.raw.len();
    assert_eq!(
        &data[..n],
        &head.raw[..],
        "the head is not the input's prefix"
    );
    assert_eq!(&data[n..], rest, "the buffer does not start at the body");
    assert!(n <= MAX_HEAD);
    assert!(
        head.raw.ends_with(b"\n\n") || head.raw.ends_with(b"\n\r\n"),
        "head not ended"
    );
    let at = head.target.as_ptr() as usize - head.raw.as_ptr() as usize;
    assert!(at + head.target.len() <= n, "the target is not in the head");

    let values = |name| {
        head.headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.to_vec())
            .collect::<Vec<_>>()
    };
    let codings = values(TRANSFER_ENCODING.as_str().as_bytes());
    let lengths = values(CONTENT_LENGTH.as_str().as_bytes());
    match head.body {
        BodyLen::Chunked => assert!(!codings.is_empty(), "chunked without a coding"),
        BodyLen::Length(len) => {
            assert!(codings.is_empty(), "a coding framed by length");
            // Every Content-Length says this length, in digits only.
            for v in &lengths {
                let digits = v.trim_ascii();
                assert!(
                    !digits.is_empty() && digits.iter().all(u8::is_ascii_digit),
                    "{v:?}"
                );
                assert_eq!(
                    std::str::from_utf8(digits).unwrap().parse::<u64>().ok(),
                    Some(len)
                );
            }
            if lengths.is_empty() {
                assert_eq!(len, 0, "a length out of nowhere");
            }
        }
        BodyLen::Close => panic!("a request framed by the connection's end"),
    }
    let close = values(CONNECTION.as_str().as_bytes())
        .iter()
        .any(|v| h1::tokens(v).any(|t| t.eq_ignore_ascii_case(b"close")));
    if head.version == Version::HTTP_11 {
        assert_eq!(head.keep_alive, !close, "keep-alive against Connection");
    } else if close {
        assert!(!head.keep_alive, "HTTP/1.0 kept despite close");
    }
}
