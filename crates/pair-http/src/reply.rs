//! An answer on its way back to a client: status, headers, fields the
//! proxy adds (its route receipt), and a body.
//!
//! An engine's headers stay as the engine wrote them
//! ([`Fields`](crate::h1::Fields): spans of its head's bytes), so the
//! hand-framed face ([`crate::server`]) writes them straight into its
//! output with no header map built, hashed or dropped per request.
//! Whatever hyper serves gets a [`Response`] from [`Reply::into_response`].

use axum::body::Body;
use http::header::{self, HeaderName, HeaderValue};
use http::{Response, StatusCode};
use smallvec::SmallVec;

use crate::h1::{self, Headers};

/// Header fields a proxy adds to an answer; an answer's own fields of the
/// same names give way to them.
pub type Extra = SmallVec<[(HeaderName, HeaderValue); 6]>;

/// An answer for the client.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: Headers,
    pub extra: Extra,
    pub body: Body,
}

impl Reply {
    /// As a response for hyper: fields made into a map, the extra ones in
    /// place of any of the same names.
    pub fn into_response(self) -> Response<Body> {
        let mut headers = self.headers.into_map(self.extra.len());
        for (name, value) in self.extra {
            headers.insert(name, value);
        }
        let mut resp = Response::new(self.body);
        *resp.status_mut() = self.status;
        *resp.headers_mut() = headers;
        resp
    }

    /// Appends the answer's header lines for a client: its headers less
    /// the framing ones (`skip`) and less any named in `extra`, then the
    /// extra ones.
    pub fn write_headers(&self, out: &mut Vec<u8>, framing: &[&[u8]]) {
        let extra = &self.extra;
        self.headers.write(out, |name| {
            h1::is_one_of(name, framing)
                || extra
                    .iter()
                    .any(|(n, _)| h1::is_name(name, n.as_str().as_bytes()))
        });
        for (name, value) in extra {
            h1::write_field(out, name.as_str().as_bytes(), value.as_bytes());
        }
    }

    /// What an answer to a HEAD request would have been framed by: its
    /// declared `Content-Length`.
    pub fn declared_length(&self) -> Option<u64> {
        let v = self.headers.get(&header::CONTENT_LENGTH)?;
        std::str::from_utf8(v).ok()?.trim().parse().ok()
    }

    /// Whether the answer's own `Connection` header says `close` (an app's
    /// answer; an engine's or a peer's lost theirs as hop-by-hop headers).
    pub fn wants_close(&self) -> bool {
        match &self.headers {
            Headers::Map(m) => m
                .get_all(header::CONNECTION)
                .iter()
                .any(|v| h1::tokens(v.as_bytes()).any(|t| t.eq_ignore_ascii_case(b"close"))),
            Headers::Raw(_) => false,
        }
    }
}

impl From<Response<Body>> for Reply {
    fn from(resp: Response<Body>) -> Self {
        let (parts, body) = resp.into_parts();
        Reply {
            status: parts.status,
            headers: Headers::Map(parts.headers),
            extra: Extra::new(),
            body,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn extra() -> Extra {
        let mut e = Extra::new();
        e.push((
            HeaderName::from_static("x-pair-attempts"),
            HeaderValue::from_static("2"),
        ));
        e
    }

    #[test]
    fn the_extra_fields_replace_an_answer_s_own() {
        let mut buf = bytes::BytesMut::from(
            &b"HTTP/1.1 200 OK\r\nX-Pair-Attempts: 9\r\nx-pair-other: kept\r\nContent-Length: 0\r\n\r\n"[..],
        );
        let head = h1::parse_response(&mut buf, true).unwrap().unwrap();
        let reply = Reply {
            status: StatusCode::OK,
            headers: Headers::Raw(head.fields),
            extra: extra(),
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
