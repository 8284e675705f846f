//! API keys for the node's LAN face: records and secrets, the persisted
//! cluster-wide store, and the pure per-key rate limiter and per-address
//! failure gate.
//!
//! A key is a random secret (`pair-sk-` + 43 base64url characters) shown
//! once when it is made; the node keeps only its SHA-256. Records are
//! cluster-wide: nodes exchange them over mutual TLS the way they exchange
//! vouched clients (a report carries [`KeyStore::digest`]; a peer whose
//! digest differs fetches [`KeyStore::records`] and calls
//! [`KeyStore::merge`]). Merging is a set union by key id in which a
//! revocation always wins, so it is commutative, idempotent and a
//! revocation made anywhere reaches every node. Revoked records stay as
//! tombstones for that reason: dropping one would let a peer that still
//! holds the live record bring the key back.
//!
//! [`RateLimiter`] and [`FailureGate`] are pure state machines: the shell
//! passes `now` in and turns their `Err(retry_after)` into a 429.

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::hash::Hash;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use pair_core::NodeId;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

use crate::error::{Error, Result};
use crate::store_file;

/// The key file's name in the state directory.
pub const KEYS_FILE: &str = "keys.json";

const SECRET_PREFIX: &str = "pair-sk-";
/// 32 bytes in base64url without padding.
const SECRET_BODY_LEN: usize = 43;
const MAX_NAME_LEN: usize = 64;
const MAX_PATTERN_LEN: usize = 256;

/// A key's identity: 16 random bytes, hex on disk and on the wire. Names
/// are for people and may collide across nodes; the id never does.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KeyId([u8; 16]);

impl KeyId {
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }
    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyId({self})")
    }
}

impl Serialize for KeyId {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        hex_array::serialize(&self.0, s)
    }
}

impl<'de> Deserialize<'de> for KeyId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        hex_array::deserialize(d).map(Self)
    }
}

/// One API key as every node stores it: never the secret, only its hash.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyRecord {
    pub id: KeyId,
    /// For people (`keys list`, `keys revoke NAME`, logs); see [`KeyStore`]
    /// for what happens when two nodes pick the same name.
    pub name: String,
    /// SHA-256 of the secret's text. A fast hash is right here: the secret
    /// is 256 bits from a cryptographic RNG, so there is no dictionary for
    /// a slow password hash to defend, and a slow one would cost every
    /// request (and hand an attacker a CPU lever) for nothing.
    #[serde(with = "hex_array")]
    pub hash: [u8; 32],
    /// Model patterns this key may use: exact names or `*` globs, ASCII
    /// case ignored. Empty: every model.
    #[serde(default)]
    pub models: Vec<String>,
    /// Requests per minute (burst: the same number); `None`: unlimited.
    #[serde(default)]
    pub rate_per_min: Option<NonZeroU32>,
    /// The class of its requests that name none (`x-pair-priority`);
    /// `None`: interactive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<pair_core::Priority>,
    /// Wall-clock milliseconds since the Unix epoch.
    pub created_at_ms: u64,
    /// Set once, never cleared: a revoked key stays revoked everywhere.
    #[serde(default)]
    pub revoked_at_ms: Option<u64>,
    /// The node that made the key.
    pub origin: NodeId,
}

/// What a new key may do and how its requests are treated.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyTerms {
    /// Model patterns it may use (exact names or `*` globs); empty: every
    /// model.
    pub models: Vec<String>,
    /// Requests per minute; `None`: unlimited.
    pub rate_per_min: Option<NonZeroU32>,
    /// The class of its requests that name none; `None`: interactive.
    pub priority: Option<pair_core::Priority>,
}

impl KeyRecord {
    pub fn is_live(&self) -> bool {
        self.revoked_at_ms.is_none()
    }

    /// Whether this key may ask for `model`.
    pub fn allows_model(&self, model: &str) -> bool {
        self.models.is_empty()
            || self
                .models
                .iter()
                .any(|p| pair_core::alias::matches(p, model))
    }

    fn check(&self) -> std::result::Result<(), String> {
        check_name(&self.name).map_err(|reason| format!("key {}: name {reason}", self.id))?;
        for p in &self.models {
            check_pattern(p)
                .map_err(|reason| format!("key {}: model pattern {reason}", self.id))?;
        }
        Ok(())
    }

    /// Of two records with the same id, the one a merge keeps: a revoked
    /// one over a live one, the earliest revocation over a later one, and
    /// otherwise (records that should not differ, but a buggy or hostile
    /// peer may send) a fixed order on the other fields, so the outcome
    /// never depends on which side merged first.
    fn preferred_over(&self, other: &KeyRecord) -> bool {
        let by_revocation = match (self.revoked_at_ms, other.revoked_at_ms) {
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (Some(a), Some(b)) => a.cmp(&b),
            (None, None) => Ordering::Equal,
        };
        let rest = |r: &KeyRecord| {
            (
                r.hash,
                r.name.clone(),
                r.models.clone(),
                r.rate_per_min,
                r.priority,
                r.created_at_ms,
                r.origin,
            )
        };
        by_revocation.then_with(|| rest(self).cmp(&rest(other))) == Ordering::Less
    }
}

/// A freshly made secret. Its text is wiped on drop and its `Debug` shows
/// only the prefix; [`Secret::expose`] is the one way to read it (to print
/// it once for the user).
pub struct Secret(Zeroizing<String>);

impl Secret {
    fn generate<R: rand::CryptoRng + ?Sized>(rng: &mut R) -> Self {
        let mut bytes = Zeroizing::new([0u8; 32]);
        rng.fill_bytes(&mut bytes[..]);
        let mut body = Zeroizing::new([0u8; SECRET_BODY_LEN]);
        let mut text = Zeroizing::new(String::with_capacity(SECRET_PREFIX.len() + SECRET_BODY_LEN));
        text.push_str(SECRET_PREFIX);
        // 32 bytes always encode to exactly 43 characters; were it ever
        // not so, the bare prefix left here could never verify.
        if let Ok(n) = URL_SAFE_NO_PAD.encode_slice(&bytes[..], &mut body[..]) {
            text.push_str(std::str::from_utf8(&body[..n]).unwrap_or_default());
        }
        Self(text)
    }

    /// The secret's text (`pair-sk-…`), to show the user once.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({SECRET_PREFIX}…)")
    }
}

/// The secret in an `Authorization: Bearer …` or `x-api-key` header value,
/// when it has the shape of one; `None` otherwise. Cheap and hash-free, so
/// garbage costs the node nothing. Only the canonical base64 form passes,
/// so each secret has exactly one text and one hash.
pub fn parse_presented(value: &str) -> Option<&str> {
    let v = value.trim();
    let v = match v.get(..7) {
        // The auth scheme is case-insensitive (RFC 9110).
        Some(scheme) if scheme.eq_ignore_ascii_case("bearer ") => v.get(7..)?.trim(),
        _ => v,
    };
    let body = v.strip_prefix(SECRET_PREFIX)?;
    if body.len() != SECRET_BODY_LEN {
        return None;
    }
    let mut out = Zeroizing::new([0u8; 33]);
    match URL_SAFE_NO_PAD.decode_slice(body, &mut out[..]) {
        Ok(32) => Some(v),
        _ => None,
    }
}

fn hash_secret(text: &str) -> [u8; 32] {
    Sha256::digest(text.as_bytes()).into()
}

/// Key names: 1 to 64 characters of `[A-Za-z0-9._-]`, so they are safe in
/// a terminal, a log line and a command line.
fn check_name(name: &str) -> std::result::Result<(), &'static str> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err("must be 1 to 64 characters");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err("may hold only letters, digits, '.', '_' and '-'");
    }
    Ok(())
}

fn check_pattern(pattern: &str) -> std::result::Result<(), &'static str> {
    if pattern.is_empty() || pattern.len() > MAX_PATTERN_LEN {
        return Err("must be 1 to 256 characters");
    }
    if pattern.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err("has spaces or control characters");
    }
    Ok(())
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoreFile {
    v: u32,
    keys: Vec<KeyRecord>,
}

impl store_file::Versioned for StoreFile {
    fn version(&self) -> u32 {
        self.v
    }
}

/// Everything a reader needs, rebuilt whole on every change.
#[derive(Debug, Default)]
struct State {
    /// Every record, revoked ones included.
    records: BTreeMap<KeyId, KeyRecord>,
    /// Live keys by secret hash: a lookup is one hash and one probe.
    by_hash: HashMap<[u8; 32], KeyId>,
    digest: u64,
}

impl State {
    fn new(records: BTreeMap<KeyId, KeyRecord>) -> Self {
        let mut by_hash = HashMap::new();
        for r in records.values().filter(|r| r.is_live()) {
            // Two live ids with one hash means one secret twice (only a
            // hostile peer can do that); the smaller id wins on every node.
            by_hash.entry(r.hash).or_insert(r.id);
        }
        let digest = digest(&records);
        Self {
            records,
            by_hash,
            digest,
        }
    }
}

/// Order-independent because the map is ordered by id; every field counts,
/// so an add, a revocation or any other difference changes it.
fn digest(records: &BTreeMap<KeyId, KeyRecord>) -> u64 {
    if records.is_empty() {
        return 0;
    }
    let mut h = Sha256::new();
    let bytes = |h: &mut Sha256, b: &[u8]| {
        h.update((b.len() as u64).to_le_bytes());
        h.update(b);
    };
    for r in records.values() {
        h.update(r.id.0);
        h.update(r.hash);
        bytes(&mut h, r.name.as_bytes());
        h.update((r.models.len() as u64).to_le_bytes());
        for m in &r.models {
            bytes(&mut h, m.as_bytes());
        }
        h.update(r.rate_per_min.map_or(0, NonZeroU32::get).to_le_bytes());
        h.update([r.priority.map_or(0, |p| 1 + p as u8)]);
        h.update(r.created_at_ms.to_le_bytes());
        match r.revoked_at_ms {
            Some(at) => {
                h.update([1]);
                h.update(at.to_le_bytes());
            }
            None => h.update([0]),
        }
        h.update(r.origin.as_uuid().as_bytes());
    }
    let d = h.finalize();
    // `| 1`: a non-empty store never reads as the empty one.
    u64::from_le_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]]) | 1
}

#[derive(Debug)]
struct Inner {
    /// `None` for an in-memory store (tests, emulated clusters).
    path: Option<PathBuf>,
    state: RwLock<Arc<State>>,
    /// Serialises writers so file order equals memory order. Kept apart
    /// from `state` so `verify` on the request path never waits for an
    /// fsync.
    write: Mutex<()>,
}

/// The API keys of the cluster, as this node knows them: a live handle,
/// cheap to clone, every clone seeing every change.
///
/// Names are display, the id is identity. Two nodes can each make a key
/// named `ci` before they exchange records; after the merge both records
/// are kept and each secret verifies as its own key. [`KeyStore::list`]
/// then shows the name twice (with different ids), [`KeyStore::revoke`]
/// revokes every live key of that name, and [`KeyStore::add`] refuses the
/// name until none is live.
#[derive(Clone, Debug)]
pub struct KeyStore {
    inner: Arc<Inner>,
}

impl KeyStore {
    /// Where the key file lives under `state_dir`.
    pub fn default_path(state_dir: &Path) -> PathBuf {
        state_dir.join(KEYS_FILE)
    }

    /// Opens (or starts empty) the store in `state_dir`. Temp files left by
    /// a crashed write are removed; a damaged file is an error naming it,
    /// never an empty store (that would silently forget revocations).
    pub fn open(state_dir: &Path) -> Result<Self> {
        let path = Self::default_path(state_dir);
        let records = match store_file::load::<StoreFile>(&path)? {
            None => BTreeMap::new(),
            Some(file) => records_of(&path, file)?,
        };
        Ok(Self::with(Some(path), records))
    }

    /// A store that lives only in memory.
    pub fn in_memory() -> Self {
        Self::with(None, BTreeMap::new())
    }

    fn with(path: Option<PathBuf>, records: BTreeMap<KeyId, KeyRecord>) -> Self {
        Self {
            inner: Arc::new(Inner {
                path,
                state: RwLock::new(Arc::new(State::new(records))),
                write: Mutex::new(()),
            }),
        }
    }

    pub fn path(&self) -> Option<&Path> {
        self.inner.path.as_deref()
    }

    fn snapshot(&self) -> Arc<State> {
        match self.inner.state.read() {
            Ok(g) => Arc::clone(&g),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    /// Makes a key named `name` and returns its record and its secret, the
    /// only time the secret exists outside the caller's hands. A name that
    /// a live key already holds is refused.
    pub fn add<R: rand::CryptoRng + ?Sized>(
        &self,
        name: &str,
        terms: KeyTerms,
        now_ms: u64,
        origin: NodeId,
        rng: &mut R,
    ) -> Result<(KeyRecord, Secret)> {
        let KeyTerms {
            models,
            rate_per_min,
            priority,
        } = terms;
        check_name(name).map_err(|reason| Error::BadKeyName {
            name: name.to_owned(),
            reason,
        })?;
        for p in &models {
            check_pattern(p).map_err(|reason| Error::BadModelPattern {
                pattern: p.clone(),
                reason,
            })?;
        }
        let secret = Secret::generate(rng);
        let mut id = [0u8; 16];
        rng.fill_bytes(&mut id);
        let record = KeyRecord {
            id: KeyId(id),
            name: name.to_owned(),
            hash: hash_secret(secret.expose()),
            models,
            rate_per_min,
            priority,
            created_at_ms: now_ms,
            revoked_at_ms: None,
            origin,
        };
        self.update(|records| {
            if records.values().any(|r| r.is_live() && r.name == name) {
                return Err(Error::KeyNameTaken {
                    name: name.to_owned(),
                });
            }
            if records.contains_key(&record.id) {
                // Overwriting could resurrect a revoked id.
                return Err(Error::RepeatedKeyId);
            }
            records.insert(record.id, record.clone());
            Ok(true)
        })?;
        Ok((record, secret))
    }

    /// Live keys, by name then id.
    pub fn list(&self) -> Vec<KeyRecord> {
        self.sorted(KeyRecord::is_live)
    }

    /// Revoked keys (tombstones), by name then id.
    pub fn revoked(&self) -> Vec<KeyRecord> {
        self.sorted(|r| !r.is_live())
    }

    fn sorted(&self, keep: impl Fn(&KeyRecord) -> bool) -> Vec<KeyRecord> {
        let mut out: Vec<KeyRecord> = self
            .snapshot()
            .records
            .values()
            .filter(|r| keep(r))
            .cloned()
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name).then(a.id.cmp(&b.id)));
        out
    }

    /// Revokes every live key named `name` (usually one; more only after a
    /// merge brought in the same name from another node) and returns them
    /// as revoked. No live key of that name is an error.
    pub fn revoke(&self, name: &str, now_ms: u64) -> Result<Vec<KeyRecord>> {
        let mut revoked = Vec::new();
        self.update(|records| {
            for r in records.values_mut() {
                if r.is_live() && r.name == name {
                    r.revoked_at_ms = Some(now_ms);
                    revoked.push(r.clone());
                }
            }
            if revoked.is_empty() {
                return Err(Error::NoSuchKey {
                    name: name.to_owned(),
                });
            }
            Ok(true)
        })?;
        Ok(revoked)
    }

    /// The live key whose secret is in `presented` (a header value, with or
    /// without `Bearer `). Malformed values are refused before hashing.
    pub fn verify(&self, presented: &str) -> Option<KeyRecord> {
        let hash = hash_secret(parse_presented(presented)?);
        let state = self.snapshot();
        // The map probe compares hashes of the caller's own guess, which
        // tells nothing about any secret; the constant-time check on the
        // record is the comparison that decides.
        let record = state.records.get(state.by_hash.get(&hash)?)?;
        (bool::from(record.hash.ct_eq(&hash)) && record.is_live()).then(|| record.clone())
    }

    /// A digest of every record, revoked ones included, that peers compare
    /// to tell whether they need to fetch [`KeyStore::records`]; 0 when
    /// there are none.
    pub fn digest(&self) -> u64 {
        self.snapshot().digest
    }

    /// Every record, revoked ones included, by id: what a peer fetches.
    pub fn records(&self) -> Vec<KeyRecord> {
        self.snapshot().records.values().cloned().collect()
    }

    /// Merges a peer's records: a union by id in which, for one id, a
    /// revoked record beats a live one and the earliest revocation is kept.
    /// Records with invalid names or patterns are skipped. Returns whether
    /// anything changed (and was written to disk).
    pub fn merge(&self, remote: Vec<KeyRecord>) -> Result<bool> {
        self.update(|records| {
            let mut changed = false;
            for r in remote {
                if let Err(reason) = r.check() {
                    tracing::warn!(key = %r.id, %reason, "ignoring a malformed key record from a peer");
                    continue;
                }
                match records.get(&r.id) {
                    Some(local) if !r.preferred_over(local) => {}
                    _ => {
                        records.insert(r.id, r);
                        changed = true;
                    }
                }
            }
            Ok(changed)
        })
    }

    /// Applies `change` to a copy of the records; when it reports a change,
    /// writes the file, then publishes the copy.
    fn update(
        &self,
        change: impl FnOnce(&mut BTreeMap<KeyId, KeyRecord>) -> Result<bool>,
    ) -> Result<bool> {
        let _writer = self
            .inner
            .write
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut next = self.snapshot().records.clone();
        if !change(&mut next)? {
            return Ok(false);
        }
        if let Some(path) = &self.inner.path {
            // Disk first: memory never holds a key (or lacks a revocation)
            // that a restart would forget.
            let file = StoreFile {
                v: store_file::FORMAT_VERSION,
                keys: next.values().cloned().collect(),
            };
            store_file::save(path, &file)?;
        }
        let state = Arc::new(State::new(next));
        let mut guard = self
            .inner
            .state
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *guard = state;
        Ok(true)
    }
}

/// The records of a store's file, checked.
fn records_of(path: &Path, file: StoreFile) -> Result<BTreeMap<KeyId, KeyRecord>> {
    let damaged = |reason: String| store_file::damaged(path, reason);
    let mut records = BTreeMap::new();
    for record in file.keys {
        record.check().map_err(damaged)?;
        let id = record.id;
        if records.insert(id, record).is_some() {
            return Err(damaged(format!("duplicate key id {id}")));
        }
    }
    Ok(records)
}

/// Fixed-size byte arrays as lowercase hex strings.
mod hex_array {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer, const N: usize>(
        bytes: &[u8; N],
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(bytes))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>, const N: usize>(
        d: D,
    ) -> Result<[u8; N], D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        let mut out = [0u8; N];
        hex::decode_to_slice(s.as_bytes(), &mut out).map_err(serde::de::Error::custom)?;
        Ok(out)
    }
}

/// Drops the oldest eighth (at least one) of `map` by `age`, so a full map
/// pays one O(n) pass per n/8 insertions rather than one per insertion.
fn evict_oldest<K: Copy + Eq + Hash, V>(map: &mut HashMap<K, V>, age: impl Fn(&V) -> Instant) {
    let mut ages: Vec<(Instant, K)> = map.iter().map(|(k, v)| (age(v), *k)).collect();
    let n = (ages.len() / 8).max(1).min(ages.len());
    if n == 0 {
        return;
    }
    ages.select_nth_unstable_by_key(n - 1, |(at, _)| *at);
    for (_, k) in ages.iter().take(n) {
        map.remove(k);
    }
}

/// Per-key request rate: a token bucket of `rate` tokens refilled
/// continuously over a minute, with a burst of the full `rate`.
///
/// Kept as one time per key (the generic cell rate algorithm): the
/// moment the bucket will be full again. A key whose bucket is full needs
/// no entry, so idle keys are dropped without changing any answer; only
/// past `max_keys` busy keys does the one closest to full lose its
/// history.
#[derive(Debug)]
pub struct RateLimiter {
    /// When each key's bucket is full again.
    full_at: HashMap<KeyId, Instant>,
    max_keys: usize,
}

impl Default for RateLimiter {
    fn default() -> Self {
        Self::new(4096)
    }
}

impl RateLimiter {
    pub fn new(max_keys: usize) -> Self {
        Self {
            full_at: HashMap::new(),
            max_keys: max_keys.max(1),
        }
    }

    /// Takes one token from `key`'s bucket, or says how long until one is
    /// there.
    pub fn check(
        &mut self,
        key: KeyId,
        rate_per_min: NonZeroU32,
        now: Instant,
    ) -> Result<(), Duration> {
        let minute = Duration::from_secs(60);
        let interval = minute / rate_per_min.get();
        // How far ahead of `now` the bucket may be drained: all but one token.
        let slack = minute.saturating_sub(interval);
        let full_at = self
            .full_at
            .get(&key)
            .copied()
            .filter(|t| *t > now)
            .unwrap_or(now);
        let ahead = full_at.saturating_duration_since(now);
        if ahead > slack {
            return Err(ahead - slack);
        }
        if !self.full_at.contains_key(&key) && self.full_at.len() >= self.max_keys {
            self.prune(now);
            if self.full_at.len() >= self.max_keys {
                // Closest to full first: they lose the least.
                evict_oldest(&mut self.full_at, |t| *t);
            }
        }
        self.full_at.insert(key, full_at + interval);
        Ok(())
    }

    /// Drops the keys whose buckets are full again (they behave as new).
    pub fn prune(&mut self, now: Instant) {
        self.full_at.retain(|_, t| *t > now);
    }

    pub fn len(&self) -> usize {
        self.full_at.len()
    }

    pub fn is_empty(&self) -> bool {
        self.full_at.is_empty()
    }
}

/// The limits of a [`FailureGate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailureLimits {
    /// Failures within `window` before the first back-off.
    pub failures: u32,
    pub window: Duration,
    /// The first back-off; each later one doubles it.
    pub first_backoff: Duration,
    pub max_backoff: Duration,
    /// No failure for this long after the last back-off ends: the address
    /// starts over.
    pub quiet: Duration,
    /// Addresses tracked at most; the least recently failing go first.
    pub max_entries: usize,
}

impl Default for FailureLimits {
    fn default() -> Self {
        Self {
            failures: 5,
            window: Duration::from_secs(60),
            first_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(5 * 60),
            quiet: Duration::from_secs(10 * 60),
            max_entries: 16_384,
        }
    }
}

/// The unit an attacker controls: one IPv4 address, or one IPv6 /64
/// (a single host is routinely handed a whole /64). IPv4-mapped IPv6
/// addresses count as their IPv4 address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AddrGroup {
    V4([u8; 4]),
    V6([u8; 8]),
}

impl From<IpAddr> for AddrGroup {
    fn from(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(a) => AddrGroup::V4(a.octets()),
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(v4) => AddrGroup::V4(v4.octets()),
                None => {
                    let o = a.octets();
                    AddrGroup::V6([o[0], o[1], o[2], o[3], o[4], o[5], o[6], o[7]])
                }
            },
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Strikes {
    window_start: Instant,
    failures: u32,
    /// Back-offs so far; from the first one on, every failure brings the
    /// next (doubled) one until the address has been quiet.
    backoffs: u32,
    blocked_until: Option<Instant>,
    last_failure: Instant,
}

impl Strikes {
    fn new(now: Instant) -> Self {
        Self {
            window_start: now,
            failures: 0,
            backoffs: 0,
            blocked_until: None,
            last_failure: now,
        }
    }

    fn last_activity(&self) -> Instant {
        self.blocked_until
            .map_or(self.last_failure, |b| b.max(self.last_failure))
    }
}

/// Slows down clients that present wrong or missing keys. Secrets are 256
/// bits, so this is not what stops guessing; it keeps a misbehaving client
/// from costing hashes and log lines at line rate.
///
/// The shell calls [`FailureGate::check`] before verifying a key, then
/// [`FailureGate::failed`] or [`FailureGate::succeeded`].
#[derive(Debug)]
pub struct FailureGate {
    limits: FailureLimits,
    entries: HashMap<AddrGroup, Strikes>,
}

impl Default for FailureGate {
    fn default() -> Self {
        Self::new(FailureLimits::default())
    }
}

impl FailureGate {
    pub fn new(limits: FailureLimits) -> Self {
        Self {
            limits,
            entries: HashMap::new(),
        }
    }

    /// `Err(retry_after)` while `ip`'s group is backing off.
    pub fn check(&self, ip: IpAddr, now: Instant) -> Result<(), Duration> {
        match self
            .entries
            .get(&AddrGroup::from(ip))
            .and_then(|s| s.blocked_until)
        {
            Some(until) if until > now => Err(until - now),
            _ => Ok(()),
        }
    }

    /// Counts a wrong or missing key from `ip`.
    pub fn failed(&mut self, ip: IpAddr, now: Instant) {
        let group = AddrGroup::from(ip);
        let limits = self.limits;
        if !self.entries.contains_key(&group) && self.entries.len() >= limits.max_entries.max(1) {
            let quiet = limits.quiet;
            self.entries
                .retain(|_, s| now.saturating_duration_since(s.last_activity()) < quiet);
            if self.entries.len() >= limits.max_entries.max(1) {
                evict_oldest(&mut self.entries, Strikes::last_activity);
            }
        }
        let s = self
            .entries
            .entry(group)
            .or_insert_with(|| Strikes::new(now));
        if now.saturating_duration_since(s.last_activity()) >= limits.quiet {
            *s = Strikes::new(now);
        }
        if s.backoffs == 0 && now.saturating_duration_since(s.window_start) >= limits.window {
            s.window_start = now;
            s.failures = 0;
        }
        s.failures = s.failures.saturating_add(1);
        s.last_failure = now;
        if s.failures >= limits.failures {
            let factor = 1u32.checked_shl(s.backoffs).unwrap_or(u32::MAX);
            let backoff = limits
                .first_backoff
                .saturating_mul(factor)
                .min(limits.max_backoff);
            s.blocked_until = Some(now + backoff);
            s.backoffs = s.backoffs.saturating_add(1);
        }
    }

    /// A good key from `ip`: its group starts over.
    pub fn succeeded(&mut self, ip: IpAddr) {
        self.entries.remove(&AddrGroup::from(ip));
    }

    /// Addresses (groups) tracked now.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    const ORIGIN: NodeId = NodeId::from_u128(7);

    fn rng() -> StdRng {
        StdRng::seed_from_u64(42)
    }

    fn add(store: &KeyStore, name: &str, rng: &mut StdRng) -> (KeyRecord, Secret) {
        store
            .add(
                name,
                KeyTerms {
                    models: vec![],
                    rate_per_min: None,
                    ..KeyTerms::default()
                },
                1_000,
                ORIGIN,
                rng,
            )
            .unwrap()
    }

    #[test]
    fn a_secret_verifies_until_revoked_and_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let store = KeyStore::open(dir.path()).unwrap();
        let mut rng = rng();
        let (ci, ci_secret) = store
            .add(
                "ci",
                KeyTerms {
                    models: vec!["qwen*".into()],
                    rate_per_min: NonZeroU32::new(30),
                    ..KeyTerms::default()
                },
                1_000,
                ORIGIN,
                &mut rng,
            )
            .unwrap();
        let (_, laptop_secret) = add(&store, "laptop", &mut rng);
        assert!(ci_secret.expose().starts_with("pair-sk-"));
        assert_eq!(ci_secret.expose().len(), 51);
        assert_eq!(format!("{ci_secret:?}"), "Secret(pair-sk-…)");
        assert_eq!(ci.hash, hash_secret(ci_secret.expose()));
        assert_eq!(ci.id.to_string().len(), 32);

        assert_eq!(store.verify(ci_secret.expose()), Some(ci.clone()));
        let bearer = format!("Bearer {}", ci_secret.expose());
        assert_eq!(store.verify(&bearer).unwrap().id, ci.id);
        assert_eq!(
            store
                .verify(&format!("  bearer  {}  ", ci_secret.expose()))
                .unwrap()
                .id,
            ci.id
        );
        assert_eq!(store.verify(laptop_secret.expose()).unwrap().name, "laptop");

        let revoked = store.revoke("ci", 2_000).unwrap();
        assert_eq!(revoked.len(), 1);
        assert_eq!(revoked[0].revoked_at_ms, Some(2_000));
        assert_eq!(store.verify(ci_secret.expose()), None, "revoked is refused");
        assert_eq!(store.list().len(), 1);
        assert_eq!(store.revoked().len(), 1);

        let again = KeyStore::open(dir.path()).unwrap();
        assert_eq!(again.records(), store.records());
        assert_eq!(again.digest(), store.digest());
        assert_eq!(again.verify(ci_secret.expose()), None);
        assert_eq!(again.verify(laptop_secret.expose()).unwrap().name, "laptop");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(KeyStore::default_path(dir.path()))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn wrong_and_malformed_secrets_are_refused() {
        let store = KeyStore::in_memory();
        let mut rng = rng();
        let (_, secret) = add(&store, "a", &mut rng);
        let other = Secret::generate(&mut rng);
        assert_eq!(store.verify(other.expose()), None);
        let s = secret.expose();
        let mut flipped = s.to_owned();
        flipped.pop();
        flipped.push(if s.ends_with('A') { 'E' } else { 'A' });
        for bad in [
            "",
            "Bearer ",
            "pair-sk-",
            &s[..s.len() - 1],
            &format!("{s}A"),
            &format!("{s}="),
            &s.replacen("pair-sk-", "pair-pk-", 1),
            &s.to_uppercase(),
            &flipped,
            "Basic cGFpcjpzZWNyZXQ=",
        ] {
            assert_eq!(store.verify(bad), None, "{bad:?}");
        }
        // The last character carries two unused bits: only the canonical one passes.
        let body = &s[SECRET_PREFIX.len()..];
        let last = body.as_bytes()[42];
        let idx = URL_SAFE_ALPHABET.find(last as char).unwrap();
        let noncanonical = format!(
            "{}{}",
            &s[..s.len() - 1],
            URL_SAFE_ALPHABET.as_bytes()[idx | 1] as char
        );
        assert_eq!(parse_presented(&noncanonical), None);
        assert_eq!(parse_presented(s), Some(s));
    }

    const URL_SAFE_ALPHABET: &str =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

    #[test]
    fn names_are_checked_and_a_live_name_is_taken() {
        let store = KeyStore::in_memory();
        let mut rng = rng();
        for bad in ["", "has space", "ü", "a/b", &"x".repeat(65)] {
            assert!(
                matches!(
                    store.add(
                        bad,
                        KeyTerms {
                            models: vec![],
                            rate_per_min: None,
                            ..KeyTerms::default()
                        },
                        0,
                        ORIGIN,
                        &mut rng
                    ),
                    Err(Error::BadKeyName { .. })
                ),
                "{bad:?}"
            );
        }
        assert!(matches!(
            store.add(
                "ok",
                KeyTerms {
                    models: vec!["two words".into()],
                    rate_per_min: None,
                    ..KeyTerms::default()
                },
                0,
                ORIGIN,
                &mut rng
            ),
            Err(Error::BadModelPattern { .. })
        ));
        add(&store, "A.b_c-9", &mut rng);
        add(&store, &"x".repeat(64), &mut rng);
        assert!(matches!(
            store.add(
                "A.b_c-9",
                KeyTerms {
                    models: vec![],
                    rate_per_min: None,
                    ..KeyTerms::default()
                },
                0,
                ORIGIN,
                &mut rng
            ),
            Err(Error::KeyNameTaken { .. })
        ));
        assert!(matches!(
            store.revoke("nobody", 0),
            Err(Error::NoSuchKey { .. })
        ));
        store.revoke("A.b_c-9", 5).unwrap();
        assert!(matches!(
            store.revoke("A.b_c-9", 6),
            Err(Error::NoSuchKey { .. })
        ));
        // A revoked name may be used again; it is a new key.
        let (again, _) = add(&store, "A.b_c-9", &mut rng);
        assert_eq!(
            store.list().iter().filter(|r| r.name == "A.b_c-9").count(),
            1
        );
        assert_eq!(
            store
                .list()
                .iter()
                .find(|r| r.name == "A.b_c-9")
                .unwrap()
                .id,
            again.id
        );
    }

    #[test]
    fn model_patterns() {
        let mut r = KeyRecord {
            id: KeyId([0; 16]),
            name: "k".into(),
            hash: [0; 32],
            models: vec![],
            rate_per_min: None,
            priority: None,
            created_at_ms: 0,
            revoked_at_ms: None,
            origin: ORIGIN,
        };
        assert!(r.allows_model("anything"), "empty means every model");
        r.models = vec!["qwen2.5:7b".into(), "llama3*".into(), "*-mini".into()];
        assert!(r.allows_model("qwen2.5:7b"));
        assert!(r.allows_model("QWEN2.5:7B"));
        assert!(!r.allows_model("qwen2.5:72b"));
        assert!(r.allows_model("llama3.1:8b"));
        assert!(r.allows_model("gpt-5-mini"));
        assert!(!r.allows_model("mistral"));
        r.models = vec!["*".into()];
        assert!(r.allows_model("mistral"));
    }

    #[test]
    fn digest_follows_adds_and_revocations() {
        let store = KeyStore::in_memory();
        let mut rng = rng();
        assert_eq!(store.digest(), 0);
        add(&store, "a", &mut rng);
        let one = store.digest();
        assert_ne!(one, 0);
        add(&store, "b", &mut rng);
        let two = store.digest();
        assert_ne!(two, one);
        store.revoke("a", 9).unwrap();
        assert_ne!(store.digest(), two, "a revocation changes the digest");
        assert_eq!(store.records().len(), 2, "revoked records are kept");
    }

    #[test]
    fn a_revocation_from_a_peer_wins_and_reaches_verify() {
        let here = KeyStore::in_memory();
        let there = KeyStore::in_memory();
        let mut rng = rng();
        let (_, secret) = add(&here, "ci", &mut rng);
        assert!(there.merge(here.records()).unwrap());
        assert!(
            there.verify(secret.expose()).is_some(),
            "a key works everywhere"
        );
        there.revoke("ci", 5_000).unwrap();
        // The stale live record does not bring it back there...
        assert!(!there.merge(here.records()).unwrap());
        assert!(there.verify(secret.expose()).is_none());
        // ...and the revocation reaches here.
        assert!(here.merge(there.records()).unwrap());
        assert!(here.verify(secret.expose()).is_none());
        assert_eq!(here.digest(), there.digest());
        // The earliest revocation is kept.
        let mut later = here.records();
        later[0].revoked_at_ms = Some(9_000);
        assert!(!here.merge(later).unwrap());
        let mut earlier = here.records();
        earlier[0].revoked_at_ms = Some(4_000);
        assert!(here.merge(earlier).unwrap());
        assert_eq!(here.records()[0].revoked_at_ms, Some(4_000));
    }

    #[test]
    fn the_same_name_from_two_nodes_keeps_both_keys() {
        let a = KeyStore::in_memory();
        let b = KeyStore::in_memory();
        let mut rng = rng();
        let (ka, sa) = add(&a, "ci", &mut rng);
        let (kb, sb) = b
            .add(
                "ci",
                KeyTerms {
                    models: vec![],
                    rate_per_min: None,
                    ..KeyTerms::default()
                },
                1,
                NodeId::from_u128(8),
                &mut rng,
            )
            .unwrap();
        assert!(a.merge(b.records()).unwrap());
        assert_eq!(a.verify(sa.expose()).unwrap().id, ka.id);
        assert_eq!(a.verify(sb.expose()).unwrap().id, kb.id);
        assert_eq!(a.list().len(), 2);
        assert!(matches!(
            a.add(
                "ci",
                KeyTerms {
                    models: vec![],
                    rate_per_min: None,
                    ..KeyTerms::default()
                },
                2,
                ORIGIN,
                &mut rng
            ),
            Err(Error::KeyNameTaken { .. })
        ));
        assert_eq!(
            a.revoke("ci", 3).unwrap().len(),
            2,
            "revoking a name revokes every key of it"
        );
        assert!(a.verify(sa.expose()).is_none() && a.verify(sb.expose()).is_none());
    }

    #[test]
    fn malformed_peer_records_are_skipped() {
        let store = KeyStore::in_memory();
        let mut rng = rng();
        let (mut r, _) = add(&KeyStore::in_memory(), "fine", &mut rng);
        r.name = "bad name".into();
        assert!(!store.merge(vec![r]).unwrap());
        assert!(store.records().is_empty());
    }

    #[test]
    fn a_damaged_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = KeyStore::default_path(dir.path());
        std::fs::write(&path, b"{ not json").unwrap();
        let err = KeyStore::open(dir.path()).unwrap_err();
        assert!(matches!(&err, Error::DamagedJson { path: p, .. } if *p == path));
        assert!(err.to_string().contains("keys.json"), "{err}");

        let store = KeyStore::in_memory();
        let mut rng = rng();
        add(&store, "a", &mut rng);
        let mut keys = store.records();
        keys.push(keys[0].clone());
        let file = StoreFile { v: 1, keys };
        std::fs::write(&path, serde_json::to_vec(&file).unwrap()).unwrap();
        assert!(matches!(
            KeyStore::open(dir.path()).unwrap_err(),
            Error::Damaged { .. }
        ));
        std::fs::write(&path, br#"{"v":2,"keys":[]}"#).unwrap();
        assert!(matches!(
            KeyStore::open(dir.path()).unwrap_err(),
            Error::Damaged { .. }
        ));
    }

    #[test]
    fn a_leftover_temp_file_is_cleaned() {
        let dir = tempfile::tempdir().unwrap();
        let path = KeyStore::default_path(dir.path());
        let store = KeyStore::open(dir.path()).unwrap();
        let mut rng = rng();
        add(&store, "a", &mut rng);
        let leftover = pair_fs::temp_path(&path);
        std::fs::write(&leftover, b"{\"v\":1,\"ke").unwrap();
        assert_eq!(KeyStore::open(dir.path()).unwrap().list().len(), 1);
        assert!(!leftover.exists());
    }

    #[test]
    fn the_rate_limiter_allows_n_a_minute_then_says_when() {
        let mut rl = RateLimiter::default();
        let t0 = Instant::now();
        let key = KeyId([1; 16]);
        let rate = NonZeroU32::new(3).unwrap();
        for _ in 0..3 {
            rl.check(key, rate, t0).unwrap();
        }
        assert_eq!(rl.check(key, rate, t0), Err(Duration::from_secs(20)));
        assert_eq!(
            rl.check(key, rate, t0 + Duration::from_secs(5)),
            Err(Duration::from_secs(15))
        );
        // One token back every 20 s.
        rl.check(key, rate, t0 + Duration::from_secs(20)).unwrap();
        assert!(rl.check(key, rate, t0 + Duration::from_secs(20)).is_err());
        // Other keys have their own buckets.
        rl.check(KeyId([2; 16]), rate, t0).unwrap();
        // A full minute idle refills the whole burst, and the entry can go.
        let later = t0 + Duration::from_secs(200);
        rl.prune(later);
        assert!(rl.is_empty());
        for _ in 0..3 {
            rl.check(key, rate, later).unwrap();
        }
        assert!(rl.check(key, rate, later).is_err());
    }

    #[test]
    fn the_rate_limiter_is_bounded() {
        let mut rl = RateLimiter::new(16);
        let t0 = Instant::now();
        let rate = NonZeroU32::new(1).unwrap();
        for i in 0..1000u32 {
            let mut id = [0; 16];
            id[..4].copy_from_slice(&i.to_le_bytes());
            rl.check(KeyId(id), rate, t0 + Duration::from_millis(u64::from(i)))
                .unwrap();
            assert!(rl.len() <= 16);
        }
        // The newest keys keep their history.
        let mut id = [0; 16];
        id[..4].copy_from_slice(&999u32.to_le_bytes());
        assert!(
            rl.check(KeyId(id), rate, t0 + Duration::from_secs(1))
                .is_err()
        );
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_gate_backs_off_doubling_after_five_failures() {
        let mut gate = FailureGate::default();
        let t0 = Instant::now();
        let a = ip("192.0.2.1");
        for i in 0..4 {
            gate.check(a, t0).unwrap();
            gate.failed(a, t0 + Duration::from_secs(i));
        }
        let t = t0 + Duration::from_secs(4);
        gate.check(a, t).unwrap();
        gate.failed(a, t);
        assert_eq!(gate.check(a, t), Err(Duration::from_secs(1)));
        assert!(
            gate.check(ip("192.0.2.2"), t).is_ok(),
            "others are not slowed"
        );
        let mut t = t + Duration::from_secs(1);
        for expected in [2, 4, 8, 16, 32, 64, 128, 256, 300, 300] {
            assert!(gate.check(a, t).is_ok());
            gate.failed(a, t);
            assert_eq!(gate.check(a, t), Err(Duration::from_secs(expected)));
            t += Duration::from_secs(expected);
        }
        // A quiet period after the last back-off: it starts over.
        let t = t + Duration::from_secs(600);
        for _ in 0..4 {
            gate.failed(a, t);
        }
        assert!(gate.check(a, t).is_ok());
        gate.failed(a, t);
        assert_eq!(gate.check(a, t), Err(Duration::from_secs(1)));
        gate.succeeded(a);
        assert!(gate.check(a, t).is_ok());
        assert!(gate.is_empty());
    }

    #[test]
    fn failures_outside_the_window_do_not_add_up() {
        let mut gate = FailureGate::default();
        let t0 = Instant::now();
        let a = ip("192.0.2.1");
        for i in 0..20 {
            gate.failed(a, t0 + Duration::from_secs(i * 20));
            assert!(gate.check(a, t0 + Duration::from_secs(i * 20)).is_ok());
        }
    }

    #[test]
    fn ipv6_counts_per_64() {
        let mut gate = FailureGate::default();
        let t = Instant::now();
        for i in 1..=5 {
            gate.failed(ip(&format!("2001:db8:1:2::{i:x}")), t);
        }
        assert!(gate.check(ip("2001:db8:1:2:ffff::1"), t).is_err());
        assert!(gate.check(ip("2001:db8:1:3::1"), t).is_ok());
        // An IPv4-mapped address is its IPv4 address.
        for _ in 0..5 {
            gate.failed(ip("::ffff:198.51.100.7"), t);
        }
        assert!(gate.check(ip("198.51.100.7"), t).is_err());
    }

    #[test]
    fn the_gate_is_bounded() {
        let mut gate = FailureGate::new(FailureLimits {
            max_entries: 32,
            ..FailureLimits::default()
        });
        let t0 = Instant::now();
        for i in 0..2000u32 {
            let a = IpAddr::from(i.to_be_bytes());
            gate.failed(a, t0 + Duration::from_millis(u64::from(i)));
            assert!(gate.len() <= 32);
        }
        // The most recent attackers are still tracked.
        let last = IpAddr::from(1999u32.to_be_bytes());
        for _ in 0..4 {
            gate.failed(last, t0 + Duration::from_secs(2));
        }
        assert!(gate.check(last, t0 + Duration::from_secs(2)).is_err());
    }

    fn record() -> impl Strategy<Value = KeyRecord> {
        (
            0u8..6,
            0u8..3,
            prop::sample::select(vec!["a", "b", "ci"]),
            prop::option::of(0u64..4),
            prop::option::of(1u32..5),
            prop::option::of(any::<bool>()),
        )
            .prop_map(|(id, hash, name, revoked, rate, batch)| KeyRecord {
                id: KeyId([id; 16]),
                name: name.into(),
                hash: [hash; 32],
                models: vec![],
                rate_per_min: rate.and_then(NonZeroU32::new),
                priority: batch.map(|b| {
                    if b {
                        pair_core::Priority::Batch
                    } else {
                        pair_core::Priority::Interactive
                    }
                }),
                created_at_ms: 0,
                revoked_at_ms: revoked,
                origin: ORIGIN,
            })
    }

    proptest! {
        #[test]
        fn merge_is_commutative_and_idempotent(
            a in prop::collection::vec(record(), 0..8),
            b in prop::collection::vec(record(), 0..8),
        ) {
            let ab = KeyStore::in_memory();
            ab.merge(a.clone()).unwrap();
            ab.merge(b.clone()).unwrap();
            let ba = KeyStore::in_memory();
            ba.merge(b.clone()).unwrap();
            ba.merge(a.clone()).unwrap();
            prop_assert_eq!(ab.records(), ba.records());
            prop_assert_eq!(ab.digest(), ba.digest());
            prop_assert!(!ab.merge(a.clone()).unwrap());
            prop_assert!(!ab.merge(b.clone()).unwrap());
            prop_assert!(!ab.merge(ba.records()).unwrap());
            // A revoked id never comes back to life.
            for r in a.iter().chain(&b).filter(|r| !r.is_live()) {
                let kept = ab.records().into_iter().find(|k| k.id == r.id).unwrap();
                prop_assert!(kept.revoked_at_ms.unwrap() <= r.revoked_at_ms.unwrap());
            }
        }

        #[test]
        fn presented_values_never_panic(s in "\\PC{0,80}") {
            let _ = parse_presented(&s);
        }
    }
}
