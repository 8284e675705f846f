//! Who may use a local face, beyond coming from this machine: the `Host`
//! and `Origin` checks that keep web pages out.
//!
//! A connection from loopback is not proof that this machine's user sent
//! the request: a page in their browser can make one, either with a
//! domain that rebinds to 127.0.0.1 (DNS rebinding: the browser then sends
//! that domain as `Host`) or with a plain cross-site form post. So every
//! request on a face must name this machine in `Host` (a loopback name or
//! address, or a name the user allowed for a reverse proxy of their own),
//! and the node's own control routes (`/_pair/...`) also refuse a browser
//! `Origin` that is not this machine. Pure: the faces call [`FaceGate::check`]
//! at each door.

use std::net::IpAddr;

use crate::route::CONTROL_PREFIX;

/// Why a request was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// `Host` names another machine (or is not a host at all).
    Host,
    /// A control route called from another site's page.
    Origin,
}

impl Refusal {
    /// The message for the client.
    pub fn message(self) -> &'static str {
        match self {
            Refusal::Host => {
                "pair's local faces answer only requests addressed to this machine \
                 (Host: localhost, 127.0.0.1 or [::1]); to serve another name through \
                 a reverse proxy of your own, start the node with --allowed-host NAME"
            }
            Refusal::Origin => {
                "pair's control routes refuse requests from other sites' pages \
                 (the Origin header is not this machine)"
            }
        }
    }
}

/// The host names a face accepts besides loopback ones.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FaceGate {
    /// Lower case, without a port.
    allowed: Vec<String>,
}

impl FaceGate {
    /// A gate that accepts loopback names and addresses, and `allowed`
    /// (host names, any case, with or without a port: the port is ignored).
    pub fn new<S: AsRef<str>>(allowed: impl IntoIterator<Item = S>) -> Self {
        let allowed = allowed
            .into_iter()
            .filter_map(|h| {
                split_host(h.as_ref().trim().as_bytes())
                    .map(|h| String::from_utf8_lossy(h).to_ascii_lowercase())
            })
            .collect();
        Self { allowed }
    }

    /// Checks one request: `host` and `origin` are its header values, if
    /// present. A request without `Host` passes (browsers always send
    /// one, so its absence is not a page's request); one with a `Host`
    /// that is not this machine does not.
    pub fn check(
        &self,
        path: &str,
        host: Option<&[u8]>,
        origin: Option<&[u8]>,
    ) -> Result<(), Refusal> {
        if let Some(host) = host
            && !self.host_allowed(host)
        {
            return Err(Refusal::Host);
        }
        if path.starts_with(CONTROL_PREFIX)
            && let Some(origin) = origin
            && !self.origin_allowed(origin)
        {
            return Err(Refusal::Origin);
        }
        Ok(())
    }

    /// `Host` (RFC 9110 §7.2: `uri-host [":" port]`) names this machine.
    fn host_allowed(&self, value: &[u8]) -> bool {
        split_host(value.trim_ascii()).is_some_and(|h| self.name_allowed(h))
    }

    /// `Origin` (RFC 6454: `scheme "://" host [":" port]`, or `null`) is a
    /// page of this machine.
    fn origin_allowed(&self, value: &[u8]) -> bool {
        let value = value.trim_ascii();
        let Some(pos) = value.windows(3).position(|w| w == b"://") else {
            // `null` (sandboxed frames, files) and anything else.
            return false;
        };
        let scheme = &value[..pos];
        if !scheme.eq_ignore_ascii_case(b"http") && !scheme.eq_ignore_ascii_case(b"https") {
            return false;
        }
        let authority = &value[pos + 3..];
        if authority.contains(&b'/') || authority.contains(&b'@') {
            return false;
        }
        split_host(authority).is_some_and(|h| self.name_allowed(h))
    }

    fn name_allowed(&self, host: &[u8]) -> bool {
        is_loopback_name(host)
            || self
                .allowed
                .iter()
                .any(|a| a.as_bytes().eq_ignore_ascii_case(host))
    }
}

/// The host part of `host[:port]` or `[v6]:port`; `None` when it is not
/// one (empty, a bad port, unbalanced brackets).
fn split_host(value: &[u8]) -> Option<&[u8]> {
    if let Some(rest) = value.strip_prefix(b"[") {
        let end = rest.iter().position(|&b| b == b']')?;
        let after = &rest[end + 1..];
        if !(after.is_empty() || after.first() == Some(&b':') && valid_port(&after[1..])) {
            return None;
        }
        return Some(&value[..end + 2]);
    }
    let (host, port) = match value.iter().rposition(|&b| b == b':') {
        Some(i) => (&value[..i], Some(&value[i + 1..])),
        None => (value, None),
    };
    if host.is_empty() || host.contains(&b':') || port.is_some_and(|p| !valid_port(p)) {
        return None;
    }
    Some(host)
}

fn valid_port(p: &[u8]) -> bool {
    !p.is_empty() && p.len() <= 5 && p.iter().all(u8::is_ascii_digit)
}

/// `localhost` and its subdomains (RFC 6761: always this machine, never
/// sent to DNS), `127.0.0.0/8`, and `[::1]`.
fn is_loopback_name(host: &[u8]) -> bool {
    let host = host.strip_suffix(b".").unwrap_or(host);
    if host.eq_ignore_ascii_case(b"localhost") {
        return true;
    }
    if host.len() > b".localhost".len()
        && host[host.len() - b".localhost".len()..].eq_ignore_ascii_case(b".localhost")
    {
        return true;
    }
    let literal = host
        .strip_prefix(b"[")
        .and_then(|h| h.strip_suffix(b"]"))
        .unwrap_or(host);
    std::str::from_utf8(literal)
        .ok()
        .and_then(|s| s.parse::<IpAddr>().ok())
        .is_some_and(|ip| ip.to_canonical().is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn gate() -> FaceGate {
        FaceGate::new(["Pair.Home.Lan:8443"])
    }

    #[test]
    fn loopback_hosts_pass_with_or_without_a_port() {
        for h in [
            "localhost",
            "LOCALHOST:11434",
            "localhost.",
            "app.localhost:1234",
            "127.0.0.1",
            "127.0.0.1:11434",
            "127.8.9.10:1",
            "[::1]",
            "[::1]:11434",
            "[::ffff:127.0.0.1]:80",
            "pair.home.lan",
            "PAIR.HOME.LAN:443",
        ] {
            assert_eq!(
                gate().check("/api/chat", Some(h.as_bytes()), None),
                Ok(()),
                "{h}"
            );
        }
        assert_eq!(gate().check("/api/chat", None, None), Ok(()));
    }

    #[test]
    fn other_hosts_are_refused_on_every_route() {
        for h in [
            "rebind.attacker.example:11434",
            "rebind.attacker.example",
            "localhost.attacker.example",
            "attackerlocalhost",
            "10.0.0.2:11434",
            "[::2]:1",
            "[fe80::1]",
            "127.0.0.1:port",
            "127.0.0.1:123456",
            "[::1",
            "",
            ":11434",
            "::1",
        ] {
            for path in ["/api/chat", "/_pair/invite", "/ui", "/v1/models"] {
                assert_eq!(
                    gate().check(path, Some(h.as_bytes()), None),
                    Err(Refusal::Host),
                    "{h} {path}"
                );
            }
        }
    }

    #[test]
    fn control_routes_refuse_foreign_origins_inference_routes_do_not() {
        let host = Some(&b"127.0.0.1:11434"[..]);
        for o in [
            "http://rebind.attacker.example:11434",
            "https://evil.example",
            "null",
            "file://",
            "chrome-extension://abc",
            "http://127.0.0.1@evil.example",
        ] {
            assert_eq!(
                gate().check("/_pair/join", host, Some(o.as_bytes())),
                Err(Refusal::Origin),
                "{o}"
            );
            // The engine's own CORS rules decide for inference routes.
            assert_eq!(
                gate().check("/api/chat", host, Some(o.as_bytes())),
                Ok(()),
                "{o}"
            );
        }
        for o in [
            "http://127.0.0.1:11434",
            "http://localhost:1234",
            "https://[::1]",
            "https://pair.home.lan",
        ] {
            assert_eq!(
                gate().check("/_pair/jobs", host, Some(o.as_bytes())),
                Ok(()),
                "{o}"
            );
        }
    }

    proptest! {
        /// A host with a dot-separated name that is not `localhost` or a
        /// subdomain of it, and not allowed, never passes, whatever its port.
        #[test]
        fn names_outside_localhost_never_pass(
            labels in proptest::collection::vec("[a-z0-9-]{1,12}", 1..4),
            port in proptest::option::of(0u16..),
        ) {
            let name = labels.join(".");
            prop_assume!(name != "localhost" && !name.ends_with(".localhost"));
            prop_assume!(name.parse::<IpAddr>().is_err());
            let host = match port {
                Some(p) => format!("{name}:{p}"),
                None => name,
            };
            prop_assert_eq!(
                FaceGate::default().check("/api/chat", Some(host.as_bytes()), None),
                Err(Refusal::Host)
            );
        }
    }
}
