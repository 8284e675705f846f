//! The mDNS TXT record of a pair node: a pure, strict codec.
//!
//! Keys (documented in docs/mdns-txt.md): `v` format version, `id` node UUID,
//! `port` cluster port, `addrs` ranked addresses (comma separated, at most
//! [`MAX_ADDRS`]). Unknown keys are ignored so later versions can add ports;
//! models are never in TXT. Everything here parses bytes from the network, so
//! it never panics and rejects anything ambiguous (duplicate keys, bad UTF-8,
//! out-of-range values).

use std::net::IpAddr;

use pair_core::NodeId;

/// The TXT format version this code writes and reads.
pub const TXT_VERSION: u8 = 1;
/// Most addresses a record carries (PAIR's limit too).
pub const MAX_ADDRS: usize = 4;
/// Most entries a record may have before it is rejected outright.
pub const MAX_ENTRIES: usize = 32;

/// A decoded TXT record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxtRecord {
    pub id: NodeId,
    /// TCP port of the node's cluster listener (node info, pairing, mTLS).
    pub cluster_port: u16,
    /// Addresses in the order the node prefers them, best first.
    pub addrs: Vec<IpAddr>,
}

/// Why a TXT record was rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TxtError {
    #[error("TXT key {0:?} is missing")]
    Missing(&'static str),
    #[error("TXT key {0:?} appears more than once")]
    Duplicate(String),
    #[error("TXT key {0:?} has no value")]
    NoValue(&'static str),
    #[error("TXT key is empty, not printable ASCII, or contains '='")]
    BadKey,
    #[error("TXT value of {0:?} is not UTF-8")]
    NotUtf8(&'static str),
    #[error("TXT format version {0:?} is not supported (this node reads {TXT_VERSION})")]
    UnsupportedVersion(String),
    #[error("TXT id {0:?} is not a UUID")]
    BadId(String),
    #[error("TXT port {0:?} is not a port in 1..=65535")]
    BadPort(String),
    #[error("TXT address {0:?} is not a usable unicast IP address")]
    BadAddr(String),
    #[error("TXT addrs lists {0} addresses (at most {MAX_ADDRS})")]
    TooManyAddrs(usize),
    #[error("TXT record has {0} entries (at most {MAX_ENTRIES})")]
    TooManyEntries(usize),
    #[error("TXT wire data is truncated")]
    Truncated,
}

/// Encodes `record` as TXT key/value pairs, in a fixed order.
pub fn encode_txt(record: &TxtRecord) -> Vec<(String, String)> {
    let mut out = vec![
        ("v".to_owned(), TXT_VERSION.to_string()),
        ("id".to_owned(), record.id.to_string()),
        ("port".to_owned(), record.cluster_port.to_string()),
    ];
    if !record.addrs.is_empty() {
        let addrs: Vec<String> = record
            .addrs
            .iter()
            .take(MAX_ADDRS)
            .map(ToString::to_string)
            .collect();
        out.push(("addrs".to_owned(), addrs.join(",")));
    }
    out
}

/// Decodes TXT entries (key, value-or-none-if-no-`=`). Keys compare
/// case-insensitively, as RFC 6763 says.
pub fn decode_txt<'a, I>(entries: I) -> Result<TxtRecord, TxtError>
where
    I: IntoIterator<Item = (&'a str, Option<&'a [u8]>)>,
{
    let mut v = None;
    let mut id = None;
    let mut port = None;
    let mut addrs = None;
    let mut seen: Vec<String> = Vec::new();
    for (key, value) in entries {
        if key.is_empty() || !key.bytes().all(|b| (0x20..=0x7e).contains(&b) && b != b'=') {
            return Err(TxtError::BadKey);
        }
        let lower = key.to_ascii_lowercase();
        if seen.contains(&lower) {
            return Err(TxtError::Duplicate(lower));
        }
        if seen.len() >= MAX_ENTRIES {
            return Err(TxtError::TooManyEntries(seen.len() + 1));
        }
        seen.push(lower.clone());
        let slot = match lower.as_str() {
            "v" => (&mut v, "v"),
            "id" => (&mut id, "id"),
            "port" => (&mut port, "port"),
            "addrs" => (&mut addrs, "addrs"),
            _ => continue,
        };
        let (dst, name) = slot;
        let raw = value.ok_or(TxtError::NoValue(name))?;
        let text = std::str::from_utf8(raw).map_err(|_| TxtError::NotUtf8(name))?;
        *dst = Some(text);
    }

    let v = v.ok_or(TxtError::Missing("v"))?;
    if v != TXT_VERSION.to_string() {
        return Err(TxtError::UnsupportedVersion(v.to_owned()));
    }
    let id_text = id.ok_or(TxtError::Missing("id"))?;
    // Exactly the hyphenated form we write: one spelling per identity.
    let id = uuid::Uuid::try_parse(id_text)
        .ok()
        .filter(|u| {
            id_text.len() == 36 && u.hyphenated().to_string() == id_text.to_ascii_lowercase()
        })
        .map(NodeId::from_uuid)
        .ok_or_else(|| TxtError::BadId(id_text.to_owned()))?;
    let port_text = port.ok_or(TxtError::Missing("port"))?;
    let cluster_port =
        parse_port(port_text).ok_or_else(|| TxtError::BadPort(port_text.to_owned()))?;
    let addrs = match addrs {
        None => Vec::new(),
        Some(list) => parse_addrs(list)?,
    };
    Ok(TxtRecord {
        id,
        cluster_port,
        addrs,
    })
}

/// Decodes the RDATA of a DNS TXT record (length-prefixed strings, RFC 6763
/// section 6): the entry point for fuzzing with raw network bytes.
pub fn decode_txt_wire(rdata: &[u8]) -> Result<TxtRecord, TxtError> {
    let mut entries: Vec<(&str, Option<&[u8]>)> = Vec::new();
    let mut rest = rdata;
    while let Some((&len, tail)) = rest.split_first() {
        let len = usize::from(len);
        if tail.len() < len {
            return Err(TxtError::Truncated);
        }
        let (entry, next) = tail.split_at(len);
        rest = next;
        if entry.is_empty() {
            continue; // an empty string is legal padding
        }
        if entries.len() >= MAX_ENTRIES {
            return Err(TxtError::TooManyEntries(entries.len() + 1));
        }
        let (key, value) = match entry.iter().position(|b| *b == b'=') {
            Some(i) => (&entry[..i], Some(&entry[i + 1..])),
            None => (entry, None),
        };
        let key = std::str::from_utf8(key).map_err(|_| TxtError::BadKey)?;
        entries.push((key, value));
    }
    decode_txt(entries)
}

/// Encodes `record` as TXT RDATA (length-prefixed `key=value` strings).
pub fn encode_txt_wire(record: &TxtRecord) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in encode_txt(record) {
        let entry = format!("{k}={v}");
        // Our own entries are far below 255 bytes (4 IPv6 addresses: 163).
        let len = u8::try_from(entry.len()).unwrap_or(u8::MAX);
        out.push(len);
        out.extend_from_slice(&entry.as_bytes()[..usize::from(len)]);
    }
    out
}

fn parse_port(text: &str) -> Option<u16> {
    if text.is_empty()
        || text.len() > 5
        || !text.bytes().all(|b| b.is_ascii_digit())
        || text.starts_with('0')
    {
        return None;
    }
    text.parse::<u16>().ok().filter(|p| *p != 0)
}

fn parse_addrs(list: &str) -> Result<Vec<IpAddr>, TxtError> {
    if list.is_empty() {
        return Ok(Vec::new());
    }
    let parts: Vec<&str> = list.split(',').collect();
    if parts.len() > MAX_ADDRS {
        return Err(TxtError::TooManyAddrs(parts.len()));
    }
    let mut out: Vec<IpAddr> = Vec::with_capacity(parts.len());
    for part in parts {
        let ip: IpAddr = part
            .parse()
            .map_err(|_| TxtError::BadAddr(part.to_owned()))?;
        // Canonical text only, no duplicates, unicast only.
        if ip.to_string() != part
            || out.contains(&ip)
            || ip.is_unspecified()
            || ip.is_multicast()
            || is_broadcast(ip)
        {
            return Err(TxtError::BadAddr(part.to_owned()));
        }
        out.push(ip);
    }
    Ok(out)
}

fn is_broadcast(ip: IpAddr) -> bool {
    matches!(ip, IpAddr::V4(v4) if v4.is_broadcast())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn rec() -> TxtRecord {
        TxtRecord {
            id: NodeId::from_u128(0xabcdef),
            cluster_port: 14318,
            addrs: vec!["10.0.0.2".parse().unwrap(), "fd00::2".parse().unwrap()],
        }
    }

    fn pairs(p: &[(String, String)]) -> Vec<(&str, Option<&[u8]>)> {
        p.iter()
            .map(|(k, v)| (k.as_str(), Some(v.as_bytes())))
            .collect()
    }

    #[test]
    fn encodes_the_documented_keys() {
        let enc = encode_txt(&rec());
        assert_eq!(
            enc,
            vec![
                ("v".to_owned(), "1".to_owned()),
                (
                    "id".to_owned(),
                    "00000000-0000-0000-0000-000000abcdef".to_owned()
                ),
                ("port".to_owned(), "14318".to_owned()),
                ("addrs".to_owned(), "10.0.0.2,fd00::2".to_owned()),
            ]
        );
        assert_eq!(decode_txt(pairs(&enc)).unwrap(), rec());
    }

    #[test]
    fn unknown_keys_are_ignored_and_keys_are_case_insensitive() {
        let mut enc = encode_txt(&rec());
        enc.push(("pairing".into(), "14319".into()));
        enc[0].0 = "V".into();
        assert_eq!(decode_txt(pairs(&enc)).unwrap(), rec());
    }

    #[test]
    fn rejects_what_is_ambiguous_or_wrong() {
        let ok = encode_txt(&rec());
        let with = |k: &str, v: &str| {
            let mut e = ok.clone();
            for entry in &mut e {
                if entry.0 == k {
                    entry.1 = v.to_owned();
                }
            }
            decode_txt(pairs(&e))
        };
        assert_eq!(
            with("v", "2"),
            Err(TxtError::UnsupportedVersion("2".into()))
        );
        assert!(matches!(with("id", "nope"), Err(TxtError::BadId(_))));
        assert!(matches!(
            with("id", "00000000000000000000000000abcdef"),
            Err(TxtError::BadId(_))
        ));
        assert!(matches!(with("port", "0"), Err(TxtError::BadPort(_))));
        assert!(matches!(with("port", "65536"), Err(TxtError::BadPort(_))));
        assert!(matches!(with("port", "+80"), Err(TxtError::BadPort(_))));
        assert!(matches!(with("port", "080"), Err(TxtError::BadPort(_))));
        assert!(matches!(
            with("addrs", "10.0.0.1,10.0.0.1"),
            Err(TxtError::BadAddr(_))
        ));
        assert!(matches!(
            with("addrs", "224.0.0.251"),
            Err(TxtError::BadAddr(_))
        ));
        assert!(matches!(
            with("addrs", "0.0.0.0"),
            Err(TxtError::BadAddr(_))
        ));
        assert!(matches!(
            with("addrs", "1.1.1.1,2.2.2.2,3.3.3.3,4.4.4.4,5.5.5.5"),
            Err(TxtError::TooManyAddrs(5))
        ));
        assert!(with("addrs", "").unwrap().addrs.is_empty());

        let mut dup = ok.clone();
        dup.push(("ID".into(), "x".into()));
        assert_eq!(
            decode_txt(pairs(&dup)),
            Err(TxtError::Duplicate("id".into()))
        );
        let no_port: Vec<_> = ok.iter().filter(|(k, _)| k != "port").cloned().collect();
        assert_eq!(decode_txt(pairs(&no_port)), Err(TxtError::Missing("port")));
        assert_eq!(decode_txt([("v", None)]), Err(TxtError::NoValue("v")));
        assert_eq!(
            decode_txt([("v", Some(&b"\xff"[..]))]),
            Err(TxtError::NotUtf8("v"))
        );
        assert_eq!(decode_txt([("", Some(&b"1"[..]))]), Err(TxtError::BadKey));
    }

    #[test]
    fn wire_format_round_trips_and_rejects_truncation() {
        let wire = encode_txt_wire(&rec());
        assert_eq!(decode_txt_wire(&wire).unwrap(), rec());
        assert_eq!(
            decode_txt_wire(&wire[..wire.len() - 1]),
            Err(TxtError::Truncated)
        );
        assert_eq!(decode_txt_wire(&[]), Err(TxtError::Missing("v")));
        let mut padded = vec![0u8];
        padded.extend_from_slice(&wire);
        assert_eq!(decode_txt_wire(&padded).unwrap(), rec());
    }

    fn arb_ip() -> impl Strategy<Value = IpAddr> {
        prop_oneof![
            any::<[u8; 4]>().prop_map(|o| IpAddr::V4(Ipv4Addr::from(o))),
            any::<[u16; 8]>().prop_map(|s| IpAddr::V6(Ipv6Addr::from(s))),
        ]
        .prop_filter("unicast", |ip| {
            !ip.is_unspecified() && !ip.is_multicast() && !is_broadcast(*ip)
        })
    }

    proptest! {
        #[test]
        fn round_trips(id in any::<u128>(), port in 1u16.., addrs in proptest::collection::hash_set(arb_ip(), 0..=MAX_ADDRS)) {
            let r = TxtRecord { id: NodeId::from_u128(id), cluster_port: port, addrs: addrs.into_iter().collect() };
            prop_assert_eq!(decode_txt(pairs(&encode_txt(&r))).unwrap(), r.clone());
            prop_assert_eq!(decode_txt_wire(&encode_txt_wire(&r)).unwrap(), r);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = decode_txt_wire(&bytes);
        }

        #[test]
        fn a_decoded_record_reencodes_to_itself(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Ok(r) = decode_txt_wire(&bytes) {
                prop_assert_eq!(decode_txt_wire(&encode_txt_wire(&r)).unwrap(), r);
            }
        }
    }
}
