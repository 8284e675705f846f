//! Stopping an engine the node started, with everything it started (Ollama
//! runs its models in runner processes of its own): on Unix the engine
//! leads a new process group and the group is signalled; on Windows it gets
//! a new process group (so a Ctrl-C in the node's console is not also
//! delivered to it) and its process tree is ended with `taskkill /T`, since
//! killing the direct child alone would orphan the runners.

use crate::Os;

/// Windows' `CREATE_NEW_PROCESS_GROUP` process creation flag.
pub const CREATE_NEW_PROCESS_GROUP: u32 = 0x0000_0200;

/// How an engine is started so that its whole tree can be stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isolation {
    /// `setpgid(0, 0)`: the engine leads a process group of its own.
    ProcessGroup,
    /// `CREATE_NEW_PROCESS_GROUP`.
    NewProcessGroup,
}

/// How `os` starts an engine.
pub const fn isolation(os: Os) -> Isolation {
    match os {
        Os::Linux | Os::MacOs => Isolation::ProcessGroup,
        Os::Windows => Isolation::NewProcessGroup,
    }
}

/// How hard a stop is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// Ask the tree to exit (SIGTERM; `taskkill` without `/F`).
    Graceful,
    /// End it (SIGKILL; `taskkill /F`), after the grace period.
    Force,
}

/// A system command that stops a process tree (run by the caller: the
/// workspace forbids `unsafe`, so no signal is sent through libc).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StopCommand {
    pub program: &'static str,
    pub args: Vec<String>,
}

/// The command that stops the tree led by `pid` on `os` (`None` for pid 0,
/// which would name the caller's own group on Unix).
pub fn stop_command(os: Os, pid: u32, stop: Stop) -> Option<StopCommand> {
    if pid == 0 {
        return None;
    }
    Some(match os {
        Os::Linux | Os::MacOs => StopCommand {
            program: "kill",
            args: vec![
                match stop {
                    Stop::Graceful => "-TERM",
                    Stop::Force => "-KILL",
                }
                .to_owned(),
                "--".to_owned(),
                // A negative pid names the process group it leads.
                format!("-{pid}"),
            ],
        },
        Os::Windows => {
            let mut args = vec!["/PID".to_owned(), pid.to_string(), "/T".to_owned()];
            if stop == Stop::Force {
                args.push("/F".to_owned());
            }
            StopCommand {
                program: "taskkill",
                args,
            }
        }
    })
}

/// Starts `command` as [`isolation`] says for this host.
pub fn isolate(command: &mut std::process::Command) {
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        command.process_group(0);
    }
    #[cfg(windows)]
    {
        use std::os::windows::process::CommandExt;
        command.creation_flags(CREATE_NEW_PROCESS_GROUP);
    }
    #[cfg(not(any(unix, windows)))]
    let _ = command;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_signals_the_group_and_windows_ends_the_tree() {
        assert_eq!(isolation(Os::Linux), Isolation::ProcessGroup);
        assert_eq!(isolation(Os::MacOs), Isolation::ProcessGroup);
        assert_eq!(isolation(Os::Windows), Isolation::NewProcessGroup);
        let term = stop_command(Os::Linux, 42, Stop::Graceful).unwrap();
        assert_eq!(
            (term.program, term.args.join(" ").as_str()),
            ("kill", "-TERM -- -42")
        );
        let kill = stop_command(Os::MacOs, 42, Stop::Force).unwrap();
        assert_eq!(kill.args.join(" "), "-KILL -- -42");
        let ask = stop_command(Os::Windows, 42, Stop::Graceful).unwrap();
        assert_eq!(
            (ask.program, ask.args.join(" ").as_str()),
            ("taskkill", "/PID 42 /T")
        );
        let end = stop_command(Os::Windows, 42, Stop::Force).unwrap();
        assert_eq!(end.args.join(" "), "/PID 42 /T /F");
        for os in Os::ALL {
            assert_eq!(stop_command(os, 0, Stop::Force), None);
        }
    }

    /// The Unix plan stops a grandchild too: `sh` starts `sleep` in its
    /// group, and the group's SIGTERM ends both. (Linux: whether the
    /// grandchild is gone is read from /proc, where a dead one not yet
    /// reaped by init shows as a zombie.)
    #[cfg(target_os = "linux")]
    #[test]
    fn the_group_stop_reaches_the_grandchildren() {
        let mut cmd = std::process::Command::new("sh");
        cmd.args(["-c", "sleep 30 & echo $!; wait"])
            .stdout(std::process::Stdio::piped());
        isolate(&mut cmd);
        let mut child = cmd.spawn().unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let grandchild: u32 = line.trim().parse().unwrap();
        let stop = stop_command(Os::Linux, child.id(), Stop::Graceful).unwrap();
        let st = std::process::Command::new(stop.program)
            .args(&stop.args)
            .status()
            .unwrap();
        assert!(st.success());
        child.wait().unwrap();
        let alive = || {
            std::fs::read_to_string(format!("/proc/{grandchild}/stat"))
                .ok()
                .and_then(|s| {
                    let state = s.rsplit_once(')')?.1.split_whitespace().next()?.to_owned();
                    Some(state != "Z" && state != "X")
                })
                .unwrap_or(false)
        };
        let mut gone = false;
        for _ in 0..250 {
            if !alive() {
                gone = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(gone, "grandchild {grandchild} survived its group's SIGTERM");
    }
}
