//! The machine's name, as the node names itself and as other machines
//! reach it over mDNS (`<name>.local`): from the OS (`gethostname`), never
//! from `/etc/hostname`, which only some Linux distributions have.

use crate::Os;

/// The host's name as `os` reports it, made into the node's name: trimmed;
/// macOS reports `Ann-MacBook.local` where Bonjour is on, and the `.local`
/// is mDNS's suffix, not part of the name; Windows reports its NetBIOS-style
/// upper-case name (`DESKTOP-4F2K`), which DNS and mDNS treat without case,
/// so it is kept as it is. `None` for an empty name.
pub fn node_name(os: Os, raw: &str) -> Option<String> {
    let name = raw.trim().trim_end_matches('.');
    let name = match os {
        Os::MacOs => strip_suffix_ignore_case(name, ".local").unwrap_or(name),
        Os::Linux | Os::Windows => name,
    };
    (!name.is_empty() && !name.contains(char::is_whitespace)).then(|| name.to_owned())
}

fn strip_suffix_ignore_case<'a>(s: &'a str, suffix: &str) -> Option<&'a str> {
    let cut = s.len().checked_sub(suffix.len())?;
    (s.is_char_boundary(cut) && s[cut..].eq_ignore_ascii_case(suffix)).then(|| &s[..cut])
}

/// The names other machines use for this one: the name and its `.local`.
pub fn lan_names(name: &str) -> [String; 2] {
    [name.to_owned(), format!("{name}.local")]
}

/// This host's name ([`node_name`] of what the OS reports).
pub fn hostname() -> Option<String> {
    let raw = gethostname::gethostname();
    node_name(Os::current(), &raw.to_string_lossy())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_os_names_itself() {
        assert_eq!(
            node_name(Os::Linux, "gpu-box\n").as_deref(),
            Some("gpu-box")
        );
        assert_eq!(
            node_name(Os::MacOs, "Anns-MacBook-Pro.local").as_deref(),
            Some("Anns-MacBook-Pro")
        );
        assert_eq!(
            node_name(Os::MacOs, "Anns-MacBook-Pro.LOCAL.").as_deref(),
            Some("Anns-MacBook-Pro")
        );
        assert_eq!(node_name(Os::MacOs, "studio").as_deref(), Some("studio"));
        assert_eq!(
            node_name(Os::Windows, "DESKTOP-4F2K").as_deref(),
            Some("DESKTOP-4F2K")
        );
        // Only macOS's reply carries the mDNS suffix.
        assert_eq!(
            node_name(Os::Linux, "box.local").as_deref(),
            Some("box.local")
        );
        for os in Os::ALL {
            assert_eq!(node_name(os, "  "), None);
            assert_eq!(node_name(os, ""), None);
        }
        assert_eq!(node_name(Os::MacOs, ".local"), None);
        assert_eq!(lan_names("a"), ["a".to_owned(), "a.local".to_owned()]);
    }

    #[test]
    fn this_host_has_a_name() {
        let name = hostname().expect("the OS names this host");
        assert!(!name.is_empty());
        assert_eq!(
            node_name(Os::current(), &name).as_deref(),
            Some(name.as_str())
        );
    }
}
