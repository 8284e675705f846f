//! A peer's cluster address as people type it: `host:port`, `10.0.0.2:port`,
//! `[fd00::2]:port`, and IPv6 with a zone, `[fe80::1%eth0]:port` or
//! `[fe80::1%2]:port`, which std's `SocketAddr` parser refuses. Syntax only:
//! an interface name stays a name here; `pair-identity` asks the system for
//! its index, and discovery hands it to the resolver as written.

use std::net::{IpAddr, Ipv6Addr};

/// The part after `%` in `fe80::1%eth0`, as written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Zone<'a> {
    /// `%2`: the interface index itself.
    Index(u32),
    /// `%eth0`: an interface name, looked up on the machine that dials.
    Name(&'a str),
}

/// Longest interface name Linux allows (`IFNAMSIZ` less its NUL).
const MAX_INTERFACE_NAME: usize = 15;

impl<'a> Zone<'a> {
    /// A zone as written after `%`: digits are an index, anything else an
    /// interface name of up to 15 letters, digits, `-`, `_` or `.`.
    pub fn parse(zone: &'a str) -> Result<Self, AddrError> {
        if zone.is_empty() {
            return Err(AddrError::Zone("the zone after % is empty"));
        }
        if zone.bytes().all(|b| b.is_ascii_digit()) {
            return zone
                .parse::<u32>()
                .map(Zone::Index)
                .map_err(|_| AddrError::Zone("the zone index after % is too large"));
        }
        let name_ok = zone.len() <= MAX_INTERFACE_NAME
            && zone
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if name_ok {
            Ok(Zone::Name(zone))
        } else {
            Err(AddrError::Zone(
                "the zone after % must be an interface name (e.g. eth0) or index (e.g. 2)",
            ))
        }
    }
}

/// Why an address was refused; the caller names the input.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AddrError {
    #[error("expected HOST:PORT, IP:PORT or [IPv6%ZONE]:PORT")]
    Syntax,
    #[error("{0}")]
    Zone(&'static str),
}

/// A peer address taken apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerAddrParts<'a> {
    /// The host as written, without brackets; a zone stays in it
    /// (`fe80::1%eth0`), where the system resolver reads it.
    pub host: &'a str,
    /// The host as an IP address when it is one (its zone apart).
    pub ip: Option<IpAddr>,
    /// The zone of a bracketed IPv6 address.
    pub zone: Option<Zone<'a>>,
    /// Never 0.
    pub port: u16,
}

/// Parses a peer's cluster address (the one parser of it: `--peer`,
/// `pair join`, addresses in reports).
pub fn parse_peer_addr(input: &str) -> Result<PeerAddrParts<'_>, AddrError> {
    if let Some(rest) = input.strip_prefix('[') {
        let (host, port) = rest.split_once("]:").ok_or(AddrError::Syntax)?;
        let port = port_of(port).ok_or(AddrError::Syntax)?;
        let (ip, zone) = match host.split_once('%') {
            Some((ip, zone)) => (ip, Some(Zone::parse(zone)?)),
            None => (host, None),
        };
        let ip = ip.parse::<Ipv6Addr>().map_err(|_| AddrError::Syntax)?;
        return Ok(PeerAddrParts {
            host,
            ip: Some(IpAddr::V6(ip)),
            zone,
            port,
        });
    }
    let (host, port) = input.rsplit_once(':').ok_or(AddrError::Syntax)?;
    if host.contains('%') {
        return Err(AddrError::Zone(
            "a zone follows only an IPv6 address, in brackets: [fe80::1%eth0]:14318",
        ));
    }
    if host.contains(':') {
        return Err(AddrError::Syntax); // bare IPv6 needs brackets
    }
    let port = port_of(port).ok_or(AddrError::Syntax)?;
    if host.is_empty() || host.contains(|c: char| c.is_whitespace() || "/?#@[]".contains(c)) {
        return Err(AddrError::Syntax);
    }
    Ok(PeerAddrParts {
        host,
        ip: host.parse::<IpAddr>().ok(),
        zone: None,
        port,
    })
}

fn port_of(s: &str) -> Option<u16> {
    s.parse::<u16>().ok().filter(|p| *p != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_ips_and_zones_parse() {
        let p = parse_peer_addr("gpu-box.lan:14318").unwrap();
        assert_eq!(
            (p.host, p.ip, p.zone, p.port),
            ("gpu-box.lan", None, None, 14318)
        );
        let p = parse_peer_addr("10.0.0.5:1").unwrap();
        assert_eq!(p.ip, Some(IpAddr::from([10, 0, 0, 5])));
        let p = parse_peer_addr("[fd00::2]:14318").unwrap();
        assert_eq!((p.host, p.zone), ("fd00::2", None));
        assert!(p.ip.is_some_and(|ip| ip.is_ipv6()));
        let p = parse_peer_addr("[fe80::1%eth0]:14318").unwrap();
        assert_eq!((p.host, p.zone), ("fe80::1%eth0", Some(Zone::Name("eth0"))));
        assert_eq!(p.ip, Some("fe80::1".parse::<IpAddr>().unwrap()));
        let p = parse_peer_addr("[fe80::1%2]:14318").unwrap();
        assert_eq!(p.zone, Some(Zone::Index(2)));
    }

    /// The test vectors every door into the parser shares.
    #[test]
    fn bad_addresses_and_zones_are_refused() {
        for bad in [
            "",
            "host",
            "host:",
            ":80",
            "host:0",
            "host:70000",
            "fd00::2:80",
            "[nope]:80",
            "[nope%eth0]:80",
            "[fe80::1]",
            "a b:80",
            "host:1/path",
        ] {
            assert_eq!(parse_peer_addr(bad), Err(AddrError::Syntax), "{bad}");
        }
        for bad in [
            "[fe80::1%]:80",
            "[fe80::1%eth 0]:80",
            "[fe80::1%a/b]:80",
            "[fe80::1%eth0%1]:80",
            "[fe80::1%waytoolonginterface]:80",
            "[fe80::1%99999999999]:80",
            "10.0.0.1%eth0:80",
            "fe80::1%eth0:80",
        ] {
            assert!(
                matches!(parse_peer_addr(bad), Err(AddrError::Zone(_))),
                "{bad}"
            );
        }
    }
}
