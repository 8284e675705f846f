//! Fuzz target: the chunked-body decoder (`pair_http::h1::Chunked`), which
//! reads every chunked answer an engine streams. On any bytes it must never
//! panic nor hand out more than it was given; on a valid encoding of
//! fuzz-chosen chunks (sizes in either case, extensions, trailers), fed in
//! fuzz-chosen pieces, it must give back exactly the body, end, and leave
//! what follows the body untouched.
#![no_main]

use bytes::{BufMut, BytesMut};
use libfuzzer_sys::fuzz_target;
use pair_http::h1::Chunked;

fuzz_target!(|data: &[u8]| {
    arbitrary_bytes(data);
    round_trip(data);
});

/// Whatever the bytes, fed in two pieces.
fn arbitrary_bytes(data: &[u8]) {
    let Some((&split, data)) = data.split_first() else {
        return;
    };
    let cut = usize::from(split) * data.len() / 255;
    let mut dec = Chunked::Size;
    let mut buf = BytesMut::new();
    let mut out = 0usize;
    for piece in [&data[..cut], &data[cut..]] {
        buf.put_slice(piece);
        loop {
            match dec.decode(&mut buf) {
                Ok(Some(d)) => {
                    assert!(!d.is_empty(), "an empty data piece");
                    out += d.len();
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
    assert!(out <= data.len(), "more data out than bytes in");
}

/// A valid encoding of chunks drawn from `data`, decoded piece by piece.
fn round_trip(data: &[u8]) {
    let mut bytes = data.iter().copied();
    let mut next = || bytes.next().unwrap_or(0);
    let mut body = Vec::new();
    let mut wire = Vec::new();
    let mut cuts = Vec::new();
    for _ in 0..(next() % 8) {
        let len = usize::from(next()) % 40 + 1;
        let chunk: Vec<u8> = (0..len).map(|_| next()).collect();
        let size = format!("{len:x}");
        let size = if next() & 1 == 1 {
            size.to_uppercase()
        } else {
            size
        };
        wire.extend_from_slice(size.as_bytes());
        if next() & 1 == 1 {
            wire.extend_from_slice(b";ext=\"v\"");
        }
        wire.extend_from_slice(b"\r\n");
        wire.extend_from_slice(&chunk);
        wire.extend_from_slice(b"\r\n");
        body.extend_from_slice(&chunk);
        cuts.push(usize::from(next()));
    }
    wire.extend_from_slice(b"0\r\n");
    if next() & 1 == 1 {
        wire.extend_from_slice(b"x-trailer: 1\r\n");
    }
    wire.extend_from_slice(b"\r\n");
    let end = wire.len();
    wire.extend_from_slice(b"NEXT");

    let mut dec = Chunked::Size;
    let mut buf = BytesMut::new();
    let mut got = Vec::new();
    let mut at = 0;
    cuts.push(wire.len());
    for cut in cuts {
        let to = (at + cut).min(wire.len());
        buf.put_slice(&wire[at..to]);
        at = to;
        while let Some(d) = dec.decode(&mut buf).expect("a valid encoding refused") {
            got.extend_from_slice(&d);
        }
    }
    buf.put_slice(&wire[at..]);
    while let Some(d) = dec.decode(&mut buf).expect("a valid encoding refused") {
        got.extend_from_slice(&d);
    }
    assert_eq!(dec, Chunked::Done, "not done after the last chunk");
    assert_eq!(got, body, "the body changed");
    assert_eq!(&buf[..], &wire[end..], "what follows the body was touched");
}
