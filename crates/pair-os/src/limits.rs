//! The open-file cap the connection cap is derived from: the soft
//! `RLIMIT_NOFILE` (raised to the hard limit at start) on Unix, a fixed cap
//! where there is no rlimit (Windows counts sockets as handles with no
//! per-process limit pair needs to respect).

use crate::Os;

/// The cap where the OS has no open-file rlimit.
pub const FIXED_CAP: u64 = 8_192;
/// What Unix is assumed to allow when the limit cannot be read.
pub const UNREADABLE_UNIX: u64 = 1_024;

/// The open-file cap on `os`, given the soft rlimit if one could be read.
pub fn cap(os: Os, soft_rlimit: Option<u64>) -> u64 {
    match os {
        Os::Linux | Os::MacOs => soft_rlimit.unwrap_or(UNREADABLE_UNIX),
        Os::Windows => FIXED_CAP,
    }
}

/// This process's open-file cap ([`cap`] on the host).
pub fn open_file_cap() -> u64 {
    #[cfg(all(unix, not(pair_portable)))]
    {
        let soft = rlimit::getrlimit(rlimit::Resource::NOFILE)
            .ok()
            .map(|(soft, _)| soft);
        cap(Os::current(), soft)
    }
    #[cfg(any(not(unix), pair_portable))]
    {
        FIXED_CAP
    }
}

/// Raises the soft open-file limit to the hard one where there is one;
/// returns the limit now in force.
pub fn raise_open_file_limit() -> std::io::Result<u64> {
    #[cfg(all(unix, not(pair_portable)))]
    {
        rlimit::increase_nofile_limit(u64::MAX)
    }
    #[cfg(any(not(unix), pair_portable))]
    {
        Ok(FIXED_CAP)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_reads_its_rlimit_and_windows_has_a_fixed_cap() {
        assert_eq!(cap(Os::Linux, Some(65_536)), 65_536);
        assert_eq!(cap(Os::MacOs, Some(256)), 256);
        assert_eq!(cap(Os::Linux, None), UNREADABLE_UNIX);
        assert_eq!(cap(Os::Windows, None), FIXED_CAP);
        assert_eq!(cap(Os::Windows, Some(3)), FIXED_CAP);
    }

    #[test]
    fn the_host_cap_is_the_rlimit_or_the_fallback() {
        let raised = raise_open_file_limit().unwrap();
        let now = open_file_cap();
        if Os::host_is_unix() {
            // The soft limit now stands at what raising it reported.
            assert_eq!(now, raised);
        } else {
            // The fallback, as Windows (or --cfg pair_portable) takes it.
            assert_eq!(now, FIXED_CAP);
            assert_eq!(raised, FIXED_CAP);
        }
    }
}
