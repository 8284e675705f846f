//! Engine configuration, parsed once into typed values: which engine, where it
//! listens (plain `http://HOST:PORT`), how many requests it runs at once, and
//! how often it is polled.

use std::fmt;
use std::num::{NonZeroU16, NonZeroU32};
use std::time::Duration;

use pair_core::EngineKind;

use crate::EngineError;

/// The port an engine moves to when pair's proxy takes its usual one:
/// Ollama 11434 -> 11435, LM Studio / OpenAI-compatible 1234 -> 1235.
pub fn moved_port(kind: EngineKind) -> u16 {
    kind.usual_port().saturating_add(1)
}

/// Where an engine listens: plain HTTP on a host and port, no path.
///
/// Engines run on the same machine as the node, behind the proxy, so TLS is
/// refused here rather than half-supported.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct EngineUrl {
    host: String,
    port: u16,
}

impl EngineUrl {
    /// `http://127.0.0.1:11435`, `127.0.0.1:11435`, `http://[::1]:1235/` and
    /// `http://localhost:8080` are accepted; paths, queries, user info and
    /// `https` are not.
    pub fn parse(input: &str) -> Result<Self, EngineError> {
        let bad = |reason| EngineError::BadUrl {
            input: input.to_owned(),
            reason,
        };
        let trimmed = input.trim();
        let rest = if let Some(r) = strip_prefix_ci(trimmed, "http://") {
            r
        } else if strip_prefix_ci(trimmed, "https://").is_some() {
            return Err(bad("only plain http:// is supported for local engines"));
        } else if trimmed.contains("://") {
            return Err(bad("scheme must be http://"));
        } else {
            trimmed
        };
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.contains(['/', '?', '#', '@']) {
            return Err(bad("expected http://HOST:PORT without a path"));
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (h, p) = v6
                .split_once("]:")
                .ok_or_else(|| bad("expected [IPv6]:PORT"))?;
            (h, p)
        } else {
            authority
                .rsplit_once(':')
                .ok_or_else(|| bad("missing :PORT"))?
        };
        if host.is_empty() || host.contains(char::is_whitespace) {
            return Err(bad("missing host"));
        }
        if host.contains(':') && !authority.starts_with('[') {
            return Err(bad("an IPv6 host must be written in brackets"));
        }
        let port: u16 = port
            .parse()
            .map_err(|_| bad("port is not a number 1-65535"))?;
        if port == 0 {
            return Err(bad("port 0 is not a listening port"));
        }
        Ok(Self {
            host: host.to_owned(),
            port,
        })
    }

    /// A URL on `host` (an IPv6 address without brackets is fine) and `port`.
    pub fn http(host: impl Into<String>, port: u16) -> Self {
        let host = host.into();
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .map(str::to_owned)
            .unwrap_or(host);
        Self { host, port }
    }

    pub fn host(&self) -> &str {
        &self.host
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The full URL of `path` (which starts with `/`) on this engine.
    pub fn join(&self, path: &str) -> String {
        format!("{self}{path}")
    }

    /// `host:port` as a socket address string (brackets around IPv6).
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl fmt::Display for EngineUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "http://{}", self.authority())
    }
}

fn strip_prefix_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &s[prefix.len()..])
}

/// One engine a node serves from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    pub kind: EngineKind,
    pub base_url: EngineUrl,
    /// Requests the engine runs at once. `None`: learn it where the engine
    /// says (llama.cpp `/props` `total_slots`), else 1, which is Ollama's
    /// `OLLAMA_NUM_PARALLEL` default and llama-cpp-python's only mode.
    pub slots: Option<NonZeroU16>,
}

impl EngineConfig {
    /// Parses the URL; `slots` of 0 means "not configured".
    pub fn new(kind: EngineKind, base_url: &str, slots: Option<u16>) -> Result<Self, EngineError> {
        Ok(Self {
            kind,
            base_url: EngineUrl::parse(base_url)?,
            slots: slots.and_then(NonZeroU16::new),
        })
    }

    /// The engine on loopback at its moved port (11435 or 1235).
    pub fn moved_default(kind: EngineKind) -> Self {
        Self {
            kind,
            base_url: EngineUrl::http("127.0.0.1", moved_port(kind)),
            slots: None,
        }
    }
}

/// How an engine is polled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PollConfig {
    /// Time between polls.
    pub interval: Duration,
    /// Deadline for each HTTP request of a poll (connect included).
    pub timeout: Duration,
    /// Consecutive timeouts / 5xx before a live engine is marked unhealthy.
    /// A refused connection marks it unhealthy at once: the process is gone.
    pub fail_threshold: NonZeroU32,
    /// Full inventory every this many polls (and at once after recovery).
    /// Cheap per-poll checks (health, Ollama `/api/ps`, metrics) run every
    /// poll; the model listing of OpenAI-compatible servers is spaced out
    /// because llama-cpp-python serves it under its single model lock.
    pub inventory_every: NonZeroU32,
}

impl Default for PollConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            fail_threshold: NonZeroU32::MIN.saturating_add(1),
            inventory_every: NonZeroU32::MIN.saturating_add(9),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn accepts_plain_http_forms() {
        let u = EngineUrl::parse("http://127.0.0.1:11435").unwrap();
        assert_eq!((u.host(), u.port()), ("127.0.0.1", 11435));
        assert_eq!(u.to_string(), "http://127.0.0.1:11435");
        assert_eq!(
            EngineUrl::parse("localhost:8080/")
                .unwrap()
                .join("/v1/models"),
            "http://localhost:8080/v1/models"
        );
        let v6 = EngineUrl::parse("HTTP://[::1]:1235").unwrap();
        assert_eq!(v6.host(), "::1");
        assert_eq!(v6.to_string(), "http://[::1]:1235");
        assert_eq!(EngineUrl::http("[::1]", 5), EngineUrl::http("::1", 5));
    }

    #[test]
    fn rejects_what_it_cannot_poll() {
        for bad in [
            "https://127.0.0.1:1234",
            "ftp://x:1",
            "http://127.0.0.1",
            "http://127.0.0.1:0",
            "http://127.0.0.1:70000",
            "http://127.0.0.1:1234/v1",
            "http://user@h:1",
            "http://:1234",
            "::1:1234",
            "",
        ] {
            assert!(
                matches!(EngineUrl::parse(bad), Err(EngineError::BadUrl { .. })),
                "{bad:?} should be rejected"
            );
        }
    }

    #[test]
    fn moved_ports_follow_the_usual_ones() {
        assert_eq!(moved_port(EngineKind::Ollama), 11435);
        assert_eq!(moved_port(EngineKind::LmStudio), 1235);
        assert_eq!(moved_port(EngineKind::OpenAiCompat), 1235);
        let c = EngineConfig::moved_default(EngineKind::Ollama);
        assert_eq!(c.base_url.to_string(), "http://127.0.0.1:11435");
        assert_eq!(
            EngineConfig::new(EngineKind::Ollama, "127.0.0.1:1", Some(0))
                .unwrap()
                .slots,
            None
        );
    }

    proptest! {
        #[test]
        fn display_parses_back(a in 0u8..=255, b in 0u8..=255, port in 1u16..) {
            let u = EngineUrl::http(format!("10.{a}.{b}.1"), port);
            prop_assert_eq!(EngineUrl::parse(&u.to_string()).unwrap(), u);
        }

        #[test]
        fn parse_never_panics(s in "\\PC{0,40}") {
            let _ = EngineUrl::parse(&s);
        }
    }
}
