//! The job log: one record per request (never prompt or output text),
//! newest 10,000 kept for at most 7 days, in memory for the Jobs view and in
//! an append-only JSON Lines file that survives restarts. Records from peers
//! (replication) land in the same log, de-duplicated by job id.

use std::collections::{HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use pair_core::{JobId, JobRecord};
use tokio::sync::broadcast;

pub const KEEP_RECORDS: usize = 10_000;
pub const KEEP_MS: u64 = 7 * 24 * 3600 * 1000;

#[derive(Debug, thiserror::Error)]
pub enum JobLogError {
    #[error("job log {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

#[derive(Debug)]
struct Inner {
    records: VecDeque<JobRecord>,
    index: HashMap<JobId, usize>,
    /// Records removed from the front since start; `index` values are
    /// absolute positions, so front removal is O(1).
    dropped: usize,
    file: Option<BufWriter<File>>,
    lines_in_file: usize,
}

/// Shared, cheap to lock briefly; appends are buffered and flushed per record.
#[derive(Debug)]
pub struct JobLog {
    inner: Mutex<Inner>,
    path: Option<PathBuf>,
    events: broadcast::Sender<JobRecord>,
}

impl JobLog {
    /// A log kept only in memory (tests, the simulator).
    pub fn in_memory() -> Self {
        Self::with_file(None, Vec::new())
    }

    /// Opens (or creates) `dir/jobs.jsonl`, loading what is still fresh.
    /// Lines that do not parse (a crash mid-write) are skipped.
    pub fn open(dir: &Path, now_ms: u64) -> Result<Self, JobLogError> {
        let path = dir.join("jobs.jsonl");
        let io = |source| JobLogError::Io {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let mut loaded = Vec::new();
        if let Ok(f) = File::open(&path) {
            for line in BufReader::new(f).lines() {
                let line = line.map_err(io)?;
                if let Ok(rec) = serde_json::from_str::<JobRecord>(&line)
                    && now_ms.saturating_sub(rec.created_at_ms) <= KEEP_MS
                {
                    loaded.push(rec);
                }
            }
        }
        let log = Self::with_file(Some(path.clone()), loaded);
        log.compact().map_err(io)?;
        Ok(log)
    }

    fn with_file(path: Option<PathBuf>, loaded: Vec<JobRecord>) -> Self {
        let (events, _) = broadcast::channel(1024);
        let log = Self {
            inner: Mutex::new(Inner {
                records: VecDeque::new(),
                index: HashMap::new(),
                dropped: 0,
                file: None,
                lines_in_file: 0,
            }),
            path,
            events,
        };
        if let Ok(mut inner) = log.inner.lock() {
            for rec in loaded {
                upsert(&mut inner, rec);
            }
        }
        log
    }

    /// Rewrites the file with just the records kept, then appends to it.
    fn compact(&self) -> std::io::Result<()> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let mut inner = self
            .inner
            .lock()
            .map_err(|_| std::io::Error::other("job log lock poisoned"))?;
        let tmp = path.with_extension("jsonl.tmp");
        {
            let mut w = BufWriter::new(File::create(&tmp)?);
            for rec in &inner.records {
                serde_json::to_writer(&mut w, rec)?;
                w.write_all(b"\n")?;
            }
            w.flush()?;
            w.get_ref().sync_all()?;
        }
        std::fs::rename(&tmp, path)?;
        inner.lines_in_file = inner.records.len();
        inner.file = Some(BufWriter::new(OpenOptions::new().append(true).open(path)?));
        Ok(())
    }

    /// Records a new or updated job (local or replicated from a peer).
    pub fn record(&self, rec: JobRecord) {
        let needs_compaction = {
            let Ok(mut inner) = self.inner.lock() else {
                return;
            };
            if let Some(f) = inner.file.as_mut() {
                let ok = serde_json::to_writer(&mut *f, &rec).is_ok()
                    && f.write_all(b"\n").is_ok()
                    && f.flush().is_ok();
                if !ok {
                    tracing::warn!("could not append to the job log; keeping it in memory");
                }
                inner.lines_in_file += 1;
            }
            upsert(&mut inner, rec.clone());
            inner.lines_in_file > 2 * KEEP_RECORDS
        };
        if needs_compaction && let Err(e) = self.compact() {
            tracing::warn!(error = %e, "job log compaction failed");
        }
        // Nobody listening is fine.
        let _ = self.events.send(rec);
    }

    /// Newest first, at most `n`.
    pub fn recent(&self, n: usize) -> Vec<JobRecord> {
        self.inner
            .lock()
            .map(|inner| inner.records.iter().rev().take(n).cloned().collect())
            .unwrap_or_default()
    }

    pub fn get(&self, id: JobId) -> Option<JobRecord> {
        let inner = self.inner.lock().ok()?;
        let pos = *inner.index.get(&id)?;
        inner.records.get(pos - inner.dropped).cloned()
    }

    pub fn len(&self) -> usize {
        self.inner.lock().map(|i| i.records.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// New and updated records as they are recorded (for replication).
    pub fn subscribe(&self) -> broadcast::Receiver<JobRecord> {
        self.events.subscribe()
    }
}

fn upsert(inner: &mut Inner, rec: JobRecord) {
    if let Some(&pos) = inner.index.get(&rec.id) {
        let i = pos - inner.dropped;
        if let Some(slot) = inner.records.get_mut(i) {
            *slot = rec;
            return;
        }
    }
    let pos = inner.dropped + inner.records.len();
    inner.index.insert(rec.id, pos);
    inner.records.push_back(rec);
    while inner.records.len() > KEEP_RECORDS {
        if let Some(old) = inner.records.pop_front() {
            inner.index.remove(&old.id);
            inner.dropped += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pair_core::{ApiFlavor, JobStatus, NodeId};

    fn rec(n: u128, at: u64) -> JobRecord {
        JobRecord {
            id: JobId::from_uuid(uuid::Uuid::from_u128(n)),
            model: "m".into(),
            flavor: ApiFlavor::Ollama,
            route: "/api/chat".into(),
            streaming: true,
            origin: NodeId::from_u128(1),
            ran_on: Some(NodeId::from_u128(2)),
            attempts: 1,
            status: JobStatus::Completed,
            http_status: Some(200),
            created_at_ms: at,
            ttft_ms: Some(5),
            duration_ms: Some(9),
            prompt_tokens: None,
            output_tokens: Some(3),
            error: None,
        }
    }

    #[test]
    fn keeps_the_newest_and_updates_in_place() {
        let log = JobLog::in_memory();
        for i in 0..(KEEP_RECORDS as u128 + 5) {
            log.record(rec(i, 0));
        }
        assert_eq!(log.len(), KEEP_RECORDS);
        assert!(
            log.get(JobId::from_uuid(uuid::Uuid::from_u128(0)))
                .is_none()
        );
        let mut r = rec(KEEP_RECORDS as u128 + 4, 0);
        r.status = JobStatus::Failed;
        log.record(r);
        assert_eq!(log.len(), KEEP_RECORDS);
        assert_eq!(log.recent(1)[0].status, JobStatus::Failed);
    }

    #[test]
    fn survives_restart_and_a_torn_last_line_and_drops_old_records() {
        let dir = tempfile::tempdir().unwrap();
        let now = 10 * KEEP_MS;
        {
            let log = JobLog::open(dir.path(), now).unwrap();
            log.record(rec(1, now - KEEP_MS - 1));
            log.record(rec(2, now - 5));
            log.record(rec(3, now));
        }
        let mut f = OpenOptions::new()
            .append(true)
            .open(dir.path().join("jobs.jsonl"))
            .unwrap();
        f.write_all(b"{\"id\":\"torn").unwrap();
        drop(f);
        let log = JobLog::open(dir.path(), now).unwrap();
        let ids: Vec<_> = log.recent(10).iter().map(|r| r.id).collect();
        assert_eq!(
            ids,
            [
                JobId::from_uuid(uuid::Uuid::from_u128(3)),
                JobId::from_uuid(uuid::Uuid::from_u128(2))
            ]
        );
    }
}
