//! Which interfaces a node uses for mDNS and which addresses it advertises:
//! pure ranking over a list of local addresses.

use std::net::IpAddr;

use crate::txt::MAX_ADDRS;

/// Interfaces mDNS runs on, chosen by configuration, never implicitly.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Interfaces {
    /// 127.0.0.1 only: tests and the single-machine demo. The node then
    /// advertises 127.0.0.1 (the one case where loopback is advertised).
    LoopbackOnly,
    /// Exactly these interfaces (by name). Chosen explicitly, so no
    /// virtual-interface filter applies; link-local addresses still never
    /// get advertised.
    Named(Vec<String>),
    /// Every interface except loopback and container/VM bridges
    /// (see [`is_virtual_interface`]): a LAN node's default.
    AllExceptVirtual,
}

impl std::str::FromStr for Interfaces {
    type Err = crate::DiscoveryError;

    /// `loopback`, `all` (all except virtual), or a comma-separated list of
    /// interface names (`eth0,wlan0`; on Windows `Ethernet 2,Wi-Fi`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse_for(pair_os::Os::current(), s)
    }
}

impl Interfaces {
    /// `Interfaces::from_str` with `os`'s interface name rules
    /// (`pair_os::net::valid_interface_name`).
    pub fn parse_for(os: pair_os::Os, s: &str) -> Result<Self, crate::DiscoveryError> {
        match s.trim() {
            "loopback" => Ok(Interfaces::LoopbackOnly),
            "all" => Ok(Interfaces::AllExceptVirtual),
            list => {
                let names: Vec<String> = list.split(',').map(|n| n.trim().to_owned()).collect();
                if names.iter().all(|n| pair_os::valid_interface_name(os, n)) {
                    Ok(Interfaces::Named(names))
                } else {
                    Err(crate::DiscoveryError::BadInterfaces {
                        input: s.to_owned(),
                    })
                }
            }
        }
    }
}

impl std::fmt::Display for Interfaces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Interfaces::LoopbackOnly => f.write_str("loopback"),
            Interfaces::AllExceptVirtual => f.write_str("all"),
            Interfaces::Named(names) => f.write_str(&names.join(",")),
        }
    }
}

/// One address of a local interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalAddr {
    pub interface: String,
    pub ip: IpAddr,
    pub is_loopback: bool,
}

/// Whether `name` is, on this OS, a container or VM bridge or a tunnel that
/// must not be advertised as the LAN (Docker's and libvirt's on Linux,
/// `bridge*` and `utun*` on macOS, `vEthernet (...)` on Windows: the rules
/// are `pair_os::net::is_virtual_interface`, tested for each OS there).
pub fn is_virtual_interface(name: &str) -> bool {
    pair_os::is_virtual_interface(pair_os::Os::current(), name)
}

/// Link-local (169.254/16, fe80::/10): valid on one link only, never advertised.
pub fn is_link_local(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    }
}

/// Whether `selection` puts `addr` on the mDNS sockets.
pub fn selects(selection: &Interfaces, addr: &LocalAddr) -> bool {
    match selection {
        Interfaces::LoopbackOnly => addr.is_loopback && addr.ip.is_ipv4(),
        Interfaces::Named(names) => names.contains(&addr.interface),
        Interfaces::AllExceptVirtual => {
            !addr.is_loopback && !is_virtual_interface(&addr.interface) && !is_link_local(addr.ip)
        }
    }
}

/// The addresses to advertise in TXT, best first, at most [`MAX_ADDRS`].
///
/// Never loopback (unless the selection is loopback-only or names a loopback
/// interface explicitly), never link-local, never a container bridge under
/// [`Interfaces::AllExceptVirtual`]. Order: private IPv4 (the usual LAN),
/// other IPv4, unique-local IPv6, global IPv6, loopback last; ties keep the
/// interface order the OS gave.
pub fn advertised_addrs(selection: &Interfaces, local: &[LocalAddr]) -> Vec<IpAddr> {
    let mut picked: Vec<&LocalAddr> = local
        .iter()
        .filter(|a| selects(selection, a) && !is_link_local(a.ip) && !a.ip.is_unspecified())
        .collect();
    picked.sort_by_key(|a| rank(a));
    let mut out: Vec<IpAddr> = Vec::new();
    for a in picked {
        if !out.contains(&a.ip) && out.len() < MAX_ADDRS {
            out.push(a.ip);
        }
    }
    out
}

fn rank(a: &LocalAddr) -> u8 {
    match a.ip {
        _ if a.is_loopback || a.ip.is_loopback() => 5,
        IpAddr::V4(v4) if v4.is_private() => 0,
        IpAddr::V4(_) => 1,
        IpAddr::V6(v6) if (v6.segments()[0] & 0xfe00) == 0xfc00 => 2,
        IpAddr::V6(_) => 3,
    }
}

/// The machine's addresses, from `if-addrs`.
pub fn local_addrs() -> std::io::Result<Vec<LocalAddr>> {
    Ok(if_addrs::get_if_addrs()?
        .into_iter()
        .map(|i| LocalAddr {
            is_loopback: i.is_loopback(),
            ip: i.ip(),
            interface: i.name,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn la(name: &str, ip: &str) -> LocalAddr {
        let ip: IpAddr = ip.parse().unwrap();
        LocalAddr {
            interface: name.into(),
            ip,
            is_loopback: ip.is_loopback(),
        }
    }

    fn host() -> Vec<LocalAddr> {
        vec![
            la("lo", "127.0.0.1"),
            la("lo", "::1"),
            la("eth0", "fe80::1"),
            la("eth0", "2001:db8::5"),
            la("eth0", "192.168.1.20"),
            la("wlan0", "169.254.3.3"),
            la("wlan0", "fd00::7"),
            la("docker0", "172.17.0.1"),
            la("br-1234", "172.18.0.1"),
            la("veth99", "10.99.0.1"),
            la("virbr0", "192.168.122.1"),
        ]
    }

    // Linux interface names: the rule is the host's.
    #[cfg(target_os = "linux")]
    #[test]
    fn lan_node_advertises_only_reachable_addresses_ranked() {
        let got = advertised_addrs(&Interfaces::AllExceptVirtual, &host());
        let want: Vec<IpAddr> = ["192.168.1.20", "fd00::7", "2001:db8::5"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn loopback_only_advertises_127_0_0_1() {
        let got = advertised_addrs(&Interfaces::LoopbackOnly, &host());
        assert_eq!(got, vec!["127.0.0.1".parse::<IpAddr>().unwrap()]);
    }

    #[test]
    fn named_interfaces_are_taken_as_chosen_but_never_link_local() {
        let got = advertised_addrs(
            &Interfaces::Named(vec!["veth99".into(), "wlan0".into()]),
            &host(),
        );
        let want: Vec<IpAddr> = ["10.99.0.1", "fd00::7"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn interface_selection_parses_and_prints() {
        assert_eq!(
            "loopback".parse::<Interfaces>().unwrap(),
            Interfaces::LoopbackOnly
        );
        assert_eq!(
            "all".parse::<Interfaces>().unwrap(),
            Interfaces::AllExceptVirtual
        );
        let named: Interfaces = "eth0, wlan0".parse().unwrap();
        assert_eq!(
            named,
            Interfaces::Named(vec!["eth0".into(), "wlan0".into()])
        );
        assert_eq!(named.to_string(), "eth0,wlan0");
        for bad in ["", "eth0,", "a/b", "averyveryverylongname0"] {
            assert!(bad.parse::<Interfaces>().is_err(), "{bad:?}");
        }
        // Windows names its adapters for people.
        let win = Interfaces::parse_for(pair_os::Os::Windows, "Ethernet 2, Wi-Fi").unwrap();
        assert_eq!(
            win,
            Interfaces::Named(vec!["Ethernet 2".into(), "Wi-Fi".into()])
        );
        assert!(Interfaces::parse_for(pair_os::Os::Linux, "Ethernet 2").is_err());
        assert!(Interfaces::parse_for(pair_os::Os::MacOs, "en0,bridge100").is_ok());
    }

    // Linux interface names: the rule is the host's.
    #[cfg(target_os = "linux")]
    #[test]
    fn virtual_names() {
        for n in [
            "docker0",
            "veth1a2b",
            "br-0f3e",
            "virbr0",
            "cni0",
            "flannel.1",
        ] {
            assert!(is_virtual_interface(n), "{n}");
        }
        for n in ["eth0", "enp3s0", "wlan0", "wlp2s0", "bond0", "tailscale0"] {
            assert!(!is_virtual_interface(n), "{n}");
        }
    }

    fn arb_local() -> impl Strategy<Value = LocalAddr> {
        let names = prop_oneof![
            Just("lo"),
            Just("eth0"),
            Just("wlan0"),
            Just("docker0"),
            Just("veth3"),
            Just("br-x")
        ];
        let ip = prop_oneof![
            any::<[u8; 4]>().prop_map(IpAddr::from),
            any::<[u16; 8]>().prop_map(IpAddr::from),
            Just("127.0.0.1".parse::<IpAddr>().unwrap()),
            Just("169.254.1.1".parse::<IpAddr>().unwrap()),
        ];
        (names, ip).prop_map(|(n, ip)| LocalAddr {
            interface: n.into(),
            ip,
            is_loopback: n == "lo" || ip.is_loopback(),
        })
    }

    proptest! {
        #[test]
        fn lan_selection_never_leaks_unreachable_addresses(local in proptest::collection::vec(arb_local(), 0..12)) {
            let got = advertised_addrs(&Interfaces::AllExceptVirtual, &local);
            prop_assert!(got.len() <= MAX_ADDRS);
            for ip in &got {
                prop_assert!(!ip.is_loopback() && !is_link_local(*ip));
                let owners: Vec<&LocalAddr> = local.iter().filter(|a| a.ip == *ip).collect();
                prop_assert!(owners.iter().any(|a| !is_virtual_interface(&a.interface) && !a.is_loopback));
            }
            let mut dedup = got.clone();
            dedup.dedup();
            prop_assert_eq!(dedup.len(), got.len());
        }
    }
}
