//! The trust store: one pinned record per paired peer, on disk and live in memory.
//!
//! The file is written whole, atomically (temp file, fsync, rename), so a
//! crash leaves either the old set of pins or the new one. In memory the
//! store is a snapshot behind a lock that TLS verifiers read on every
//! handshake, plus a broadcast of changes so the proxy can close the open
//! connections of a peer the moment it is unpaired.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pair_core::{NodeId, Role};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use crate::error::Result;
use crate::fingerprint::Fingerprint;
use crate::store_file;

/// One paired peer: what we pinned and when.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerRecord {
    pub id: NodeId,
    pub name: String,
    pub role: Role,
    /// The peer's certificate, exactly as pinned (base64 DER on disk).
    #[serde(with = "crate::wire::b64")]
    pub cert_der: Vec<u8>,
    pub fingerprint: Fingerprint,
    /// Seconds since the Unix epoch.
    pub paired_at: u64,
    /// `None`: paired here, with a PIN. `Some(node)`: pinned because that
    /// paired node vouched for it (a client it paired, or, on a client, a
    /// node of its cluster); it goes when the voucher stops vouching.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vouched_by: Option<NodeId>,
}

impl PeerRecord {
    pub fn paired_at_time(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(self.paired_at)
    }
}

/// A change of the trust store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TrustEvent {
    /// A peer was pinned (or re-pinned with a new certificate).
    Added(PeerRecord),
    /// A peer's pin was removed: close its connections.
    Removed(NodeId),
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoreFile {
    v: u32,
    peers: Vec<PeerRecord>,
}

impl store_file::Versioned for StoreFile {
    fn version(&self) -> u32 {
        self.v
    }
}

#[derive(Debug)]
struct Inner {
    /// `None` for an in-memory store (tests, emulated clusters).
    path: Option<PathBuf>,
    peers: RwLock<Arc<BTreeMap<NodeId, PeerRecord>>>,
    /// Serialises writers so file order equals memory order.
    write: Mutex<()>,
    events: broadcast::Sender<TrustEvent>,
}

/// A live handle on the trust store. Cheap to clone; every clone sees every
/// change at once.
#[derive(Clone, Debug)]
pub struct TrustStore {
    inner: Arc<Inner>,
}

impl TrustStore {
    /// The default file name under a state directory.
    pub fn default_path(state_dir: &Path) -> PathBuf {
        state_dir.join("trust.json")
    }

    /// Opens (or starts empty) the store at `path`. Temp files left by a
    /// crashed write are removed; a damaged file is an error naming it.
    pub fn open(path: impl Into<PathBuf>) -> Result<Self> {
        let path = path.into();
        let peers = match store_file::load::<StoreFile>(&path)? {
            None => BTreeMap::new(),
            Some(file) => records_of(&path, file)?,
        };
        Ok(Self::with(Some(path), peers))
    }

    /// A store that lives only in memory.
    pub fn in_memory() -> Self {
        Self::with(None, BTreeMap::new())
    }

    fn with(path: Option<PathBuf>, peers: BTreeMap<NodeId, PeerRecord>) -> Self {
        let (events, _) = broadcast::channel(64);
        Self {
            inner: Arc::new(Inner {
                path,
                peers: RwLock::new(Arc::new(peers)),
                write: Mutex::new(()),
                events,
            }),
        }
    }

    pub fn path(&self) -> Option<&Path> {
        self.inner.path.as_deref()
    }

    /// The current set of pins, as one consistent snapshot.
    pub fn snapshot(&self) -> Arc<BTreeMap<NodeId, PeerRecord>> {
        match self.inner.peers.read() {
            Ok(g) => Arc::clone(&g),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    pub fn peers(&self) -> Vec<PeerRecord> {
        self.snapshot().values().cloned().collect()
    }

    pub fn get(&self, id: NodeId) -> Option<PeerRecord> {
        self.snapshot().get(&id).cloned()
    }

    pub fn is_empty(&self) -> bool {
        self.snapshot().is_empty()
    }

    /// The pinned record whose certificate is exactly `der`, if any.
    pub fn pinned(&self, der: &[u8]) -> Option<PeerRecord> {
        let fp = Fingerprint::of(der);
        self.snapshot()
            .values()
            .find(|r| r.fingerprint == fp && r.cert_der == der)
            .cloned()
    }

    /// Pins a peer (replacing any earlier record with the same id), durably,
    /// then tells subscribers.
    pub fn insert(&self, record: PeerRecord) -> Result<()> {
        self.update(|peers| {
            peers.insert(record.id, record.clone());
            Some(TrustEvent::Added(record.clone()))
        })
        .map(|_| ())
    }

    /// Makes the pins `voucher` vouches for with `role` exactly `records`
    /// (as the voucher listed them): new ones are added, changed ones
    /// replaced, those it no longer lists removed. A pin made here with a
    /// PIN is never replaced or removed by a voucher, nor is the
    /// voucher's own. Returns how many pins changed.
    pub fn reconcile_vouched(
        &self,
        voucher: NodeId,
        role: Role,
        records: &[PeerRecord],
    ) -> Result<usize> {
        let mut wanted: BTreeMap<NodeId, PeerRecord> = BTreeMap::new();
        for r in records {
            if r.role == role && r.id != voucher && Fingerprint::of(&r.cert_der) == r.fingerprint {
                let mut r = r.clone();
                r.vouched_by = Some(voucher);
                wanted.insert(r.id, r);
            }
        }
        let mut changed = Vec::new();
        self.update(|peers| {
            let stale: Vec<NodeId> = peers
                .values()
                .filter(|p| p.vouched_by == Some(voucher) && !wanted.contains_key(&p.id))
                .map(|p| p.id)
                .collect();
            for id in stale {
                peers.remove(&id);
                changed.push(TrustEvent::Removed(id));
            }
            for (id, r) in &wanted {
                match peers.get(id) {
                    // Pinned here, or by another voucher with the same cert.
                    Some(p) if p.vouched_by.is_none() || p.cert_der == r.cert_der => {}
                    _ => {
                        peers.insert(*id, r.clone());
                        changed.push(TrustEvent::Added(r.clone()));
                    }
                }
            }
            changed.first().cloned()
        })?;
        // The first change went out with the update; the rest follow.
        for event in changed.iter().skip(1) {
            let _ = self.inner.events.send(event.clone());
        }
        Ok(changed.len())
    }

    /// A digest of the pins made here with a PIN for `role` (ids and
    /// fingerprints), so peers can tell when what this node vouches for
    /// changed; 0 when there are none.
    pub fn vouch_digest(&self, role: Role) -> u64 {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        let mut any = false;
        for r in self.snapshot().values() {
            if r.role == role && r.vouched_by.is_none() {
                any = true;
                h.update(r.id.as_uuid().as_bytes());
                h.update(r.fingerprint.as_bytes());
            }
        }
        if !any {
            return 0;
        }
        let d = h.finalize();
        u64::from_le_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]]) | 1
    }

    /// Removes a peer's pin, durably, then tells subscribers. Returns the
    /// removed record (`None` when the peer was not paired).
    pub fn remove(&self, id: NodeId) -> Result<Option<PeerRecord>> {
        let mut removed = None;
        self.update(|peers| {
            removed = peers.remove(&id);
            removed.as_ref().map(|_| TrustEvent::Removed(id))
        })?;
        Ok(removed)
    }

    /// Every change from now on. A lagging receiver should re-read
    /// [`TrustStore::snapshot`].
    pub fn subscribe(&self) -> broadcast::Receiver<TrustEvent> {
        self.inner.events.subscribe()
    }

    /// Resolves when `id` is no longer pinned (at once if it is not pinned
    /// now). The proxy races each peer connection against this and drops the
    /// connection when it fires.
    pub async fn revoked(&self, id: NodeId) {
        self.wait_until(|peers| !peers.contains_key(&id)).await;
    }

    /// Resolves when no pin has this certificate fingerprint any more: the
    /// peer was unpaired, or re-paired with a new certificate. Use it for a
    /// connection authenticated with that exact certificate.
    pub async fn cert_revoked(&self, fingerprint: Fingerprint) {
        self.wait_until(|peers| !peers.values().any(|r| r.fingerprint == fingerprint))
            .await;
    }

    async fn wait_until(&self, done: impl Fn(&BTreeMap<NodeId, PeerRecord>) -> bool) {
        let mut events = self.subscribe();
        loop {
            // Checked after subscribing so a change in between is not missed.
            if done(&self.snapshot()) {
                return;
            }
            match events.recv().await {
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                // Unreachable while `self` holds the sender; fail closed.
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }

    fn update(
        &self,
        change: impl FnOnce(&mut BTreeMap<NodeId, PeerRecord>) -> Option<TrustEvent>,
    ) -> Result<Option<TrustEvent>> {
        let _writer = self
            .inner
            .write
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut next = (*self.snapshot()).clone();
        let Some(event) = change(&mut next) else {
            return Ok(None);
        };
        if let Some(path) = &self.inner.path {
            // Disk first: memory never trusts what a restart would forget.
            let file = StoreFile {
                v: store_file::FORMAT_VERSION,
                peers: next.values().cloned().collect(),
            };
            store_file::save(path, &file)?;
        }
        {
            let mut guard = self
                .inner
                .peers
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            *guard = Arc::new(next);
        }
        let _ = self.inner.events.send(event.clone());
        Ok(Some(event))
    }
}

/// The records of a store's file, checked.
fn records_of(path: &Path, file: StoreFile) -> Result<BTreeMap<NodeId, PeerRecord>> {
    let damaged = |reason: String| store_file::damaged(path, reason);
    let mut peers = BTreeMap::new();
    for record in file.peers {
        // A record whose fingerprint does not match its certificate was
        // edited by hand or corrupted: refuse rather than half-trust it.
        if Fingerprint::of(&record.cert_der) != record.fingerprint {
            return Err(damaged(format!(
                "fingerprint mismatch for peer {}",
                record.id
            )));
        }
        if peers.insert(record.id, record).is_some() {
            return Err(damaged("duplicate peer record".into()));
        }
    }
    Ok(peers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    fn record(n: u128) -> PeerRecord {
        let cert = format!("cert-{n}").into_bytes();
        PeerRecord {
            id: NodeId::from_u128(n),
            name: format!("peer-{n}"),
            role: Role::Node,
            fingerprint: Fingerprint::of(&cert),
            cert_der: cert,
            paired_at: 1_700_000_000,
            vouched_by: None,
        }
    }

    fn client(n: u128) -> PeerRecord {
        PeerRecord {
            role: Role::Client,
            ..record(n)
        }
    }

    #[test]
    fn a_voucher_sets_exactly_its_own_vouched_pins() {
        let store = TrustStore::in_memory();
        let voucher = NodeId::from_u128(1);
        store.insert(record(1)).unwrap();
        store.insert(client(2)).unwrap(); // paired here with a PIN
        let mut events = store.subscribe();
        let listed = [client(2), client(3), client(4), record(5)];
        assert_eq!(
            store
                .reconcile_vouched(voucher, Role::Client, &listed)
                .unwrap(),
            2
        );
        assert_eq!(
            events.try_recv().unwrap(),
            TrustEvent::Added(PeerRecord {
                vouched_by: Some(voucher),
                ..client(3)
            })
        );
        assert_eq!(
            store.get(NodeId::from_u128(2)).unwrap().vouched_by,
            None,
            "a PIN pairing stays"
        );
        assert_eq!(
            store.get(NodeId::from_u128(3)).unwrap().vouched_by,
            Some(voucher)
        );
        assert!(
            store.get(NodeId::from_u128(5)).is_none(),
            "only the role asked for"
        );
        // Listed again: nothing changes; one dropped: it goes.
        assert_eq!(
            store
                .reconcile_vouched(voucher, Role::Client, &listed)
                .unwrap(),
            0
        );
        assert_eq!(
            store
                .reconcile_vouched(voucher, Role::Client, &[client(3)])
                .unwrap(),
            1
        );
        assert!(store.get(NodeId::from_u128(4)).is_none());
        assert!(store.get(NodeId::from_u128(2)).is_some());
        // A forged record (fingerprint not its cert's) is not taken.
        let mut forged = client(6);
        forged.fingerprint = Fingerprint::of(b"other");
        assert_eq!(
            store
                .reconcile_vouched(voucher, Role::Client, &[client(3), forged])
                .unwrap(),
            0
        );
    }

    #[test]
    fn the_vouch_digest_follows_pin_pairings_of_one_role() {
        let store = TrustStore::in_memory();
        assert_eq!(store.vouch_digest(Role::Client), 0);
        store.insert(record(1)).unwrap();
        assert_eq!(store.vouch_digest(Role::Client), 0);
        store.insert(client(2)).unwrap();
        let one = store.vouch_digest(Role::Client);
        assert_ne!(one, 0);
        store
            .reconcile_vouched(NodeId::from_u128(1), Role::Client, &[client(3)])
            .unwrap();
        assert_eq!(
            store.vouch_digest(Role::Client),
            one,
            "vouched pins are not vouched on"
        );
        store.insert(client(4)).unwrap();
        assert_ne!(store.vouch_digest(Role::Client), one);
    }

    #[test]
    fn records_survive_reopen_and_removal_is_durable() {
        let dir = tempfile::tempdir().unwrap();
        let path = TrustStore::default_path(dir.path());
        let store = TrustStore::open(&path).unwrap();
        store.insert(record(1)).unwrap();
        store.insert(record(2)).unwrap();
        assert_eq!(store.remove(NodeId::from_u128(1)).unwrap(), Some(record(1)));
        let again = TrustStore::open(&path).unwrap();
        assert_eq!(again.peers(), vec![record(2)]);
        assert_eq!(again.pinned(b"cert-2"), Some(record(2)));
        assert_eq!(again.pinned(b"cert-1"), None);
    }

    #[test]
    fn trust_store_survives_crash_mid_write() {
        let dir = tempfile::tempdir().unwrap();
        let path = TrustStore::default_path(dir.path());
        let store = TrustStore::open(&path).unwrap();
        store.insert(record(1)).unwrap();
        // A crash after the temp file was half written, before the rename.
        let leftover = pair_fs::temp_path(&path);
        std::fs::write(&leftover, br#"{"v":1,"peers":[{"id":"#).unwrap();
        let reopened = TrustStore::open(&path).unwrap();
        assert_eq!(reopened.peers(), vec![record(1)]);
        assert!(!leftover.exists(), "leftover temp file is cleaned");
        reopened.insert(record(2)).unwrap();
        assert_eq!(TrustStore::open(&path).unwrap().peers().len(), 2);
    }

    #[test]
    fn damaged_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = TrustStore::default_path(dir.path());
        std::fs::write(&path, b"{ not json").unwrap();
        let err = TrustStore::open(&path).unwrap_err();
        assert!(matches!(&err, Error::DamagedJson { path: p, .. } if *p == path));
        assert!(err.to_string().contains("trust.json"), "{err}");

        let mut bad = record(1);
        bad.fingerprint = Fingerprint::of(b"other");
        let file = StoreFile {
            v: 1,
            peers: vec![bad],
        };
        std::fs::write(&path, serde_json::to_vec(&file).unwrap()).unwrap();
        assert!(matches!(
            TrustStore::open(&path).unwrap_err(),
            Error::Damaged { .. }
        ));
    }

    #[tokio::test]
    async fn subscribers_see_removal_and_revoked_fires() {
        let store = TrustStore::in_memory();
        store.insert(record(7)).unwrap();
        let mut events = store.subscribe();
        let waiter = {
            let store = store.clone();
            tokio::spawn(async move { store.revoked(NodeId::from_u128(7)).await })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        store.remove(NodeId::from_u128(7)).unwrap();
        assert_eq!(
            events.recv().await.unwrap(),
            TrustEvent::Removed(NodeId::from_u128(7))
        );
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn re_pairing_with_a_new_certificate_revokes_the_old_one() {
        let store = TrustStore::in_memory();
        let old = record(3);
        store.insert(old.clone()).unwrap();
        let waiter = {
            let store = store.clone();
            tokio::spawn(async move { store.cert_revoked(old.fingerprint).await })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        let mut new = record(3);
        new.cert_der = b"new-cert".to_vec();
        new.fingerprint = Fingerprint::of(&new.cert_der);
        store.insert(new).unwrap();
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
        assert!(store.get(NodeId::from_u128(3)).is_some());
    }
}
