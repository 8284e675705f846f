//! A network namespace joined to this one by a veth pair: another
//! machine's network for tests that must not come from loopback (a LAN
//! client, a tailnet peer). Needs root and iproute2 (CI runs as root);
//! fails loudly otherwise. Removed on drop.

use std::process::{Command, Output};

/// Runs `ip ARGS`, panicking with what it said when it fails.
pub fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "`ip {}` failed: {} (this test needs root and iproute2; CI runs as root)",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The namespace and this side's end of the veth pair.
#[derive(Debug)]
pub struct Joined {
    pub ns: String,
    host_if: String,
}

impl Joined {
    /// Namespace `pair-TAG-PID`: this side has `host_ip`/24, the namespace
    /// `ns_ip`/24 and its loopback up. `tag` is two letters or so
    /// (interface names are at most 15 bytes).
    pub fn create(tag: &str, host_ip: &str, ns_ip: &str) -> Self {
        let pid = std::process::id();
        let joined = Joined {
            ns: format!("pair-{tag}-{pid}"),
            host_if: format!("p{tag}h{pid}"),
        };
        let peer_if = format!("p{tag}n{pid}");
        ip(&["netns", "add", &joined.ns]);
        let host_if = joined.host_if.as_str();
        ip(&[
            "link", "add", host_if, "type", "veth", "peer", "name", &peer_if,
        ]);
        ip(&["link", "set", &peer_if, "netns", &joined.ns]);
        ip(&["addr", "add", &format!("{host_ip}/24"), "dev", host_if]);
        ip(&["link", "set", host_if, "up"]);
        let ns = joined.ns.as_str();
        ip(&[
            "-n",
            ns,
            "addr",
            "add",
            &format!("{ns_ip}/24"),
            "dev",
            &peer_if,
        ]);
        ip(&["-n", ns, "link", "set", &peer_if, "up"]);
        ip(&["-n", ns, "link", "set", "lo", "up"]);
        joined
    }

    /// `ip netns exec NS`, to add the program and its arguments to.
    pub fn exec(&self) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns]);
        c
    }

    /// `program args...` inside the namespace, run to its end.
    pub fn run(&self, program: &str, args: &[&str]) -> Output {
        self.exec()
            .arg(program)
            .args(args)
            .output()
            .expect("run in the namespace")
    }
}

impl Drop for Joined {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_if])
            .output();
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).output();
    }
}
