//! `pair-node service install|uninstall|status`: the node started at boot
//! (or login) by the OS's service manager, with the flags it was given and
//! its state dir: a systemd user unit on Linux, a launchd agent on macOS, a
//! Windows service (the service controller, `sc.exe`). The definitions are
//! pure text built here ([`systemd_unit`], [`launchd_plist`],
//! [`windows_bin_path`]) and unit-tested against their formats; the
//! `service-manager` crate writes and registers them.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use pair_os::Os;
use service_manager::{
    LaunchdServiceManager, RestartPolicy, ScServiceManager, ServiceInstallCtx, ServiceLabel,
    ServiceManager, ServiceManagerKind, ServiceStartCtx, ServiceStatus, ServiceStatusCtx,
    ServiceStopCtx, ServiceUninstallCtx, SystemdServiceManager,
};

/// What the service runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceSpec {
    /// The `pair-node` executable.
    pub program: PathBuf,
    /// Its arguments: `run` and the node's flags.
    pub args: Vec<String>,
    /// Its state dir (identity, keys, trust store, job log).
    pub state_dir: PathBuf,
    /// Where launchd writes its output (systemd has the journal; Windows
    /// services have no console).
    pub log_dir: PathBuf,
}

/// The service's name: `pair-node` (the systemd unit `pair-node.service`),
/// `io.pair.node` (the launchd label and the Windows service's name).
pub fn label() -> ServiceLabel {
    ServiceLabel {
        qualifier: Some("io".to_owned()),
        organization: Some("pair".to_owned()),
        application: "node".to_owned(),
    }
}

/// The service manager each OS uses.
pub const fn manager_kind(os: Os) -> ServiceManagerKind {
    match os {
        Os::Linux => ServiceManagerKind::Systemd,
        Os::MacOs => ServiceManagerKind::Launchd,
        Os::Windows => ServiceManagerKind::Sc,
    }
}

impl ServiceSpec {
    /// The node as `pair-node run RUN_ARGS` would start it, its state dir
    /// from `--state-dir` among them, else `default_state_dir`. The flags
    /// are checked now (as `run` will parse them at boot), so a typo fails
    /// the install rather than the service.
    pub fn for_node(
        program: PathBuf,
        run_args: &[String],
        default_state_dir: Option<PathBuf>,
        log_dir: PathBuf,
    ) -> Result<Self, crate::config::ConfigError> {
        #[derive(clap::Parser)]
        #[command(name = "pair-node run", no_binary_name = true)]
        struct Run {
            #[command(flatten)]
            args: crate::config::RunArgs,
        }
        let parsed = <Run as clap::Parser>::try_parse_from(run_args)
            .map_err(crate::config::ConfigError::Service)?;
        let state_dir = match parsed.args.state_dir {
            Some(dir) => dir,
            None => default_state_dir.ok_or(crate::config::ConfigError::NoStateDir)?,
        };
        let mut args = vec!["run".to_owned()];
        args.extend(run_args.iter().cloned());
        if !args
            .iter()
            .any(|a| a == "--state-dir" || a.starts_with("--state-dir="))
        {
            // Every manager gets it as a flag too: the Windows service
            // controller has no per-service environment.
            args.push("--state-dir".to_owned());
            args.push(state_dir.display().to_string());
        }
        Ok(Self {
            program,
            args,
            state_dir,
            log_dir,
        })
    }
}

impl ServiceSpec {
    /// The command line's arguments under `os`'s manager: on Windows, the
    /// node is told it runs under the service controller (which it must
    /// answer within 30 s).
    pub fn args_for(&self, os: Os) -> Vec<String> {
        let lead = (os == Os::Windows).then(|| WINDOWS_SERVICE_FLAG.to_owned());
        lead.into_iter().chain(self.args.iter().cloned()).collect()
    }
}

/// The flag that tells `pair-node` the Windows service controller started
/// it.
pub const WINDOWS_SERVICE_FLAG: &str = "--windows-service";

/// A systemd unit: `ExecStart` with the node's flags, its state dir in
/// the environment, restarted when it fails, wanted by the user's default
/// target (with lingering, `loginctl enable-linger`, that is at boot).
pub fn systemd_unit(spec: &ServiceSpec) -> String {
    let exec = std::iter::once(spec.program.display().to_string())
        .chain(spec.args.iter().cloned())
        .map(|w| systemd_word(&w))
        .collect::<Vec<_>>()
        .join(" ");
    let env = systemd_word(&format!("PAIR_STATE_DIR={}", spec.state_dir.display()));
    format!(
        "[Unit]\n\
         Description=pair node: peer-to-peer LLM inference router\n\
         \n\
         [Service]\n\
         Type=exec\n\
         ExecStart={exec}\n\
         Environment={env}\n\
         Restart=on-failure\n\
         RestartSec=2\n\
         TimeoutStopSec=30\n\
         \n\
         [Install]\n\
         WantedBy=default.target\n"
    )
}

/// One word of a systemd command line or assignment: `%` is a specifier
/// and `$` a variable there, so both are doubled; a word with spaces,
/// quotes or backslashes is double-quoted with C-style escapes.
fn systemd_word(word: &str) -> String {
    let escaped = word.replace('%', "%%").replace('$', "$$");
    let plain = !escaped.is_empty()
        && !escaped
            .chars()
            .any(|c| c.is_whitespace() || matches!(c, '"' | '\'' | '\\' | ';'));
    if plain {
        return escaped;
    }
    let mut out = String::from("\"");
    for c in escaped.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A launchd agent: `Label`, `ProgramArguments`, its state dir in
/// `EnvironmentVariables`, started at load (login) and kept alive when it
/// exits with a failure, output to the log folder.
pub fn launchd_plist(spec: &ServiceSpec) -> String {
    let s = |v: &str| format!("<string>{}</string>", xml_escape(v));
    let mut argv = String::new();
    for a in std::iter::once(spec.program.display().to_string()).chain(spec.args.iter().cloned()) {
        argv.push_str("\t\t");
        argv.push_str(&s(&a));
        argv.push('\n');
    }
    let log = spec.log_dir.join("pair-node.log").display().to_string();
    format!(
        r#"<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0">
<dict>
	<key>Label</key>
	{label}
	<key>ProgramArguments</key>
	<array>
{argv}	</array>
	<key>EnvironmentVariables</key>
	<dict>
		<key>PAIR_STATE_DIR</key>
		{state}
	</dict>
	<key>RunAtLoad</key>
	<true/>
	<key>KeepAlive</key>
	<dict>
		<key>SuccessfulExit</key>
		<false/>
	</dict>
	<key>ProcessType</key>
	<string>Background</string>
	<key>StandardOutPath</key>
	{log}
	<key>StandardErrorPath</key>
	{log}
</dict>
</plist>
"#,
        label = s(&label().to_qualified_name()),
        state = s(&spec.state_dir.display().to_string()),
        log = s(&log),
    )
}

fn xml_escape(v: &str) -> String {
    v.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The Windows service's `binPath=`: the program and its arguments quoted
/// as the C runtime splits them (`pair_os::cmdline::split_windows` gives
/// back the same words).
pub fn windows_bin_path(spec: &ServiceSpec) -> String {
    std::iter::once(spec.program.display().to_string())
        .chain(spec.args_for(Os::Windows))
        .map(|w| pair_os::cmdline::quote_windows(&w))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The `sc.exe create` arguments the service controller gets (what
/// `service-manager` runs for [`install`] on Windows).
pub fn windows_sc_create(spec: &ServiceSpec) -> Vec<String> {
    let name = label().to_qualified_name();
    vec![
        "create".to_owned(),
        name.clone(),
        "type=".to_owned(),
        "own".to_owned(),
        "start=".to_owned(),
        "auto".to_owned(),
        "error=".to_owned(),
        "normal".to_owned(),
        "binpath=".to_owned(),
        windows_bin_path(spec),
        "displayname=".to_owned(),
        name,
    ]
}

/// Where the service stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    NotInstalled,
    Running,
    /// Installed, not running (with the manager's reason, if it gave one).
    Stopped(Option<String>),
}

impl std::fmt::Display for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            State::NotInstalled => f.write_str("not installed"),
            State::Running => f.write_str("installed, running"),
            State::Stopped(None) => f.write_str("installed, not running"),
            State::Stopped(Some(why)) => write!(f, "installed, not running ({why})"),
        }
    }
}

fn manager(os: Os) -> Box<dyn ServiceManager> {
    match os {
        Os::Linux => Box::new(SystemdServiceManager::user()),
        Os::MacOs => Box::new(LaunchdServiceManager::user()),
        Os::Windows => Box::new(ScServiceManager::system()),
    }
}

/// Writes and registers the service for this OS and starts it.
pub fn install(spec: &ServiceSpec) -> std::io::Result<()> {
    let os = Os::current();
    let contents = match os {
        Os::Linux => Some(systemd_unit(spec)),
        Os::MacOs => {
            pair_fs::ensure_private_dir(&spec.log_dir)?;
            Some(launchd_plist(spec))
        }
        Os::Windows => None,
    };
    let m = manager(os);
    m.install(ServiceInstallCtx {
        label: label(),
        program: spec.program.clone(),
        args: spec.args_for(os).into_iter().map(OsString::from).collect(),
        contents,
        username: None,
        working_directory: Some(spec.state_dir.clone()).filter(|d| d.is_dir()),
        environment: Some(vec![(
            "PAIR_STATE_DIR".to_owned(),
            spec.state_dir.display().to_string(),
        )]),
        autostart: true,
        restart_policy: RestartPolicy::OnFailure {
            delay_secs: Some(2),
            max_retries: None,
            reset_after_secs: None,
        },
    })?;
    // launchd starts an agent as it loads it (RunAtLoad).
    if os != Os::MacOs {
        m.start(ServiceStartCtx { label: label() })?;
    }
    Ok(())
}

/// Stops and removes the service.
pub fn uninstall() -> std::io::Result<()> {
    let m = manager(Os::current());
    if m.status(ServiceStatusCtx { label: label() })? == ServiceStatus::Running {
        m.stop(ServiceStopCtx { label: label() })?;
    }
    m.uninstall(ServiceUninstallCtx { label: label() })
}

/// Whether the service is installed and running.
pub fn status() -> std::io::Result<State> {
    Ok(
        match manager(Os::current()).status(ServiceStatusCtx { label: label() })? {
            ServiceStatus::NotInstalled => State::NotInstalled,
            ServiceStatus::Running => State::Running,
            ServiceStatus::Stopped(why) => State::Stopped(why),
        },
    )
}

/// Writes the unit for this OS's manager into `dir` (for a look before
/// installing, and for `systemd-analyze verify` in the tests); returns its
/// path.
pub fn write_definition(os: Os, spec: &ServiceSpec, dir: &Path) -> std::io::Result<PathBuf> {
    let (name, text) = match os {
        Os::Linux => (
            format!("{}.service", label().to_script_name()),
            systemd_unit(spec),
        ),
        Os::MacOs => (
            format!("{}.plist", label().to_qualified_name()),
            launchd_plist(spec),
        ),
        // The service controller keeps no file: its `sc.exe` arguments,
        // as a JSON array.
        Os::Windows => (
            format!("{}.sc.json", label().to_qualified_name()),
            serde_json::to_string_pretty(&windows_sc_create(spec))?,
        ),
    };
    let path = dir.join(name);
    std::fs::write(&path, text)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(program: &str, state: &str) -> ServiceSpec {
        let args: Vec<String> = [
            "--name",
            "gpu box",
            "--engine-cmd",
            "ollama serve --x 100% $HOME",
            "--alias",
            "claude-*=qwen2.5:7b",
        ]
        .map(str::to_owned)
        .to_vec();
        ServiceSpec::for_node(
            PathBuf::from(program),
            &args,
            Some(PathBuf::from(state)),
            PathBuf::from("/Users/a/Library/Logs/pair"),
        )
        .unwrap()
    }

    /// The words of a systemd `ExecStart=` line, unquoted as systemd reads
    /// them (double quotes with C escapes; `%%` and `$$` single).
    fn systemd_words(line: &str) -> Vec<String> {
        let mut words = Vec::new();
        let mut chars = line.chars().peekable();
        while let Some(&c) = chars.peek() {
            if c == ' ' {
                chars.next();
                continue;
            }
            let mut w = String::new();
            if c == '"' {
                chars.next();
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => match chars.next() {
                            Some('n') => w.push('\n'),
                            Some('t') => w.push('\t'),
                            Some(o) => w.push(o),
                            None => {}
                        },
                        c => w.push(c),
                    }
                }
            } else {
                while let Some(&c) = chars.peek() {
                    if c == ' ' {
                        break;
                    }
                    w.push(c);
                    chars.next();
                }
            }
            words.push(w.replace("%%", "%").replace("$$", "$"));
        }
        words
    }

    #[test]
    fn the_node_runs_with_its_flags_and_state_dir() {
        let s = spec("/usr/local/bin/pair-node", "/home/u/.config/pair");
        assert_eq!(s.args[0], "run");
        assert_eq!(s.args[2], "gpu box");
        assert_eq!(
            &s.args[s.args.len() - 2..],
            ["--state-dir", "/home/u/.config/pair"]
        );
        let own = ServiceSpec::for_node(
            "p".into(),
            &["--state-dir=/srv/pair".to_owned()],
            None,
            "/l".into(),
        )
        .unwrap();
        assert_eq!(own.state_dir, PathBuf::from("/srv/pair"));
        assert_eq!(own.args, ["run", "--state-dir=/srv/pair"]);
        // A flag `run` would refuse fails the install, not the boot.
        assert!(matches!(
            ServiceSpec::for_node(
                "p".into(),
                &["--no-such-flag".to_owned()],
                None,
                "/l".into()
            ),
            Err(crate::config::ConfigError::Service(_))
        ));
        assert!(matches!(
            ServiceSpec::for_node("p".into(), &[], None, "/l".into()),
            Err(crate::config::ConfigError::NoStateDir)
        ));
        assert_eq!(manager_kind(Os::Linux), ServiceManagerKind::Systemd);
        assert_eq!(manager_kind(Os::MacOs), ServiceManagerKind::Launchd);
        assert_eq!(manager_kind(Os::Windows), ServiceManagerKind::Sc);
        assert_eq!(label().to_script_name(), "pair-node");
    }

    #[test]
    fn the_systemd_unit_has_its_sections_and_keeps_every_word() {
        let s = spec("/opt/pair dir/pair-node", "/home/u/.config/pair");
        let unit = systemd_unit(&s);
        let mut section = "";
        let mut keys = Vec::new();
        for line in unit.lines().filter(|l| !l.is_empty()) {
            if line.starts_with('[') {
                assert!(line.ends_with(']'), "{line}");
                section = line;
                continue;
            }
            let (k, v) = line.split_once('=').expect("key=value");
            keys.push((section, k, v.to_owned()));
        }
        let get = |sec: &str, key: &str| {
            keys.iter()
                .find(|(s, k, _)| *s == sec && *k == key)
                .map(|(_, _, v)| v.clone())
        };
        let exec = get("[Service]", "ExecStart").unwrap();
        let mut argv = vec![s.program.display().to_string()];
        argv.extend(s.args.iter().cloned());
        assert_eq!(systemd_words(&exec), argv);
        assert_eq!(
            systemd_words(&get("[Service]", "Environment").unwrap()),
            ["PAIR_STATE_DIR=/home/u/.config/pair"]
        );
        assert_eq!(get("[Service]", "Restart").as_deref(), Some("on-failure"));
        assert_eq!(
            get("[Install]", "WantedBy").as_deref(),
            Some("default.target")
        );
        assert!(get("[Unit]", "Description").is_some());
    }

    /// `systemd-analyze verify` accepts the unit (CI installs systemd's
    /// tools: scripts/setup.sh). It checks the program exists, so the unit
    /// runs this test's own executable.
    #[test]
    fn systemd_analyze_verifies_the_generated_unit() {
        let found = std::process::Command::new("systemd-analyze")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            eprintln!(
                "skipped: systemd-analyze is not installed (Debian's `systemd` package; \
                 scripts/setup.sh installs it for CI)"
            );
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let exe = std::env::current_exe().unwrap();
        let s = ServiceSpec::for_node(
            exe,
            &["--name".to_owned(), "a b %h".to_owned()],
            Some(dir.path().join("state dir")),
            dir.path().join("logs"),
        )
        .unwrap();
        let path = write_definition(Os::Linux, &s, dir.path()).unwrap();
        assert!(path.ends_with("pair-node.service"));
        let out = std::process::Command::new("systemd-analyze")
            .args(["verify", "--man=no"])
            .arg(&path)
            .env("SYSTEMD_LOG_COLOR", "0")
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "systemd-analyze verify: {said}");
        // Warnings about this unit would be lines naming its file.
        assert!(
            !said.lines().any(|l| l.contains("pair-node.service")),
            "{said}"
        );
    }

    #[test]
    fn the_launchd_plist_is_a_property_list_with_the_agents_keys() {
        let mut s = spec(
            "/Applications/pair/pair-node",
            "/Users/a/Library/Application Support/pair",
        );
        s.args.push("<&\"'>".to_owned());
        let text = launchd_plist(&s);
        let v = plist::Value::from_reader_xml(text.as_bytes()).expect("a valid XML plist");
        let d = v.as_dictionary().expect("a dict at the top");
        assert_eq!(
            d.get("Label").and_then(|l| l.as_string()),
            Some("io.pair.node")
        );
        let argv: Vec<&str> = d
            .get("ProgramArguments")
            .and_then(|a| a.as_array())
            .unwrap()
            .iter()
            .map(|a| a.as_string().unwrap())
            .collect();
        let mut want = vec![s.program.to_str().unwrap()];
        want.extend(s.args.iter().map(String::as_str));
        assert_eq!(argv, want);
        assert_eq!(d.get("RunAtLoad").and_then(|b| b.as_boolean()), Some(true));
        let keep = d.get("KeepAlive").and_then(|k| k.as_dictionary()).unwrap();
        assert_eq!(
            keep.get("SuccessfulExit").and_then(|b| b.as_boolean()),
            Some(false)
        );
        let env = d
            .get("EnvironmentVariables")
            .and_then(|e| e.as_dictionary())
            .unwrap();
        assert_eq!(
            env.get("PAIR_STATE_DIR").and_then(|p| p.as_string()),
            Some("/Users/a/Library/Application Support/pair")
        );
        assert_eq!(
            d.get("StandardErrorPath").and_then(|p| p.as_string()),
            Some("/Users/a/Library/Logs/pair/pair-node.log")
        );
    }

    #[test]
    fn the_windows_service_command_line_splits_back_into_its_words() {
        let mut s = spec(
            r"C:\Program Files\pair\pair-node.exe",
            r"C:\Users\Ann\AppData\Local\pair",
        );
        s.args.push(r#"D:\models dir\"#.to_owned());
        s.args.push(r#"say "hi""#.to_owned());
        s.args.push(String::new());
        let bin = windows_bin_path(&s);
        let mut argv = vec![s.program.display().to_string()];
        // The controller starts the node telling it so, then `run`.
        argv.push(WINDOWS_SERVICE_FLAG.to_owned());
        argv.extend(s.args.iter().cloned());
        assert_eq!(argv[2], "run");
        assert_eq!(pair_os::cmdline::split_windows(&bin), argv);
        let sc = windows_sc_create(&s);
        assert_eq!(sc[..2], ["create", "io.pair.node"]);
        // `sc.exe` takes `key= value` pairs, the value its own argument.
        let pairs: Vec<(&str, &str)> = sc[2..]
            .chunks(2)
            .map(|p| (p[0].as_str(), p[1].as_str()))
            .collect();
        assert!(pairs.iter().all(|(k, _)| k.ends_with('=')), "{pairs:?}");
        assert!(pairs.contains(&("type=", "own")));
        assert!(pairs.contains(&("start=", "auto")));
        assert!(pairs.contains(&("binpath=", bin.as_str())));
        let dir = tempfile::tempdir().unwrap();
        let written = write_definition(Os::Windows, &s, dir.path()).unwrap();
        let back: Vec<String> = serde_json::from_slice(&std::fs::read(written).unwrap()).unwrap();
        assert_eq!(back, sc);
    }
}
