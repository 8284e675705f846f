//! A request as a proxy keeps it for replay (method, target, end-to-end
//! headers), and the hop-by-hop rules of RFC 9110 §7.6.1 in both
//! directions.

use http::HeaderValue;
use http::header::{self, HeaderMap, HeaderName};
use http::uri::PathAndQuery;

use crate::h1::{self, Headers};

/// Request line and headers of a client's request, kept for replay.
#[derive(Clone, Debug)]
pub struct RequestHead {
    pub method: http::Method,
    /// Path and query as the client sent them.
    pub path_and_query: PathAndQuery,
    pub headers: Headers,
}

/// Hop-by-hop headers (RFC 9110 §7.6.1) in either direction, as names
/// (a lookup by `&str` parses and hashes the string every time).
const HOP_HEADERS: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Not copied onto a request to the next hop: the hop-by-hop headers, the
/// proxy credentials meant for us, and those the client library sets.
const NOT_FORWARDED: [&[u8]; 11] = [
    b"connection",
    b"keep-alive",
    b"proxy-connection",
    b"te",
    b"trailer",
    b"transfer-encoding",
    b"upgrade",
    b"proxy-authenticate",
    b"proxy-authorization",
    b"host",
    b"content-length",
];

/// Whether a request header stays with this hop (the hop-by-hop headers,
/// proxy credentials, `Host` and `Content-Length`);
/// `name` in any case.
pub fn is_hop_header(name: &[u8]) -> bool {
    h1::is_one_of(name, &NOT_FORWARDED)
}

/// Removes an upstream answer's hop-by-hop headers before it goes to the
/// client (RFC 9110 §7.6.1): those the answer's `Connection` header names,
/// then the standard ones. This hop's own framing is the server's to
/// choose; a `Connection: close` from an engine must not close the
/// client's keep-alive connection.
pub fn strip_response_hop_headers(h: &mut HeaderMap) {
    // One pass over the (few) names: which hop-by-hop headers are here
    // (usually just `connection`). Removing an absent name still hashes it.
    let mut present = 0u8;
    for k in h.keys() {
        if let Some(i) = HOP_HEADERS.iter().position(|hop| hop == k) {
            present |= 1 << i;
        }
    }
    if present == 0 {
        return;
    }
    // Engines mostly send `Connection: keep-alive` or `close`: those name
    // no header, so the usual case collects (allocates) nothing.
    let named: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|v| h1::tokens(v.as_bytes()))
        .filter(|t| !t.eq_ignore_ascii_case(b"keep-alive") && !t.eq_ignore_ascii_case(b"close"))
        .filter_map(|t| HeaderName::from_bytes(t).ok())
        .collect();
    for name in named {
        h.remove(name);
    }
    for (i, name) in HOP_HEADERS.iter().enumerate() {
        if present & (1 << i) != 0 {
            h.remove(name);
        }
    }
}

/// Copies end-to-end headers.
pub fn copy_headers(from: &Headers, to: &mut HeaderMap) {
    match from {
        Headers::Map(m) => {
            for (name, value) in m {
                if !is_hop_header(name.as_str().as_bytes()) {
                    to.append(name.clone(), value.clone());
                }
            }
        }
        Headers::Raw(f) => {
            for (name, value) in f.entries().flatten() {
                if !is_hop_header(name.as_str().as_bytes()) {
                    to.append(name, value);
                }
            }
        }
    }
}

/// `Host` for an upstream: host and port, never the URL's userinfo.
pub fn host_value(
    to: &http::uri::Authority,
) -> Result<HeaderValue, http::header::InvalidHeaderValue> {
    match to.port() {
        Some(p) => HeaderValue::from_str(&format!("{}:{}", to.host(), p.as_str())),
        None => HeaderValue::from_str(to.host()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_headers_are_dropped_and_others_kept() {
        let mut from = HeaderMap::new();
        from.insert("connection", HeaderValue::from_static("keep-alive"));
        from.insert("host", HeaderValue::from_static("x"));
        from.insert("content-length", HeaderValue::from_static("3"));
        from.insert("authorization", HeaderValue::from_static("Bearer k"));
        from.insert("content-type", HeaderValue::from_static("application/json"));
        let mut to = HeaderMap::new();
        copy_headers(&Headers::Map(from), &mut to);
        assert_eq!(to.len(), 2);
        assert!(to.contains_key("authorization"));
    }

    #[test]
    fn answers_lose_hop_headers_and_those_connection_names() {
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_static("close, x-engine-hop"),
        );
        h.insert("x-engine-hop", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        h.insert(
            "content-type",
            HeaderValue::from_static("text/event-stream"),
        );
        h.insert("content-length", HeaderValue::from_static("12"));
        strip_response_hop_headers(&mut h);
        let mut left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["content-length", "content-type"]);
    }

    #[test]
    fn the_upstream_host_header_leaves_out_userinfo() {
        let to: http::uri::Authority = "user:secret@127.0.0.1:11435".parse().unwrap();
        assert_eq!(host_value(&to).unwrap(), "127.0.0.1:11435");
        let to: http::uri::Authority = "localhost".parse().unwrap();
        assert_eq!(host_value(&to).unwrap(), "localhost");
    }
}
