//! An answer on its way back to a client: status, headers, the route
//! receipt and a body.
//!
//! A local engine's headers stay as the engine wrote them ([`Fields`](crate::h1::Fields): spans
//! of its head's bytes) and the receipt as a few values, so the loopback
//! face (`face_conn`) writes both straight into its output, with no header
//! map built, hashed or dropped per request. Whatever hyper serves (the
//! fallback connections, the router) gets a [`Response`] from
//! [`Reply::into_response`].

use axum::body::Body;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Response, StatusCode};
use pair_core::JobId;

use crate::h1;
pub use crate::h1::Headers;

/// The route receipt every routed answer carries: `x-pair-node`,
/// `x-pair-attempts`, `x-pair-policy`, `x-pair-job`, and `x-pair-route`
/// when the client asked why.
#[derive(Debug)]
pub struct Receipt {
    /// `name (uuid)` of the node that served it.
    pub node: Option<HeaderValue>,
    pub attempts: usize,
    pub policy: &'static str,
    pub job: JobId,
    /// The scheduler's reasoning, when the client asked for it.
    pub why: Option<HeaderValue>,
}

const NODE: HeaderName = HeaderName::from_static("x-pair-node");
pub const ATTEMPTS: HeaderName = HeaderName::from_static("x-pair-attempts");
const POLICY: HeaderName = HeaderName::from_static("x-pair-policy");
const ROUTE: HeaderName = HeaderName::from_static("x-pair-route");
const JOB: HeaderName = HeaderName::from_static("x-pair-job");
/// The receipt's header names: an answer's own headers of these names
/// give way to the receipt.
const RECEIPT: [HeaderName; 5] = [NODE, ATTEMPTS, POLICY, ROUTE, JOB];

/// Room left in an answer's header map for the receipt, so adding it does
/// not grow the map.
const ROOM: usize = 6;

impl Receipt {
    fn job_id<'b>(&self, buf: &'b mut [u8; uuid::fmt::Hyphenated::LENGTH]) -> &'b str {
        self.job.as_uuid().hyphenated().encode_lower(buf)
    }

    /// Appends the receipt as header lines.
    pub fn write(&self, out: &mut Vec<u8>) {
        let mut line = |name: &HeaderName, value: &[u8]| {
            h1::write_field(out, name.as_str().as_bytes(), value);
        };
        if let Some(v) = &self.node {
            line(&NODE, v.as_bytes());
        }
        line(&ATTEMPTS, attempts_value(self.attempts).as_bytes());
        line(&POLICY, self.policy.as_bytes());
        if let Some(v) = &self.why {
            line(&ROUTE, v.as_bytes());
        }
        let mut buf = [0u8; uuid::fmt::Hyphenated::LENGTH];
        line(&JOB, self.job_id(&mut buf).as_bytes());
    }

    /// Inserts the receipt into a header map.
    pub fn insert(self, h: &mut HeaderMap) {
        if let Some(v) = self.node.clone() {
            h.insert(NODE, v);
        }
        h.insert(ATTEMPTS, attempts_value(self.attempts));
        h.insert(POLICY, HeaderValue::from_static(self.policy));
        if let Some(v) = self.why.clone() {
            h.insert(ROUTE, v);
        }
        let mut buf = [0u8; uuid::fmt::Hyphenated::LENGTH];
        if let Ok(v) = HeaderValue::from_str(self.job_id(&mut buf)) {
            h.insert(JOB, v);
        }
    }
}

/// `x-pair-attempts`: static for the usual counts (`HeaderValue::from`
/// allocates twice).
pub fn attempts_value(n: usize) -> HeaderValue {
    match n {
        1 => HeaderValue::from_static("1"),
        2 => HeaderValue::from_static("2"),
        3 => HeaderValue::from_static("3"),
        n => HeaderValue::from(n),
    }
}

/// An answer for the client.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: Headers,
    pub receipt: Option<Receipt>,
    pub body: Body,
}

impl Reply {
    /// As a response for hyper: engine fields made into a map, the
    /// receipt inserted.
    pub fn into_response(self) -> Response<Body> {
        let room = if self.receipt.is_some() { ROOM } else { 0 };
        let mut headers = self.headers.into_map(room);
        if let Some(r) = self.receipt {
            r.insert(&mut headers);
        }
        let mut resp = Response::new(self.body);
        *resp.status_mut() = self.status;
        *resp.headers_mut() = headers;
        resp
    }

    /// Appends the answer's header lines for a client: its headers less
    /// the framing ones (`skip`) and, when it has a receipt, less any of
    /// the receipt's names (the receipt's values replace them, as
    /// [`Reply::into_response`] does), then the receipt.
    pub fn write_headers(&self, out: &mut Vec<u8>, framing: &[&[u8]]) {
        let receipt = self.receipt.is_some();
        self.headers.write(out, |name| {
            h1::is_one_of(name, framing)
                || (receipt
                    && RECEIPT
                        .iter()
                        .any(|r| h1::is_name(name, r.as_str().as_bytes())))
        });
        if let Some(r) = &self.receipt {
            r.write(out);
        }
    }

    /// The headers an answer to a HEAD request would have had framed by:
    /// its declared `Content-Length`.
    pub fn declared_length(&self) -> Option<u64> {
        let v = self.headers.get(&header::CONTENT_LENGTH)?;
        std::str::from_utf8(v).ok()?.trim().parse().ok()
    }
}

impl From<Response<Body>> for Reply {
    fn from(resp: Response<Body>) -> Self {
        let (parts, body) = resp.into_parts();
        Reply {
            status: parts.status,
            headers: Headers::Map(parts.headers),
            receipt: None,
            body,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receipt(why: Option<&str>) -> Receipt {
        Receipt {
            node: Some(HeaderValue::from_static(
                "a (00000000-0000-0000-0000-000000000001)",
            )),
            attempts: 2,
            policy: "predicted-latency",
            job: JobId::from_uuid(uuid::Uuid::from_u128(7)),
            why: why.map(|w| HeaderValue::from_str(w).unwrap()),
        }
    }

    #[test]
    fn a_written_receipt_says_what_an_inserted_one_does() {
        for why in [None, Some("score 1.5 (local)")] {
            let mut lines = Vec::new();
            receipt(why).write(&mut lines);
            let mut map = HeaderMap::new();
            receipt(why).insert(&mut map);
            let mut from_map = Vec::new();
            h1::write_headers(&mut from_map, &map);
            let sorted = |b: &[u8]| {
                let mut l: Vec<Vec<u8>> = b.split(|&c| c == b'\n').map(<[u8]>::to_vec).collect();
                l.sort();
                l
            };
            assert_eq!(sorted(&lines), sorted(&from_map), "why = {why:?}");
        }
        let mut lines = Vec::new();
        receipt(None).write(&mut lines);
        let text = String::from_utf8(lines).unwrap();
        assert!(text.contains("x-pair-attempts: 2\r\n"), "{text}");
        assert!(
            text.contains("x-pair-job: 00000000-0000-0000-0000-000000000007\r\n"),
            "{text}"
        );
    }

    #[test]
    fn the_receipt_replaces_an_answer_s_own_receipt_headers() {
        let mut buf = bytes::BytesMut::from(
            &b"HTTP/1.1 200 OK\r\nX-Pair-Attempts: 9\r\nx-pair-other: kept\r\nContent-Length: 0\r\n\r\n"[..],
        );
        let head = h1::parse_response(&mut buf, true).unwrap().unwrap();
        let reply = Reply {
            status: StatusCode::OK,
            headers: Headers::Raw(head.fields),
            receipt: Some(receipt(None)),
            body: Body::empty(),
        };
        let mut out = Vec::new();
        reply.write_headers(&mut out, &[b"content-length"]);
        let text = String::from_utf8(out).unwrap();
        assert!(!text.contains("X-Pair-Attempts: 9"), "{text}");
        assert!(text.contains("x-pair-attempts: 2\r\n"), "{text}");
        assert!(text.contains("x-pair-other: kept\r\n"), "{text}");
        assert!(!text.contains("Content-Length"), "{text}");
        let resp = reply.into_response();
        assert_eq!(resp.headers()["x-pair-attempts"], "2");
        assert_eq!(resp.headers().get_all("x-pair-attempts").iter().count(), 1);
    }

    #[test]
    fn raw_headers_read_and_write_like_a_map() {
        let mut buf = bytes::BytesMut::from(
            &b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Engine: e\r\nContent-Length: 2\r\n\r\nhi"[..],
        );
        let head = h1::parse_response(&mut buf, false).unwrap().unwrap();
        let raw = Headers::Raw(head.fields);
        assert_eq!(raw.get(&header::CONTENT_TYPE), Some(&b"text/plain"[..]));
        assert!(
            !raw.contains(&header::CONTENT_LENGTH),
            "framing is the proxy's"
        );
        let mut out = Vec::new();
        raw.write(&mut out, |n| n.eq_ignore_ascii_case(b"x-engine"));
        assert_eq!(out, b"Content-Type: text/plain\r\n");
        let map = raw.into_map(0);
        assert_eq!(map.len(), 2);
        assert_eq!(map["x-engine"], "e");
    }
}
