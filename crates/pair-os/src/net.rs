//! Interfaces and sockets: which interfaces are container, VM or tunnel
//! plumbing that must not be advertised as the LAN, which names an OS can
//! give an interface, and listening sockets whose `[::]` takes IPv4 too on
//! every OS (Windows makes an IPv6 socket IPv6-only unless told).

use std::net::SocketAddr;

use crate::Os;

/// Linux interface-name prefixes of container and VM plumbing other
/// machines cannot reach: Docker (`docker0`, `br-*`, `veth*`), libvirt
/// (`virbr*`), LXC/LXD, Podman, CNI/Kubernetes overlays, VirtualBox and
/// VMware host-only.
const LINUX_VIRTUAL: &[&str] = &[
    "docker", "br-", "veth", "virbr", "lxcbr", "lxdbr", "podman", "cni", "flannel", "cali",
    "weave", "kube-", "vboxnet", "vmnet", "tunl0", "ifb",
];

/// macOS: Internet Sharing and VM bridges (`bridge100`), VPN and iCloud
/// Private Relay tunnels (`utun*`, `ipsec*`), Apple Wireless Direct Link
/// and low-latency WLAN (`awdl0`, `llw0`), the `anpi*` and `ap*` links,
/// 6to4/gif tunnels, and VM adapters (Apple Virtualization's `vmenet*`,
/// VirtualBox, VMware).
const MACOS_VIRTUAL: &[&str] = &[
    "bridge", "utun", "ipsec", "awdl", "llw", "anpi", "ap1", "gif", "stf", "vmenet", "vboxnet",
    "vmnet", "feth",
];

/// Windows friendly names (compared without case): Hyper-V, WSL and Docker
/// Desktop switches (`vEthernet (WSL)`), VirtualBox and VMware host-only
/// adapters, and the loopback pseudo-interface.
const WINDOWS_VIRTUAL_PREFIXES: &[&str] = &[
    "vethernet",
    "virtualbox host-only",
    "vmware network adapter",
    "loopback pseudo-interface",
    "bluetooth network connection",
];

/// Whether `name` is, on `os`, an interface that must not be advertised as
/// the LAN.
pub fn is_virtual_interface(os: Os, name: &str) -> bool {
    match os {
        Os::Linux => LINUX_VIRTUAL.iter().any(|p| name.starts_with(p)),
        Os::MacOs => MACOS_VIRTUAL.iter().any(|p| name.starts_with(p)),
        Os::Windows => {
            let lower = name.to_lowercase();
            WINDOWS_VIRTUAL_PREFIXES
                .iter()
                .any(|p| lower.starts_with(p))
        }
    }
}

/// Whether `name` can name an interface on `os`: Linux and macOS names are
/// 1-15 bytes (`IFNAMSIZ`) without spaces, `/` or `:`; Windows names are
/// the adapters' friendly names (`Ethernet 2`, `Wi-Fi`, `vEthernet (WSL)`):
/// spaces and brackets allowed, up to 256 characters, no control
/// characters. A comma never (it separates names in `--mdns-interfaces`).
pub fn valid_interface_name(os: Os, name: &str) -> bool {
    if name.is_empty() || name.contains(',') || name.chars().any(char::is_control) {
        return false;
    }
    match os {
        Os::Linux | Os::MacOs => {
            name.len() <= 15 && !name.contains(['/', ':']) && !name.contains(char::is_whitespace)
        }
        Os::Windows => {
            name.chars().count() <= 256 && name.trim() == name && !name.contains(['\\', '/'])
        }
    }
}

/// The `IPV6_V6ONLY` setting a listener on `addr` gets: off (dual stack)
/// for the unspecified IPv6 address, so `[::]` takes IPv4 too on every OS,
/// as Linux does by default and Windows does not; untouched otherwise.
pub fn v6only_for(addr: SocketAddr) -> Option<bool> {
    match addr {
        SocketAddr::V6(v6) if v6.ip().is_unspecified() => Some(false),
        _ => None,
    }
}

/// A listening TCP socket on `addr` (non-blocking, address reuse as
/// `std`/tokio set it on Unix), `[::]` explicitly dual-stack.
pub fn bind_tcp(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if let Some(only) = v6only_for(addr) {
        socket.set_only_v6(only)?;
    }
    // What std and tokio do on Unix: a restarted node rebinds at once
    // despite connections in TIME_WAIT. (On Windows SO_REUSEADDR would let
    // another process steal the port, so it stays off there.)
    #[cfg(unix)]
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_os_has_its_own_virtual_interfaces() {
        for n in [
            "docker0",
            "veth1a2b",
            "br-0f3e",
            "virbr0",
            "cni0",
            "flannel.1",
        ] {
            assert!(is_virtual_interface(Os::Linux, n), "{n}");
        }
        for n in ["eth0", "enp3s0", "wlan0", "wlp2s0", "bond0", "tailscale0"] {
            assert!(!is_virtual_interface(Os::Linux, n), "{n}");
        }
        for n in [
            "bridge100",
            "utun3",
            "awdl0",
            "llw0",
            "anpi1",
            "vmenet0",
            "gif0",
            "stf0",
            "ap1",
        ] {
            assert!(is_virtual_interface(Os::MacOs, n), "{n}");
        }
        for n in ["en0", "en1", "en7"] {
            assert!(!is_virtual_interface(Os::MacOs, n), "{n}");
        }
        for n in [
            "vEthernet (WSL)",
            "vEthernet (Default Switch)",
            "VirtualBox Host-Only Network #2",
            "VMware Network Adapter VMnet8",
            "Loopback Pseudo-Interface 1",
        ] {
            assert!(is_virtual_interface(Os::Windows, n), "{n}");
        }
        for n in ["Ethernet", "Ethernet 2", "Wi-Fi", "Tailscale"] {
            assert!(!is_virtual_interface(Os::Windows, n), "{n}");
        }
        // A rule is the OS's own: macOS's bridge is a Linux LAN bond's name.
        assert!(!is_virtual_interface(Os::Linux, "bridge0"));
        assert!(!is_virtual_interface(Os::MacOs, "docker0"));
    }

    #[test]
    fn interface_names_follow_the_os() {
        for os in [Os::Linux, Os::MacOs] {
            for ok in ["eth0", "en0", "wlp2s0", "a234567890abcde"] {
                assert!(valid_interface_name(os, ok), "{os} {ok}");
            }
            for bad in ["", "Ethernet 2", "a/b", "eth0:1", "a234567890abcdef", "a,b"] {
                assert!(!valid_interface_name(os, bad), "{os} {bad:?}");
            }
        }
        for ok in [
            "Ethernet 2",
            "Wi-Fi",
            "vEthernet (WSL)",
            "Local Area Connection* 10",
            "eth0",
        ] {
            assert!(valid_interface_name(Os::Windows, ok), "{ok}");
        }
        let long = "x".repeat(257);
        for bad in [
            "",
            " Ethernet",
            "Ethernet ",
            "a,b",
            "a\nb",
            "a\\b",
            long.as_str(),
        ] {
            assert!(!valid_interface_name(Os::Windows, bad), "{bad:?}");
        }
    }

    #[test]
    fn an_unspecified_v6_bind_is_set_dual_stack() {
        let any6: SocketAddr = "[::]:0".parse().unwrap();
        assert_eq!(v6only_for(any6), Some(false));
        for other in ["[::1]:0", "0.0.0.0:0", "127.0.0.1:80", "[fd00::1]:1"] {
            assert_eq!(v6only_for(other.parse().unwrap()), None, "{other}");
        }
    }

    /// `[::]` takes IPv4 connections (where the host has IPv6 at all).
    #[test]
    fn a_dual_stack_listener_accepts_ipv4() {
        let listener = match bind_tcp("[::]:0".parse().unwrap()) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("skipped: no IPv6 on this host: {e}");
                return;
            }
        };
        let port = listener.local_addr().unwrap().port();
        let v4 = std::net::TcpStream::connect(("127.0.0.1", port));
        assert!(v4.is_ok(), "IPv4 connect to [::]:{port}: {v4:?}");
        let v4only = bind_tcp("127.0.0.1:0".parse().unwrap()).unwrap();
        assert!(v4only.local_addr().unwrap().is_ipv4());
    }
}
