//! HTTP/1.1 framing for the hot path, on `httparse`: request and response
//! heads, body delimitation (RFC 9112 §6), chunked decoding, and writing
//! heads. The face connection loop ([`crate::server`]) and the engine
//! client ([`crate::client`]) use it instead of hyper's connection
//! machinery (see the crate docs for why). What it does not handle
//! (HTTP/1.0, chunked or `Expect` requests, upgrades) is left to hyper by
//! the caller.

use std::mem::MaybeUninit;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode, Version};

/// Most header lines a head may carry.
pub const MAX_HEADERS: usize = 100;
/// Largest head accepted (request line or status line and headers).
pub const MAX_HEAD: usize = 64 * 1024;

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum FramingError {
    #[error("malformed HTTP head: {0}")]
    Head(String),
    #[error("HTTP head larger than {MAX_HEAD} bytes")]
    HeadTooLarge,
    #[error("invalid content-length")]
    ContentLength,
    #[error("malformed chunked body")]
    Chunk,
}

/// How a message's body is delimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyLen {
    /// Exactly this many bytes (0: no body).
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Until the connection closes (answers only).
    Close,
}

/// A parsed request head.
#[derive(Debug)]
pub struct ParsedRequest {
    pub method: Method,
    /// The request target as sent (origin form for the faces).
    pub target: Bytes,
    pub version: Version,
    pub headers: Fields,
    pub body: BodyLen,
    /// The client wants the connection kept after this exchange.
    pub keep_alive: bool,
    /// `Expect: 100-continue` or an `Upgrade`: hyper's to serve.
    pub special: bool,
    /// The head as it came (for handing the connection on).
    pub raw: Bytes,
}

/// A parsed response head (taken off the connection's buffer).
#[derive(Debug)]
pub struct ParsedResponse {
    pub status: StatusCode,
    /// Without hop-by-hop headers: no `Transfer-Encoding`, `Connection`,
    /// `Keep-Alive` or header a `Connection` names, and `Content-Length`
    /// only on an answer without a body (`body` says how the body is
    /// framed).
    pub fields: Fields,
    pub body: BodyLen,
    /// The connection may carry another request after this answer.
    pub keep_alive: bool,
}

fn version(v: Option<u8>) -> Version {
    match v {
        Some(0) => Version::HTTP_10,
        _ => Version::HTTP_11,
    }
}

/// The header fields, and the framing facts read on the way.
struct Facts {
    fields: Fields,
    length: Option<u64>,
    /// A Transfer-Encoding header was present at all.
    has_coding: bool,
    /// ... and its last coding is chunked.
    chunked: bool,
    close: bool,
    keep_alive_token: bool,
    special: bool,
}

/// Where one header's name and value lie in its head: (name start, name
/// end, value start, value end); heads are at most [`MAX_HEAD`] bytes.
type Span = (u32, u32, u32, u32);

/// A head's header fields as they came: names and values are spans of the
/// head's bytes (checked by httparse), neither copied nor hashed. The hot
/// path reads the few it needs and writes the rest on as they are; a
/// [`HeaderMap`] is built from them only where one is needed.
#[derive(Clone, Debug, Default)]
pub struct Fields {
    head: Bytes,
    spans: Vec<Span>,
}

impl Fields {
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// (name, value) pairs in the order they came; names as sent.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.spans.iter().map(|&(ns, ne, vs, ve)| {
            (
                &self.head[ns as usize..ne as usize],
                &self.head[vs as usize..ve as usize],
            )
        })
    }

    /// The first value of `name` (names compare without regard to case).
    pub fn get(&self, name: &HeaderName) -> Option<&[u8]> {
        let want = name.as_str().as_bytes();
        // Lengths first, from the spans: most fields are skipped without
        // slicing the head. A header name's text is lowercase.
        self.spans
            .iter()
            .find(|&&(ns, ne, _, _)| {
                (ne - ns) as usize == want.len()
                    && is_name(&self.head[ns as usize..ne as usize], want)
            })
            .map(|&(_, _, vs, ve)| &self.head[vs as usize..ve as usize])
    }

    pub fn contains(&self, name: &HeaderName) -> bool {
        self.get(name).is_some()
    }

    /// Appends each field as a `name: value` line, unless `skip` says so.
    pub fn write(&self, out: &mut Vec<u8>, skip: impl Fn(&[u8]) -> bool) {
        for (name, value) in self.iter().filter(|(name, _)| !skip(name)) {
            write_field(out, name, value);
        }
    }

    /// Each field as a header-map entry (values share the head's bytes),
    /// or why a map cannot hold it (httparse accepts a few names and
    /// values `http` refuses).
    pub fn entries(
        &self,
    ) -> impl Iterator<Item = Result<(HeaderName, HeaderValue), FramingError>> + '_ {
        self.spans.iter().map(|&(ns, ne, vs, ve)| {
            let name = &self.head[ns as usize..ne as usize];
            let name = HeaderName::from_bytes(name).map_err(|_| {
                FramingError::Head(format!(
                    "bad header name {:?}",
                    String::from_utf8_lossy(name)
                ))
            })?;
            let value = HeaderValue::from_maybe_shared(self.head.slice(vs as usize..ve as usize))
                .map_err(|_| FramingError::Head(format!("bad value for {name}")))?;
            Ok((name, value))
        })
    }

    /// As a header map, with `room` for more; the first field a map cannot
    /// hold is an error.
    pub fn to_map(&self, room: usize) -> Result<HeaderMap, FramingError> {
        let mut map = HeaderMap::with_capacity(self.spans.len() + room);
        for entry in self.entries() {
            let (name, value) = entry?;
            map.append(name, value);
        }
        Ok(map)
    }
}

/// A message's headers: as they came, or as a map.
#[derive(Clone, Debug)]
pub enum Headers {
    /// As they came off the wire (an engine's answer less its framing
    /// headers, a loopback client's request).
    Raw(Fields),
    /// A built map (answers: already without hop-by-hop headers).
    Map(HeaderMap),
}

impl Headers {
    pub fn len(&self) -> usize {
        match self {
            Headers::Raw(f) => f.len(),
            Headers::Map(m) => m.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The first value of `name`.
    pub fn get(&self, name: &HeaderName) -> Option<&[u8]> {
        match self {
            Headers::Raw(f) => f.get(name),
            Headers::Map(m) => m.get(name).map(HeaderValue::as_bytes),
        }
    }

    pub fn contains(&self, name: &HeaderName) -> bool {
        self.get(name).is_some()
    }

    /// As a map, with `room` for more headers. Fields that a map cannot
    /// hold (httparse accepts a few values `http` refuses) are dropped with
    /// a warning rather than failing the message.
    pub fn into_map(self, room: usize) -> HeaderMap {
        match self {
            Headers::Map(m) => m,
            Headers::Raw(f) => {
                let mut m = HeaderMap::with_capacity(f.len() + room);
                for entry in f.entries() {
                    match entry {
                        Ok((name, value)) => {
                            m.append(name, value);
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "a header field a map cannot hold was dropped");
                        }
                    }
                }
                m
            }
        }
    }

    /// Appends each header as a `name: value` line, less those `skip`
    /// says (it is given the name's bytes, in whatever case they came).
    pub fn write(&self, out: &mut Vec<u8>, skip: impl Fn(&[u8]) -> bool) {
        match self {
            Headers::Raw(f) => f.write(out, skip),
            Headers::Map(m) => write_headers(
                out,
                m.iter().filter(|(name, _)| !skip(name.as_str().as_bytes())),
            ),
        }
    }
}

/// Whether `name` is `lower` regardless of case, where `lower` has no
/// uppercase letters (a [`HeaderName`]'s text, or a constant): a byte
/// matches if it is the same, or the uppercase of a lowercase letter
/// (less work than lowercasing both sides, as `eq_ignore_ascii_case` does).
#[inline]
pub fn is_name(name: &[u8], lower: &[u8]) -> bool {
    debug_assert!(!lower.iter().any(u8::is_ascii_uppercase));
    name.len() == lower.len()
        && name
            .iter()
            .zip(lower)
            .all(|(&a, &b)| a == b || (a | 0x20 == b && b.is_ascii_lowercase()))
}

/// Whether `name` is one of `list` (lower-case names; compared without
/// regard to case).
pub fn is_one_of(name: &[u8], list: &[&[u8]]) -> bool {
    list.iter().any(|h| is_name(name, h))
}

/// httparse's header slots, left uninitialised (a 100-slot array of
/// initialised headers is a 3 KiB memset per parse attempt).
type RawHeaders<'b> = [MaybeUninit<httparse::Header<'b>>; MAX_HEADERS];

/// The spans of `raw`'s headers within `base` (which they were parsed
/// from): the fields' own list, which [`collect`] then filters in place.
fn spans(base: &[u8], raw: &[httparse::Header<'_>]) -> Vec<Span> {
    // Offsets fit: the head was checked against MAX_HEAD.
    let at = |p: *const u8| (p as usize - base.as_ptr() as usize) as u32;
    raw.iter()
        .map(|h| {
            let name = at(h.name.as_ptr());
            let value = at(h.value.as_ptr());
            (
                name,
                name + h.name.len() as u32,
                value,
                value + h.value.len() as u32,
            )
        })
        .collect()
}

/// Which headers [`collect`] leaves out of the fields.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Keep {
    /// Requests: every header (the router and hyper's fallback see them).
    All,
    /// Answers: no hop-by-hop header (`Transfer-Encoding`, `Connection`,
    /// `Keep-Alive`, and any header a `Connection` names): the proxy reads
    /// this hop's framing here and frames anew for its client; nor
    /// `Content-Length` when a body follows (the body carries its exact
    /// length).
    EndToEnd { length: bool },
}

/// Reads the framing facts off a head's fields and keeps the fields `keep`
/// says; names and values stay where they are in `head`.
fn collect(head: &Bytes, mut spans: Vec<Span>, keep: Keep) -> Result<Facts, FramingError> {
    let mut f = Facts {
        fields: Fields {
            head: head.clone(),
            spans: Vec::new(),
        },
        length: None,
        has_coding: false,
        chunked: false,
        close: false,
        keep_alive_token: false,
        special: false,
    };
    let answer = keep != Keep::All;
    // An answer's `Connection` values that name other headers (rare).
    let mut naming: Vec<Span> = Vec::new();
    // Kept spans are moved down to the front of `spans`.
    let mut kept = 0;
    for i in 0..spans.len() {
        let span = spans[i];
        let (ns, ne, vs, ve) = (
            span.0 as usize,
            span.1 as usize,
            span.2 as usize,
            span.3 as usize,
        );
        let name = &head[ns..ne];
        let raw_value = &head[vs..ve];
        // Dispatched on the name's length first: most fields (Host, Date,
        // Content-Type, Server, ...) are compared with nothing.
        match name.len() {
            14 if is_name(name, b"content-length") => {
                // Digits only (Rust's parser would take a leading `+`).
                let digits = raw_value.trim_ascii();
                if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
                    return Err(FramingError::ContentLength);
                }
                let n = std::str::from_utf8(digits)
                    .ok()
                    .and_then(|v| v.parse::<u64>().ok())
                    .ok_or(FramingError::ContentLength)?;
                if f.length.is_some_and(|m| m != n) {
                    return Err(FramingError::ContentLength);
                }
                f.length = Some(n);
                if keep == (Keep::EndToEnd { length: false }) {
                    continue;
                }
            }
            17 if is_name(name, b"transfer-encoding") => {
                // Chunked must be the last coding; anything else (an empty or
                // unreadable value included) is read to the end of the
                // connection (answers) or left to hyper (requests).
                f.has_coding = true;
                f.chunked = tokens(raw_value)
                    .last()
                    .is_some_and(|c| is_name(c, b"chunked"));
                if answer {
                    continue;
                }
            }
            10 if is_name(name, b"connection") => {
                let mut plain = true;
                for token in tokens(raw_value) {
                    if is_name(token, b"close") {
                        f.close = true;
                    } else if is_name(token, b"keep-alive") {
                        f.keep_alive_token = true;
                    } else {
                        plain = false;
                        if is_name(token, b"upgrade") {
                            f.special = true;
                        }
                    }
                }
                if answer {
                    if !plain {
                        naming.push(span);
                    }
                    continue;
                }
            }
            6 | 7 if is_name(name, b"expect") || is_name(name, b"upgrade") => f.special = true,
            10 if answer && is_name(name, b"keep-alive") => continue,
            _ => {}
        }
        spans[kept] = span;
        kept += 1;
    }
    spans.truncate(kept);
    f.fields.spans = spans;
    if !naming.is_empty() {
        let named = |n: &[u8]| {
            naming.iter().any(|&(_, _, vs, ve)| {
                tokens(&head[vs as usize..ve as usize]).any(|t| t.eq_ignore_ascii_case(n))
            })
        };
        f.fields
            .spans
            .retain(|&(ns, ne, _, _)| !named(&head[ns as usize..ne as usize]));
    }
    Ok(f)
}

/// The non-empty items of a comma-separated header value, trimmed.
pub fn tokens(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|t| !t.is_empty())
}

/// Whether an answer with this status (to a HEAD request or not) carries
/// no body, whatever its headers say (RFC 9112 §6.3).
pub fn bodiless(status: StatusCode, head_request: bool) -> bool {
    head_request
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
}

fn keep_alive(v: Version, f: &Facts) -> bool {
    if v == Version::HTTP_10 {
        f.keep_alive_token && !f.close
    } else {
        !f.close
    }
}

/// Parses a request head at the start of `buf` and takes it off `buf`
/// (which then starts at the body); `Ok(None)`: not all here yet. On an
/// error `buf` is left as it was.
pub fn parse_request(buf: &mut BytesMut) -> Result<Option<ParsedRequest>, FramingError> {
    let (len, spans, method, version, target) = {
        let mut raw: RawHeaders<'_> = [const { MaybeUninit::uninit() }; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut []);
        let len = match req.parse_with_uninit_headers(buf, &mut raw) {
            Ok(httparse::Status::Complete(n)) if n <= MAX_HEAD => n,
            Ok(httparse::Status::Partial) if buf.len() <= MAX_HEAD => return Ok(None),
            Ok(_) => return Err(FramingError::HeadTooLarge),
            Err(e) => return Err(FramingError::Head(e.to_string())),
        };
        let method = Method::from_bytes(req.method.unwrap_or("").as_bytes())
            .map_err(|_| FramingError::Head("bad method".into()))?;
        let path = req.path.unwrap_or("/");
        let start = path.as_ptr() as usize - buf.as_ptr() as usize;
        (
            len,
            spans(buf, req.headers),
            method,
            version(req.version),
            start..start + path.len(),
        )
    };
    let head = buf.split_to(len).freeze();
    let f = match collect(&head, spans, Keep::All) {
        Ok(f) => f,
        Err(e) => {
            // Put the head back for whoever serves the connection next.
            let rest = buf.split();
            buf.extend_from_slice(&head);
            buf.unsplit(rest);
            return Err(e);
        }
    };
    let body = if f.has_coding {
        // Only chunked is valid on a request, and any coding (readable or
        // not) is the caller's to hand to hyper.
        BodyLen::Chunked
    } else {
        BodyLen::Length(f.length.unwrap_or(0))
    };
    Ok(Some(ParsedRequest {
        method,
        target: head.slice(target),
        version,
        keep_alive: keep_alive(version, &f),
        special: f.special,
        headers: f.fields,
        body,
        raw: head,
    }))
}

/// Parses a response head at the start of `buf` and takes it off `buf`,
/// skipping interim (1xx) answers; `head_request`: the request was a HEAD
/// (no body follows).
pub fn parse_response(
    buf: &mut BytesMut,
    head_request: bool,
) -> Result<Option<ParsedResponse>, FramingError> {
    loop {
        let (len, spans, status, version) = {
            let mut raw: RawHeaders<'_> = [const { MaybeUninit::uninit() }; MAX_HEADERS];
            let mut resp = httparse::Response::new(&mut []);
            let len = match httparse::ParserConfig::default()
                .parse_response_with_uninit_headers(&mut resp, buf, &mut raw)
            {
                Ok(httparse::Status::Complete(n)) if n <= MAX_HEAD => n,
                Ok(httparse::Status::Partial) if buf.len() <= MAX_HEAD => return Ok(None),
                Ok(_) => return Err(FramingError::HeadTooLarge),
                Err(e) => return Err(FramingError::Head(e.to_string())),
            };
            let status = StatusCode::from_u16(resp.code.unwrap_or(0))
                .map_err(|_| FramingError::Head("bad status".into()))?;
            (len, spans(buf, resp.headers), status, version(resp.version))
        };
        if status.is_informational() && status != StatusCode::SWITCHING_PROTOCOLS {
            buf.advance(len);
            continue;
        }
        let head = buf.split_to(len).freeze();
        let bodiless = bodiless(status, head_request);
        let f = collect(&head, spans, Keep::EndToEnd { length: bodiless })?;
        let body = if bodiless {
            BodyLen::Length(0)
        } else if f.chunked {
            BodyLen::Chunked
        } else if f.has_coding {
            BodyLen::Close
        } else {
            f.length.map_or(BodyLen::Close, BodyLen::Length)
        };
        // A message with both Transfer-Encoding and Content-Length must
        // not be followed on its connection (RFC 9112 §6.3), nor an upgrade.
        let reusable = body != BodyLen::Close
            && !(f.has_coding && f.length.is_some())
            && status != StatusCode::SWITCHING_PROTOCOLS;
        return Ok(Some(ParsedResponse {
            status,
            keep_alive: keep_alive(version, &f) && reusable,
            fields: f.fields,
            body,
        }));
    }
}

/// Where a chunked body's decoder stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Chunked {
    /// Expecting a chunk-size line.
    Size,
    /// This many data bytes of the current chunk left.
    Data(u64),
    /// The CRLF after a chunk's data.
    DataEnd,
    /// Trailer lines after the last chunk.
    Trailers,
    Done,
}

impl Chunked {
    /// Decodes what `buf` holds: data found is returned (and taken from
    /// `buf`); `Ok(None)` means more input is needed or the body is done
    /// (`self == Done`).
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Bytes>, FramingError> {
        loop {
            match *self {
                Chunked::Size => match httparse::parse_chunk_size(buf) {
                    Ok(httparse::Status::Complete((used, size))) => {
                        buf.advance(used);
                        *self = if size == 0 {
                            Chunked::Trailers
                        } else {
                            Chunked::Data(size)
                        };
                    }
                    Ok(httparse::Status::Partial) if buf.len() > 1024 => {
                        return Err(FramingError::Chunk);
                    }
                    Ok(httparse::Status::Partial) => return Ok(None),
                    Err(_) => return Err(FramingError::Chunk),
                },
                Chunked::Data(left) => {
                    if buf.is_empty() {
                        return Ok(None);
                    }
                    let n = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
                    let data = buf.split_to(n).freeze();
                    let left = left - n as u64;
                    *self = if left == 0 {
                        Chunked::DataEnd
                    } else {
                        Chunked::Data(left)
                    };
                    return Ok(Some(data));
                }
                Chunked::DataEnd => {
                    if buf.len() < 2 {
                        return Ok(None);
                    }
                    if &buf[..2] != b"\r\n" {
                        return Err(FramingError::Chunk);
                    }
                    buf.advance(2);
                    *self = Chunked::Size;
                }
                Chunked::Trailers => {
                    let Some(end) = buf.windows(2).position(|w| w == b"\r\n") else {
                        if buf.len() > MAX_HEAD {
                            return Err(FramingError::Chunk);
                        }
                        return Ok(None);
                    };
                    buf.advance(end + 2);
                    if end == 0 {
                        *self = Chunked::Done;
                        return Ok(None);
                    }
                }
                Chunked::Done => return Ok(None),
            }
        }
    }
}

/// Appends `name: value\r\n` for each header.
pub fn write_headers<'a>(
    out: &mut Vec<u8>,
    headers: impl IntoIterator<Item = (&'a HeaderName, &'a HeaderValue)>,
) {
    for (name, value) in headers {
        write_field(out, name.as_str().as_bytes(), value.as_bytes());
    }
}

/// Appends one `name: value` header line.
pub fn write_field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Appends a status line.
pub fn write_status_line(out: &mut Vec<u8>, status: StatusCode) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("Unknown").as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Appends a decimal number.
pub fn write_decimal(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// Appends a `content-length` line.
pub fn write_content_length(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(b"content-length: ");
    write_decimal(out, n);
    out.extend_from_slice(b"\r\n");
}

/// Appends a chunk-size line (hex) for `n` bytes of data.
pub fn write_chunk_size(out: &mut Vec<u8>, n: usize) {
    use std::io::Write;
    // Writing into a Vec cannot fail.
    let _ = write!(out, "{n:x}\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn val<'f>(f: &'f Fields, name: &'static str) -> Option<&'f [u8]> {
        f.get(&HeaderName::from_static(name))
    }

    #[test]
    fn request_heads_say_how_their_body_ends() {
        let r = parse_request(&mut BytesMut::from(
            &b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 12\r\n\r\n{}"[..],
        ))
        .unwrap()
        .unwrap();
        assert_eq!(r.method, Method::POST);
        assert_eq!(r.target, "/v1/chat/completions");
        assert!(r.raw.ends_with(b"\r\n\r\n"));
        assert_eq!(r.body, BodyLen::Length(12));
        assert!(r.keep_alive && !r.special);
        assert_eq!(val(&r.headers, "host"), Some(&b"x"[..]));
        let r = parse_request(&mut BytesMut::from(
            &b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n"[..],
        ))
        .unwrap()
        .unwrap();
        assert_eq!(r.body, BodyLen::Length(0));
        assert!(!r.keep_alive);
        let r = parse_request(&mut BytesMut::from(&b"GET / HTTP/1.0\r\n\r\n"[..]))
            .unwrap()
            .unwrap();
        assert_eq!(r.version, Version::HTTP_10);
        assert!(!r.keep_alive);
        let r = parse_request(&mut BytesMut::from(
            &b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
        ))
        .unwrap()
        .unwrap();
        assert_eq!(r.body, BodyLen::Chunked);
        let r = parse_request(&mut BytesMut::from(
            &b"POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n"[..],
        ))
        .unwrap()
        .unwrap();
        assert!(r.special);
        assert!(
            parse_request(&mut BytesMut::from(&b"POST / HTTP/1.1\r\nHost: x\r\n"[..]))
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn a_parsed_head_leaves_the_body_and_values_share_its_bytes() {
        let mut buf =
            BytesMut::from(&b"POST /x HTTP/1.1\r\nx-a: one\r\ncontent-length: 2\r\n\r\nhiNEXT"[..]);
        let r = parse_request(&mut buf).unwrap().unwrap();
        assert_eq!(&buf[..], b"hiNEXT");
        assert_eq!(val(&r.headers, "x-a"), Some(&b"one"[..]));
        assert_eq!(r.body, BodyLen::Length(2));
        // A head that does not parse leaves the buffer whole.
        let wire = &b"POST /x HTTP/1.1\r\nx-a: \x01\r\n\r\nbody"[..];
        let mut buf = BytesMut::from(wire);
        assert!(parse_request(&mut buf).is_err());
        assert_eq!(&buf[..], wire);
        let mut b = BytesMut::from(&b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello"[..]);
        parse_response(&mut b, false).unwrap().unwrap();
        assert_eq!(&b[..], b"hello");
    }

    #[test]
    fn answers_keep_only_end_to_end_headers() {
        let parse = |wire: &[u8], head_request: bool| {
            parse_response(&mut BytesMut::from(wire), head_request)
                .unwrap()
                .unwrap()
        };
        let r = parse(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: keep-alive\r\n\
              Keep-Alive: timeout=5\r\nContent-Length: 5\r\nServer: e\r\n\r\nhello",
            false,
        );
        let names: Vec<&[u8]> = r.fields.iter().map(|(n, _)| n).collect();
        assert_eq!(names, [&b"Content-Type"[..], b"Server"]);
        assert_eq!(r.body, BodyLen::Length(5));
        assert!(r.keep_alive);
        let r = parse(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
            false,
        );
        assert!(r.fields.is_empty(), "{:?}", r.fields);
        assert_eq!(r.body, BodyLen::Chunked);
        assert!(!r.keep_alive);
        // A HEAD answer's length says what a GET would carry: it stays.
        let r = parse(b"HTTP/1.1 200 OK\r\nContent-Length: 42\r\n\r\n", true);
        assert_eq!(val(&r.fields, "content-length"), Some(&b"42"[..]));
        assert_eq!(r.body, BodyLen::Length(0));
        // A Connection header that names other headers: they are
        // hop-by-hop too, wherever they stand.
        let r = parse(
            b"HTTP/1.1 200 OK\r\nX-Hop: 1\r\nConnection: close, x-hop\r\nx-end: 2\r\nContent-Length: 0\r\n\r\n",
            false,
        );
        assert_eq!(val(&r.fields, "connection"), None);
        assert_eq!(val(&r.fields, "x-hop"), None);
        assert_eq!(val(&r.fields, "x-end"), Some(&b"2"[..]));
        assert!(!r.keep_alive);
    }

    #[test]
    fn header_names_match_in_any_case() {
        let mut buf = BytesMut::from(
            &b"GET / HTTP/1.1\r\nX-Custom-Thing: 1\r\nCoNtEnT-LeNgTh: 0\r\n\r\n"[..],
        );
        let r = parse_request(&mut buf).unwrap().unwrap();
        assert_eq!(val(&r.headers, "x-custom-thing"), Some(&b"1"[..]));
        let map = r.headers.to_map(0).unwrap();
        assert_eq!(map["x-custom-thing"], "1");
        assert_eq!(map["content-length"], "0");
        assert_eq!(r.body, BodyLen::Length(0));
    }

    #[test]
    fn framing_that_hyper_refuses_is_not_taken_here() {
        for bad in [
            &b"POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\n"[..],
            b"POST / HTTP/1.1\r\nContent-Length: 5 5\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: \r\n\r\n",
        ] {
            assert_eq!(
                parse_request(&mut BytesMut::from(bad)).unwrap_err(),
                FramingError::ContentLength
            );
        }
        // Any Transfer-Encoding on a request, readable or not, with or
        // without a Content-Length: not framed by this loop.
        for te in [&b"x\x80, chunked"[..], b"", b"gzip", b"chunked"] {
            let mut wire = b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: ".to_vec();
            wire.extend_from_slice(te);
            wire.extend_from_slice(b"\r\n\r\n");
            let r = parse_request(&mut BytesMut::from(&wire[..]))
                .unwrap()
                .unwrap();
            assert_eq!(
                r.body,
                BodyLen::Chunked,
                "{:?}",
                String::from_utf8_lossy(te)
            );
        }
        // Answers: both headers, or an upgrade, and the connection is not reused.
        let mut b = BytesMut::from(
            &b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n"[..],
        );
        let r = parse_response(&mut b, false).unwrap().unwrap();
        assert_eq!((r.body, r.keep_alive), (BodyLen::Chunked, false));
        let mut b = BytesMut::from(&b"HTTP/1.1 101 Switching Protocols\r\nupgrade: x\r\n\r\n"[..]);
        assert!(!parse_response(&mut b, false).unwrap().unwrap().keep_alive);
        let mut b = BytesMut::from(&b"HTTP/1.1 304 Not Modified\r\ncontent-length: 9\r\n\r\n"[..]);
        let r = parse_response(&mut b, false).unwrap().unwrap();
        assert_eq!((r.body, r.keep_alive), (BodyLen::Length(0), true));
    }

    #[test]
    fn bad_request_heads_are_errors() {
        assert!(
            parse_request(&mut BytesMut::from(
                &b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"[..]
            ))
            .is_err()
        );
        assert!(
            parse_request(&mut BytesMut::from(
                &b"POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n"[..]
            ))
            .is_err()
        );
        assert!(parse_request(&mut BytesMut::from(&b"\x01\x02 nonsense\r\n\r\n"[..])).is_err());
        let huge = format!("GET / HTTP/1.1\r\nx: {}", "a".repeat(MAX_HEAD + 1));
        assert_eq!(
            parse_request(&mut BytesMut::from(huge.as_bytes())).unwrap_err(),
            FramingError::HeadTooLarge
        );
    }

    #[test]
    fn response_bodies_follow_rfc_9112() {
        let mut b = BytesMut::from(&b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello"[..]);
        let r = parse_response(&mut b, false).unwrap().unwrap();
        assert_eq!(
            (r.status, r.body, r.keep_alive),
            (StatusCode::OK, BodyLen::Length(5), true)
        );
        let mut b =
            BytesMut::from(&b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n"[..]);
        assert_eq!(
            parse_response(&mut b, false).unwrap().unwrap().body,
            BodyLen::Chunked
        );
        let mut b = BytesMut::from(&b"HTTP/1.1 200 OK\r\n\r\n"[..]);
        let r = parse_response(&mut b, false).unwrap().unwrap();
        assert_eq!((r.body, r.keep_alive), (BodyLen::Close, false));
        let mut b = BytesMut::from(&b"HTTP/1.1 204 No Content\r\n\r\n"[..]);
        assert_eq!(
            parse_response(&mut b, false).unwrap().unwrap().body,
            BodyLen::Length(0)
        );
        let mut b = BytesMut::from(&b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n"[..]);
        assert_eq!(
            parse_response(&mut b, true).unwrap().unwrap().body,
            BodyLen::Length(0)
        );
        let mut b = BytesMut::from(&b"HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n"[..]);
        assert!(!parse_response(&mut b, false).unwrap().unwrap().keep_alive);
        // An interim answer is skipped.
        let mut b = BytesMut::from(
            &b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 0\r\n\r\n"[..],
        );
        assert_eq!(
            parse_response(&mut b, false).unwrap().unwrap().status,
            StatusCode::CREATED
        );
    }

    #[test]
    fn chunked_bodies_decode_across_any_split() {
        let wire = b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nx-trailer: 1\r\n\r\nNEXT";
        for split in 1..wire.len() {
            let mut dec = Chunked::Size;
            let mut buf = BytesMut::new();
            let mut got = Vec::new();
            for part in [&wire[..split], &wire[split..]] {
                buf.extend_from_slice(part);
                while let Some(d) = dec.decode(&mut buf).unwrap() {
                    got.extend_from_slice(&d);
                }
            }
            assert_eq!(got, b"hello, world", "split at {split}");
            assert_eq!(dec, Chunked::Done);
            assert_eq!(&buf[..], b"NEXT", "what follows the body is left");
        }
        let mut dec = Chunked::Size;
        assert!(dec.decode(&mut BytesMut::from(&b"zz\r\n"[..])).is_err());
        let mut dec = Chunked::Size;
        assert!(
            dec.decode(&mut BytesMut::from(&b"1\r\nab"[..]))
                .is_ok_and(|d| d.is_some())
        );
        assert!(dec.decode(&mut BytesMut::from(&b"ab"[..])).is_err());
    }

    #[test]
    fn numbers_and_heads_are_written_plainly() {
        let mut out = Vec::new();
        write_status_line(&mut out, StatusCode::BAD_GATEWAY);
        write_decimal(&mut out, 0);
        write_decimal(&mut out, 1_234_567);
        write_chunk_size(&mut out, 255);
        write_chunk_size(&mut out, 0);
        assert_eq!(out, b"HTTP/1.1 502 Bad Gateway\r\n01234567ff\r\n0\r\n");
    }

    proptest::proptest! {
        /// `is_name` is `eq_ignore_ascii_case` for any bytes against a
        /// lowercase name.
        #[test]
        fn is_name_agrees_with_eq_ignore_ascii_case(
            lower in "[a-z0-9_^~!-]{1,20}",
            flips in proptest::collection::vec(proptest::bool::ANY, 20),
            pos in 0..20usize,
            byte in proptest::num::u8::ANY,
            other in proptest::collection::vec(proptest::num::u8::ANY, 1..20),
        ) {
            let lower = lower.as_bytes();
            let cased: Vec<u8> = lower
                .iter()
                .zip(&flips)
                .map(|(&b, &up)| if up { b.to_ascii_uppercase() } else { b })
                .collect();
            proptest::prop_assert!(is_name(&cased, lower));
            let mut near = cased.clone();
            near[pos % lower.len()] = byte;
            proptest::prop_assert_eq!(is_name(&near, lower), near.eq_ignore_ascii_case(lower));
            proptest::prop_assert_eq!(is_name(&other, lower), other.eq_ignore_ascii_case(lower));
        }
    }

    #[test]
    fn is_name_tells_near_misses_apart() {
        assert!(is_name(b"Content-Length", b"content-length"));
        assert!(is_name(b"CONNECTION", b"connection"));
        assert!(!is_name(b"content-lengt", b"content-length"));
        assert!(!is_name(b"content_length", b"content-length"));
        // Bytes one bit 0x20 apart that are not a letter's two cases.
        assert!(!is_name(b"~xpect", b"^xpect"));
        assert!(!is_name(b"^xpect", b"~xpect"));
    }
}
