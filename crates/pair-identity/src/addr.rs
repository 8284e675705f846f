//! A peer's cluster address as people type it: `host:port`, `10.0.0.2:port`,
//! `[fd00::2]:port`, and IPv6 with a zone, `[fe80::1%eth0]:port` or
//! `[fe80::1%2]:port`, which std's `SocketAddr` parser refuses. The syntax
//! is `pair_core::addr`'s; this turns it into something to dial, where only
//! an interface name asks the system for its index.

use std::fmt;
use std::net::{IpAddr, SocketAddr, SocketAddrV6, ToSocketAddrs};

use pair_core::addr::{AddrError, Zone, parse_peer_addr};

use crate::error::{Error, Result};

/// Where a peer's cluster port is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum PeerAddr {
    /// An IP literal; an IPv6 zone is already its scope id.
    Ip(SocketAddr),
    /// A host name, resolved when it is dialled.
    Name { host: String, port: u16 },
}

/// The index of the interface named `name`.
///
/// std has no `if_nametoindex` and this workspace forbids `unsafe`, so the
/// C library does it: its parser of a zoned link-local literal calls
/// `if_nametoindex` for the zone. The literal is numeric and the name
/// checked by `pair_core::addr::Zone::parse`, so nothing reaches DNS; an unknown name
/// fails at once.
pub fn interface_index(name: &str) -> std::io::Result<u32> {
    let literal = format!("fe80::1%{name}");
    let found = (literal.as_str(), 0)
        .to_socket_addrs()?
        .find_map(|a| match a {
            SocketAddr::V6(v6) if v6.scope_id() != 0 => Some(v6.scope_id()),
            _ => None,
        });
    found.ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))
}

impl PeerAddr {
    /// Parses `input`, looking interface names up on this machine.
    pub fn parse(input: &str) -> Result<Self> {
        Self::parse_with(input, interface_index)
    }

    /// Parses `input`; `index_of` turns an interface name into its index.
    pub fn parse_with(
        input: &str,
        index_of: impl FnOnce(&str) -> std::io::Result<u32>,
    ) -> Result<Self> {
        let parts = parse_peer_addr(input).map_err(|e| match e {
            AddrError::Syntax => Error::BadAddress {
                input: input.to_owned(),
            },
            AddrError::Zone(reason) => Error::BadZone {
                input: input.to_owned(),
                reason,
            },
        })?;
        let port = parts.port;
        Ok(match (parts.ip, parts.zone) {
            (Some(IpAddr::V6(ip)), Some(zone)) => {
                let scope_id = match zone {
                    Zone::Index(i) => i,
                    Zone::Name(name) => {
                        index_of(name).map_err(|source| Error::NoSuchInterface {
                            input: input.to_owned(),
                            name: name.to_owned(),
                            source,
                        })?
                    }
                };
                PeerAddr::Ip(SocketAddr::V6(SocketAddrV6::new(ip, port, 0, scope_id)))
            }
            (Some(ip), _) => PeerAddr::Ip(SocketAddr::new(ip, port)),
            (None, _) => PeerAddr::Name {
                host: parts.host.to_owned(),
                port,
            },
        })
    }

    pub fn port(&self) -> u16 {
        match self {
            PeerAddr::Ip(a) => a.port(),
            PeerAddr::Name { port, .. } => *port,
        }
    }

    /// The address itself when it needs no resolving.
    pub fn socket_addr(&self) -> Option<SocketAddr> {
        match self {
            PeerAddr::Ip(a) => Some(*a),
            PeerAddr::Name { .. } => None,
        }
    }

    /// An IPv6 address with a scope id, which a URL cannot carry.
    pub fn is_scoped(&self) -> bool {
        matches!(self, PeerAddr::Ip(SocketAddr::V6(a)) if a.scope_id() != 0)
    }
}

/// `[fe80::1%4]:14318` (the zone as its index), `10.0.0.2:14318`,
/// `gpu-box.lan:14318`: what [`PeerAddr::parse`] reads back.
impl fmt::Display for PeerAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeerAddr::Ip(a) => write!(f, "{a}"),
            PeerAddr::Name { host, port } => write!(f, "{host}:{port}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_interfaces(_: &str) -> std::io::Result<u32> {
        Err(std::io::ErrorKind::NotFound.into())
    }

    fn scoped(s: &str) -> SocketAddrV6 {
        match PeerAddr::parse_with(s, |n| if n == "eth0" { Ok(7) } else { no_interfaces(n) }) {
            Ok(PeerAddr::Ip(SocketAddr::V6(a))) => a,
            other => panic!("{s}: {other:?}"),
        }
    }

    #[test]
    fn zones_become_scope_ids() {
        let a = scoped("[fe80::1%eth0]:14318");
        assert_eq!(
            (a.ip().to_string(), a.port(), a.scope_id()),
            ("fe80::1".into(), 14318, 7)
        );
        let a = scoped("[fe80::1%2]:1");
        assert_eq!(a.scope_id(), 2);
        assert_eq!(a.to_string(), "[fe80::1%2]:1");
        assert_eq!(scoped("[fd00::2]:14318").scope_id(), 0);
        assert!(PeerAddr::Ip(SocketAddr::V6(a)).is_scoped());
        // What Display writes, parse reads back (a name becomes its index).
        let shown = PeerAddr::Ip(SocketAddr::V6(scoped("[fe80::1%eth0]:9"))).to_string();
        assert_eq!(shown, "[fe80::1%7]:9");
        assert_eq!(scoped(&shown).scope_id(), 7);
    }

    #[test]
    fn names_and_v4_parse_as_before() {
        assert_eq!(
            PeerAddr::parse("gpu-box.lan:14318").unwrap(),
            PeerAddr::Name {
                host: "gpu-box.lan".into(),
                port: 14318
            }
        );
        let a = PeerAddr::parse("10.0.0.5:1").unwrap();
        assert_eq!(a.socket_addr(), Some(SocketAddr::from(([10, 0, 0, 5], 1))));
        assert!(!a.is_scoped());
    }

    /// The vectors themselves are `pair_core::addr`'s; here each kind of
    /// refusal becomes its error, naming the input.
    #[test]
    fn bad_addresses_and_zones_are_named() {
        for bad in ["", "host:0", "[nope]:80", "host:1/path"] {
            assert!(
                matches!(PeerAddr::parse(bad), Err(Error::BadAddress { .. })),
                "{bad}"
            );
        }
        for bad in ["[fe80::1%]:80", "[fe80::1%a/b]:80", "10.0.0.1%eth0:80"] {
            let err = PeerAddr::parse_with(bad, no_interfaces).unwrap_err();
            assert!(matches!(err, Error::BadZone { .. }), "{bad}: {err:?}");
            assert!(err.to_string().contains(bad), "{err}");
        }
        let err = PeerAddr::parse_with("[fe80::1%wlan9]:80", no_interfaces).unwrap_err();
        assert!(
            matches!(&err, Error::NoSuchInterface { name, .. } if name == "wlan9"),
            "{err:?}"
        );
        assert!(
            err.to_string()
                .contains("no network interface named \"wlan9\""),
            "{err}"
        );
    }

    #[test]
    fn the_system_knows_loopback_by_name() {
        // Every Linux machine has `lo`; elsewhere loopback has other names.
        if cfg!(target_os = "linux") {
            let lo = interface_index("lo").unwrap();
            assert!(lo > 0);
            let a = PeerAddr::parse("[::1%lo]:14318").unwrap();
            assert_eq!(a.to_string(), format!("[::1%{lo}]:14318"));
        }
        assert!(interface_index("no-such-if0").is_err());
    }
}
