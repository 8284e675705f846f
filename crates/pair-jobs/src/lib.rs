//! The job log: one record per request (never prompt or output text),
//! newest 10,000 kept for at most 7 days, in memory for the Jobs view and in
//! an append-only JSON Lines file that survives restarts. Records from peers
//! (replication) land in the same log, one per job id: a record replaces
//! another of its job only when it supersedes it
//! ([`JobRecord::supersedes`]: forward only, the origin's wins), and the
//! one that replaces it goes to the end of the log, so replication sends it
//! on.

use std::collections::{HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use pair_core::{JobId, JobRecord};

use pair_runtime::per_loop::PerLoop;

pub const KEEP_RECORDS: usize = 10_000;
/// The file is rewritten with just the kept records once it holds this
/// many lines: each compaction re-serialises [`KEEP_RECORDS`] records, so
/// a higher bound costs less per request (here a third of a record each)
/// for a bounded file (~40,000 lines of ~300 bytes).
const COMPACT_AT: usize = 4 * KEEP_RECORDS;
/// Records serialised between yields of the writer thread (~0.1 ms).
const YIELD_EVERY: usize = 256;
/// One turn's records usually fit, so a turn is one `write`.
const WRITE_BUF: usize = 256 * 1024;
pub const KEEP_MS: u64 = 7 * 24 * 3600 * 1000;
/// How often the writer thread appends what was recorded since its last
/// turn. Nothing on the request path signals it: recording a job is a
/// push under a mutex, never a wake-up or a syscall. Only the newest
/// [`KEEP_RECORDS`] of a turn are written (older ones would be compacted
/// away unread), so the longer the turn, the less JSON under heavy load:
/// at 45,000 requests/s a one-second turn serialises 10,000 records, not
/// 45,000 (serialisation was 16% of the node's instructions per request,
/// callgrind). What a crash can lose is the last turn; a stop writes it.
pub const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// Records an event loop stages before it moves them into the log itself
/// (a reader or the writer's turn, every [`FLUSH_EVERY`], may do it
/// first). Bench `bookkeeping` could not tell 512, 2,048 and 10,000 apart.
const STAGE_MAX: usize = 2048;

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
    /// Shared with the writer's batch and replication: a record is
    /// allocated once and never copied on the request path.
    /// No index by id: the request path only stages, and keeping an index
    /// of 10,000 random ids cost the request path more than the rest of the
    /// log (a hash-map insert and removal, each a likely cache miss, per
    /// request). Finding by id scans; readers do it, a batch at a time.
    /// A record superseded by a newer one of its job leaves an empty slot
    /// (`None`), so positions stay what cursors count.
    records: VecDeque<Option<Arc<JobRecord>>>,
    /// Records removed from the front since start (replication's cursors
    /// are absolute positions).
    dropped: usize,
    /// Recorded but not yet appended to the file (file-backed logs only),
    /// at most the newest [`KEEP_RECORDS`]: an older one could only be
    /// compacted away, and a writer stuck on a dead disk grows nothing.
    unwritten: VecDeque<Arc<JobRecord>>,
}

/// What the log's handle and its writer thread share.
#[derive(Debug)]
struct Shared {
    inner: Mutex<Inner>,
    /// Records made on each event loop ([`PerLoop`]) and not yet in
    /// `inner`: a request pushes under its own loop's lock, which only a
    /// reader also takes, instead of the log's lock, which both loops took
    /// on every request (with the cache lines of the log itself: 423 ns a
    /// record on two loops against 82 on one, bench `bookkeeping`; 231-250
    /// against 85-92 staged, what is left being the free of a record made
    /// on another loop).
    /// Readers move them in first ([`Shared::gather`]).
    staged: PerLoop<Mutex<Vec<Arc<JobRecord>>>>,
    /// A writer thread appends the records to a file: queue them for it.
    file_backed: bool,
}

/// The writer thread and how to stop it.
#[derive(Debug)]
struct Writer {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<()>,
}

/// Shared by the request path and the Jobs view. Recording a job touches
/// only memory, and only its own event loop's list of records (readers
/// gather the lists); a writer thread owns the file, appends what was recorded
/// every [`FLUSH_EVERY`] in one write and compacts the file, so no request
/// ever waits for the disk or wakes another thread.
#[derive(Debug)]
pub struct JobLog {
    shared: Arc<Shared>,
    writer: Option<Writer>,
}

impl JobLog {
    /// A log kept only in memory (tests, the simulator).
    pub fn in_memory() -> Self {
        Self::new(Vec::new(), false)
    }

    /// Opens (or creates) `dir/jobs.jsonl`, loading what is still fresh.
    /// Lines that do not parse (a crash mid-write) are skipped.
    pub fn open(dir: &Path, now_ms: u64) -> Result<Self, JobLogError> {
        Self::open_with_turn(dir, now_ms, FLUSH_EVERY)
    }

    /// [`JobLog::open`] with the writer's turn given.
    fn open_with_turn(dir: &Path, now_ms: u64, turn: Duration) -> Result<Self, JobLogError> {
        let path = dir.join("jobs.jsonl");
        let io = |source| JobLogError::Io {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        // A compaction a crash interrupted left only its temp file.
        pair_fs::clean_leftovers(&path);
        let mut loaded = Vec::new();
        if let Ok(f) = File::open(&path) {
            // The history is disposable: a line that does not parse (torn
            // by a crash, NUL-filled, not UTF-8) is skipped, never fatal.
            let mut skipped = 0usize;
            for line in BufReader::new(f).split(b'\n') {
                let line = line.map_err(io)?;
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                match serde_json::from_slice::<JobRecord>(&line) {
                    Ok(rec) if now_ms.saturating_sub(rec.created_at_ms) <= KEEP_MS => {
                        loaded.push(rec);
                    }
                    Ok(_) => {}
                    Err(_) => skipped += 1,
                }
            }
            if skipped > 0 {
                tracing::warn!(
                    skipped,
                    path = %path.display(),
                    "skipped unreadable lines of the job history (they are dropped at the next compaction)"
                );
            }
        }
        let mut log = Self::new(loaded, true);
        let kept = compact(&path, &log.shared.inner, &mut Vec::new()).map_err(io)?;
        let file = OpenOptions::new().append(true).open(&path).map_err(io)?;
        let stop = Arc::new(AtomicBool::new(false));
        let shared = Arc::clone(&log.shared);
        let writer_path = path.clone();
        let writer_stop = Arc::clone(&stop);
        let handle = std::thread::Builder::new()
            .name("pair-job-log".into())
            .spawn(move || write_loop(&writer_path, file, kept, &shared, &writer_stop, turn))
            .map_err(io)?;
        log.writer = Some(Writer { stop, handle });
        Ok(log)
    }

    fn new(loaded: Vec<JobRecord>, file_backed: bool) -> Self {
        let mut inner = Inner {
            records: VecDeque::new(),
            dropped: 0,
            unwritten: VecDeque::new(),
        };
        // A job's record superseded later was appended again.
        upsert(
            &mut inner,
            loaded.into_iter().map(Arc::new).collect(),
            false,
        );
        Self {
            shared: Arc::new(Shared {
                inner: Mutex::new(inner),
                staged: PerLoop::default(),
                file_backed,
            }),
            writer: None,
        }
    }

    /// Records a job this node just ran or routed. It is staged on the
    /// calling event loop and joins the log when the log is next read
    /// (where a record of the same job from a peer is looked for).
    pub fn record(&self, rec: JobRecord) {
        let full = match self.shared.staged.local().lock() {
            Ok(mut staged) => {
                staged.push(Arc::new(rec));
                staged.len() >= STAGE_MAX
            }
            Err(_) => false,
        };
        if full {
            drop(self.shared.gather());
        }
    }

    /// Takes in records from elsewhere (a peer's replication batch): each
    /// joins the log unless the log holds a record of its job it does not
    /// supersede. One pass over the log per batch.
    pub fn merge(&self, records: impl IntoIterator<Item = JobRecord>) {
        let records: Vec<Arc<JobRecord>> = records.into_iter().map(Arc::new).collect();
        if let Some(mut inner) = self.shared.gather() {
            upsert(&mut inner, records, self.shared.file_backed);
        }
    }

    /// Newest first, at most `n`.
    pub fn recent(&self, n: usize) -> Vec<JobRecord> {
        self.shared
            .gather()
            .map(|inner| {
                inner
                    .records
                    .iter()
                    .rev()
                    .flatten()
                    .take(n)
                    .map(|r| JobRecord::clone(r))
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn get(&self, id: JobId) -> Option<JobRecord> {
        let inner = self.shared.gather()?;
        inner
            .records
            .iter()
            .rev()
            .flatten()
            .find(|r| r.id == id)
            .map(|r| JobRecord::clone(r))
    }

    pub fn len(&self) -> usize {
        self.shared
            .gather()
            .map_or(0, |i| i.records.iter().flatten().count())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where the next new record will be: a cursor for [`JobLog::after`].
    pub fn end(&self) -> usize {
        self.shared
            .gather()
            .map_or(0, |i| i.dropped + i.records.len())
    }

    /// The oldest records after `cursor`, at most `max`, and the cursor
    /// past them (for a reader that moves on only once they were taken,
    /// such as replication to a peer that must acknowledge them). A cursor
    /// older than the log starts at its oldest record.
    pub fn after(&self, cursor: usize, max: usize) -> (Vec<Arc<JobRecord>>, usize) {
        let Some(inner) = self.shared.gather() else {
            return (Vec::new(), cursor);
        };
        let end = inner.dropped + inner.records.len();
        let from = cursor.clamp(inner.dropped, end);
        let mut out = Vec::new();
        let mut next = from;
        for slot in inner.records.range(from - inner.dropped..) {
            if out.len() == max {
                break;
            }
            next += 1;
            if let Some(rec) = slot {
                out.push(Arc::clone(rec));
            }
        }
        (out, next)
    }
}

impl Shared {
    /// Moves the records the loops staged into the log, in the order
    /// their jobs ended, and returns the log locked. Each loop's list is
    /// in its own order already; the lists are interleaved by end time
    /// (start plus duration, to the millisecond; a stable sort, so ties
    /// keep a loop's order).
    fn gather(&self) -> Option<MutexGuard<'_, Inner>> {
        let mut inner = self.inner.lock().ok()?;
        let mut batch = Vec::new();
        for slot in self.staged.iter() {
            if let Ok(mut staged) = slot.lock() {
                // Moved out, so the loop's list keeps its capacity.
                batch.append(&mut staged);
            }
        }
        batch.sort_by_key(|r| {
            r.created_at_ms
                .saturating_add(u64::from(r.duration_ms.unwrap_or(0)))
        });
        upsert(&mut inner, batch, self.file_backed);
        Some(inner)
    }
}

impl Drop for JobLog {
    /// Lets the writer append what is still unwritten, then waits for it.
    fn drop(&mut self) {
        if let Some(w) = self.writer.take() {
            w.stop.store(true, Ordering::Release);
            w.handle.thread().unpark();
            let _ = w.handle.join();
        }
    }
}

/// The writer thread: every `turn` ([`FLUSH_EVERY`]; or when told to stop) takes
/// what was recorded since its last turn, appends it with one `write`, no
/// fsync, and compacts the file once it holds [`COMPACT_AT`] lines.
fn write_loop(
    path: &Path,
    file: File,
    mut lines: usize,
    shared: &Shared,
    stop: &AtomicBool,
    turn: Duration,
) {
    let mut file = file;
    let mut buf = Vec::with_capacity(WRITE_BUF + 1024);
    let mut batch = VecDeque::new();
    loop {
        if !stop.load(Ordering::Acquire) {
            std::thread::park_timeout(turn);
        }
        let stopping = stop.load(Ordering::Acquire);
        match shared.gather() {
            Some(mut i) => std::mem::swap(&mut i.unwritten, &mut batch),
            None => return,
        }
        if !batch.is_empty() {
            lines += batch.len();
            let written = write_records(&mut file, &mut buf, batch.iter().map(|r| &**r));
            batch.clear();
            if let Err(e) = written {
                tracing::warn!(path = %path.display(), error = %e, "could not append to the job log");
            }
        }
        if lines > COMPACT_AT {
            match compact(path, &shared.inner, &mut buf).and_then(|kept| {
                let f = OpenOptions::new().append(true).open(path)?;
                Ok((kept, f))
            }) {
                Ok((kept, f)) => {
                    lines = kept;
                    file = f;
                }
                Err(e) => tracing::warn!(error = %e, "job log compaction failed"),
            }
        }
        if stopping {
            return;
        }
    }
}

/// Writes records as JSON lines to `f`, encoded into `buf` and written in
/// pieces of about [`WRITE_BUF`] (serde_json writing straight into a
/// `BufWriter` spends more on the writer's per-call checks than on the
/// JSON). Stops at the first failed write.
fn write_records<'r>(
    f: &mut File,
    buf: &mut Vec<u8>,
    records: impl Iterator<Item = &'r JobRecord>,
) -> std::io::Result<()> {
    buf.clear();
    for (i, rec) in records.enumerate() {
        encode(buf, rec);
        if buf.len() >= WRITE_BUF {
            f.write_all(buf)?;
            buf.clear();
        }
        // Thousands of records are milliseconds of JSON: yield now and
        // then, so the event loops sharing the cores are not held up.
        if i % YIELD_EVERY == YIELD_EVERY - 1 {
            std::thread::yield_now();
        }
    }
    f.write_all(buf)?;
    buf.clear();
    Ok(())
}

/// Appends one record as a JSON line: byte for byte what
/// `serde_json::to_writer` writes for it (a property test holds the two
/// together), written field by field. serde_json scans every key and value
/// a byte at a time for characters to escape, which made the log's writer
/// thread the largest single cost of a request (a sixth of its
/// instructions); here the keys are constants, ids and numbers cannot need
/// escaping, and serde_json writes only the two enums and a string that
/// holds a character to escape.
fn encode(buf: &mut Vec<u8>, rec: &JobRecord) {
    // Destructured so a field added to the record fails to compile here
    // instead of silently missing from the log.
    let JobRecord {
        id,
        model,
        flavor,
        route,
        streaming,
        origin,
        ran_on,
        attempts,
        status,
        http_status,
        created_at_ms,
        ttft_ms,
        duration_ms,
        prompt_tokens,
        output_tokens,
        error,
        recorded_by,
        engine,
        cached_tokens,
        key,
        resumed,
        waited,
    } = rec;
    buf.extend_from_slice(b"{\"id\":");
    json_uuid(buf, id.as_uuid());
    buf.extend_from_slice(b",\"model\":");
    json_str(buf, model);
    buf.extend_from_slice(b",\"flavor\":");
    json_serde(buf, flavor);
    buf.extend_from_slice(b",\"route\":");
    json_str(buf, route);
    buf.extend_from_slice(if *streaming {
        b",\"streaming\":true,\"origin\":"
    } else {
        b",\"streaming\":false,\"origin\":"
    });
    json_uuid(buf, origin.as_uuid());
    buf.extend_from_slice(b",\"ran_on\":");
    json_opt(buf, ran_on.as_ref(), |buf, n| json_uuid(buf, n.as_uuid()));
    buf.extend_from_slice(b",\"attempts\":");
    json_int(buf, *attempts);
    buf.extend_from_slice(b",\"status\":");
    json_serde(buf, status);
    buf.extend_from_slice(b",\"http_status\":");
    json_opt(buf, *http_status, json_int);
    buf.extend_from_slice(b",\"created_at_ms\":");
    json_int(buf, *created_at_ms);
    buf.extend_from_slice(b",\"ttft_ms\":");
    json_opt(buf, *ttft_ms, json_int);
    buf.extend_from_slice(b",\"duration_ms\":");
    json_opt(buf, *duration_ms, json_int);
    buf.extend_from_slice(b",\"prompt_tokens\":");
    json_opt(buf, *prompt_tokens, json_int);
    buf.extend_from_slice(b",\"output_tokens\":");
    json_opt(buf, *output_tokens, json_int);
    buf.extend_from_slice(b",\"error\":");
    json_opt(buf, error.as_deref(), json_str);
    buf.extend_from_slice(b",\"recorded_by\":");
    json_opt(buf, recorded_by.as_ref(), |buf, n| {
        json_uuid(buf, n.as_uuid())
    });
    if let Some(e) = engine {
        buf.extend_from_slice(b",\"engine\":{\"prompt_ms\":");
        json_opt(buf, e.prompt_ms, json_int);
        buf.extend_from_slice(b",\"decode_ms\":");
        json_opt(buf, e.decode_ms, json_int);
        buf.push(b'}');
    }
    if let Some(n) = cached_tokens {
        buf.extend_from_slice(b",\"cached_tokens\":");
        json_int(buf, *n);
    }
    if let Some(k) = key {
        buf.extend_from_slice(b",\"key\":");
        json_str(buf, k);
    }
    if !resumed.is_empty() {
        buf.extend_from_slice(b",\"resumed\":[");
        for (i, r) in resumed.iter().enumerate() {
            if i > 0 {
                buf.push(b',');
            }
            buf.extend_from_slice(b"{\"node\":");
            json_uuid(buf, r.node.as_uuid());
            buf.extend_from_slice(b",\"at_token\":");
            json_int(buf, r.at_token);
            buf.push(b'}');
        }
        buf.push(b']');
    }
    if let Some(w) = waited {
        buf.extend_from_slice(b",\"waited\":{\"ms\":");
        json_int(buf, w.ms);
        buf.extend_from_slice(b",\"why\":");
        json_serde(buf, &w.why);
        buf.push(b'}');
    }
    buf.extend_from_slice(b"}\n");
}

fn json_uuid(buf: &mut Vec<u8>, id: &uuid::Uuid) {
    let mut text = [0u8; uuid::fmt::Hyphenated::LENGTH];
    buf.push(b'"');
    buf.extend_from_slice(id.hyphenated().encode_lower(&mut text).as_bytes());
    buf.push(b'"');
}

fn json_int(buf: &mut Vec<u8>, n: impl itoa::Integer) {
    buf.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

fn json_opt<T>(buf: &mut Vec<u8>, v: Option<T>, write: impl FnOnce(&mut Vec<u8>, T)) {
    match v {
        Some(v) => write(buf, v),
        None => buf.extend_from_slice(b"null"),
    }
}

/// A string as JSON: copied when nothing in it needs escaping (JSON
/// escapes only control characters, `"` and `\\`), else serde_json's.
fn json_str(buf: &mut Vec<u8>, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        buf.push(b'"');
        buf.extend_from_slice(s.as_bytes());
        buf.push(b'"');
    } else {
        json_serde(buf, s);
    }
}

/// A value as serde_json writes it.
fn json_serde(buf: &mut Vec<u8>, v: &(impl serde::Serialize + ?Sized)) {
    if serde_json::to_writer(&mut *buf, v).is_err() {
        // Writing a string or a unit variant into memory cannot fail; a
        // null keeps the line valid JSON if it ever did.
        buf.extend_from_slice(b"null");
    }
}

/// Rewrites the file with just the records kept (`pair_fs::write_atomic`), and
/// returns how many lines it now has. The records are copied out first so
/// the request path never waits for this.
fn compact(path: &Path, inner: &Mutex<Inner>, buf: &mut Vec<u8>) -> std::io::Result<usize> {
    let records: Vec<Arc<JobRecord>> = inner
        .lock()
        .map_err(|_| std::io::Error::other("job log lock poisoned"))?
        .records
        .iter()
        .flatten()
        .cloned()
        .collect();
    pair_fs::write_atomic_with(path, 0o600, |f| {
        write_records(f, buf, records.iter().map(|r| &**r))
    })?;
    Ok(records.len())
}

/// Queues a record for the writer, keeping the newest [`KEEP_RECORDS`].
fn queue_write(inner: &mut Inner, rec: Arc<JobRecord>) {
    if inner.unwritten.len() == KEEP_RECORDS {
        inner.unwritten.pop_front();
    }
    inner.unwritten.push_back(rec);
}

/// Appends a record, dropping the oldest when that makes more than
/// [`KEEP_RECORDS`].
fn append(inner: &mut Inner, rec: Arc<JobRecord>) {
    inner.records.push_back(Some(rec));
    if inner.records.len() > KEEP_RECORDS {
        inner.dropped += 1;
        inner.records.pop_front();
    }
}

/// Takes `records` into the log, in order: of several of one job the one
/// that supersedes the others; one whose job the log holds joins only if it
/// supersedes that record (whose slot is emptied), and goes to the end. The
/// ids may come from peers, so the map is the standard library's (keyed
/// hashing). One pass over the log.
fn upsert(inner: &mut Inner, records: Vec<Arc<JobRecord>>, file_backed: bool) {
    if records.is_empty() {
        return;
    }
    let mut order = Vec::new();
    let mut best: HashMap<JobId, Arc<JobRecord>> = HashMap::with_capacity(records.len());
    for rec in records {
        match best.entry(rec.id) {
            std::collections::hash_map::Entry::Occupied(mut e) => {
                if rec.supersedes(e.get()) {
                    e.insert(rec);
                }
            }
            std::collections::hash_map::Entry::Vacant(e) => {
                order.push(rec.id);
                e.insert(rec);
            }
        }
    }
    for slot in &mut inner.records {
        let Some(held) = slot else { continue };
        if let Some(new) = best.get(&held.id) {
            if new.supersedes(held) {
                *slot = None;
            } else {
                best.remove(&held.id);
            }
        }
    }
    for id in order {
        if let Some(rec) = best.remove(&id) {
            if file_backed {
                queue_write(inner, Arc::clone(&rec));
            }
            append(inner, rec);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pair_core::{ApiFlavor, JobStatus, NodeId};
    use proptest::prelude::*;

    /// A finished job, `n` its id, created at `at`.
    fn rec(n: u128, at: u64) -> JobRecord {
        JobRecord {
            ran_on: Some(NodeId::from_u128(2)),
            created_at_ms: at,
            ttft_ms: Some(5),
            duration_ms: Some(9),
            output_tokens: Some(3),
            ..JobRecord::fixture(n)
        }
    }

    fn record() -> impl Strategy<Value = JobRecord> {
        let text = || prop_oneof![any::<String>(), "[a-z0-9:./_-]{0,24}"];
        let flavor = prop_oneof![
            Just(ApiFlavor::Ollama),
            Just(ApiFlavor::OpenAi),
            Just(ApiFlavor::Anthropic)
        ];
        let status = prop_oneof![
            Just(JobStatus::Queued),
            Just(JobStatus::Running),
            Just(JobStatus::Completed),
            Just(JobStatus::Failed),
            Just(JobStatus::Cancelled)
        ];
        (
            (any::<u128>(), text(), flavor, text(), any::<bool>()),
            (any::<u128>(), any::<Option<u128>>(), any::<u8>(), status),
            (
                any::<Option<u16>>(),
                any::<u64>(),
                any::<[Option<u32>; 4]>(),
            ),
            (
                proptest::option::of(text()),
                any::<Option<u128>>(),
                any::<Option<(Option<u32>, Option<u32>)>>(),
            ),
        )
            .prop_map(|(a, b, c, (error, by, engine))| JobRecord {
                // Any text, some of the time (the key's name).
                key: a.4.then(|| a.3.clone()),
                // A move or two, some of the time.
                resumed: by
                    .map(|n| {
                        let at = u32::try_from(c.1 % 4096).unwrap_or(0);
                        (0..=n % 2)
                            .map(|i| pair_core::Resumption {
                                node: NodeId::from_u128(n ^ i),
                                at_token: at + u32::try_from(i).unwrap_or(0),
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
                // A wait, some of the time.
                waited: c.2[3].filter(|_| a.4).map(|ms| pair_core::JobWait {
                    ms,
                    why: pair_core::WaitReason::SilentOnlyOwner,
                }),
                id: JobId::from_uuid(uuid::Uuid::from_u128(a.0)),
                model: a.1,
                flavor: a.2,
                route: a.3.into(),
                streaming: a.4,
                origin: NodeId::from_u128(b.0),
                ran_on: b.1.map(NodeId::from_u128),
                attempts: b.2,
                status: b.3,
                http_status: c.0,
                created_at_ms: c.1,
                ttft_ms: c.2[0],
                duration_ms: c.2[1],
                prompt_tokens: c.2[2],
                output_tokens: c.2[3],
                error: error.map(Into::into),
                recorded_by: by.map(NodeId::from_u128),
                engine: engine.map(|(prompt_ms, decode_ms)| pair_core::EngineTiming {
                    prompt_ms,
                    decode_ms,
                }),
                cached_tokens: c.2[2].filter(|_| a.4).map(|n| n / 2),
            })
    }

    proptest! {
        /// Two logs that take in the same records of a few jobs, in any
        /// order and batching, end holding the same record of each job.
        #[test]
        fn logs_converge_whatever_order_records_arrive_in(
            recs in proptest::collection::vec((0u128..4, 0usize..3, 1u128..3), 1..12),
            split in any::<proptest::sample::Index>(),
            seed in any::<u64>(),
        ) {
            let statuses = [JobStatus::Running, JobStatus::Completed, JobStatus::Failed];
            let all: Vec<JobRecord> = recs
                .iter()
                .map(|&(id, st, by)| JobRecord {
                    status: statuses[st],
                    recorded_by: Some(NodeId::from_u128(by)),
                    ..rec(id, 0)
                })
                .collect();
            let a = JobLog::in_memory();
            for r in &all {
                a.merge([r.clone()]);
            }
            // The other log: reversed, shuffled by the seed, in two batches.
            let mut shuffled = all.clone();
            shuffled.reverse();
            let k = (seed as usize) % shuffled.len();
            shuffled.rotate_left(k);
            let at = split.index(shuffled.len() + 1);
            let b = JobLog::in_memory();
            b.merge(shuffled[..at].to_vec());
            b.merge(shuffled[at..].to_vec());
            let held = |log: &JobLog| {
                let mut v = log.recent(usize::MAX);
                v.sort_by_key(|r| r.id.as_uuid().as_u128());
                v
            };
            prop_assert_eq!(held(&a), held(&b));
            prop_assert_eq!(a.len(), recs.iter().map(|r| r.0).collect::<std::collections::HashSet<_>>().len());
        }

        /// The log's own encoder writes exactly serde_json's line, so the
        /// file reads back with serde and stays what other tools expect.
        #[test]
        fn encode_writes_what_serde_json_writes(rec in record()) {
            let mut line = Vec::new();
            encode(&mut line, &rec);
            let mut want = serde_json::to_vec(&rec).unwrap();
            want.push(b'\n');
            prop_assert_eq!(String::from_utf8_lossy(&line), String::from_utf8_lossy(&want));
            prop_assert_eq!(serde_json::from_slice::<JobRecord>(&line).unwrap(), rec);
        }
    }

    #[test]
    fn encode_escapes_what_json_requires() {
        let mut r = rec(1, 0);
        r.model = "a\"b\\c\nd\u{1}é\u{7f}".into();
        r.error = Some("tab\there".into());
        let mut line = Vec::new();
        encode(&mut line, &r);
        let text = String::from_utf8(line).unwrap();
        assert!(
            text.contains("\"model\":\"a\\\"b\\\\c\\nd\\u0001é\u{7f}\""),
            "{text}"
        );
        assert!(text.contains(r#""error":"tab\there""#), "{text}");
        assert_eq!(serde_json::from_str::<JobRecord>(&text).unwrap(), r);
    }

    #[test]
    fn replication_reads_in_order_and_moves_on_only_when_told() {
        let ids = |v: Vec<Arc<JobRecord>>| -> Vec<u128> {
            v.iter().map(|r| r.id.as_uuid().as_u128()).collect()
        };
        let log = JobLog::in_memory();
        for i in 1..=4 {
            log.record(rec(i, 0));
        }
        let (got, next) = log.after(0, 3);
        assert_eq!((ids(got), next), (vec![1, 2, 3], 3));
        // Not acknowledged: the same batch again.
        assert_eq!(ids(log.after(0, 3).0), vec![1, 2, 3]);
        let (got, cursor) = log.after(next, 10);
        assert_eq!((ids(got), cursor), (vec![4], 4));
        assert_eq!(log.after(cursor, 10), (Vec::new(), 4));
        // A record that supersedes one already sent goes to the end and
        // is sent again; its old slot is passed over.
        let mut longer = rec(2, 0);
        longer.attempts = 2;
        log.merge([longer]);
        let (got, cursor) = log.after(cursor, 10);
        assert_eq!((ids(got), cursor), (vec![2], 5));
        assert_eq!(ids(log.after(0, 10).0), vec![1, 3, 4, 2]);
        // A cursor older than the log starts at its oldest record.
        for i in 0..(KEEP_RECORDS as u128 + 10) {
            log.record(rec(100 + i, 0));
        }
        let (got, _) = log.after(0, 1);
        assert!(ids(got)[0] >= 100);
    }

    #[test]
    fn keeps_the_newest_and_moves_a_superseding_record_to_the_end() {
        let log = JobLog::in_memory();
        for i in 0..(KEEP_RECORDS as u128 + 5) {
            let mut r = rec(i, 0);
            // As the node that ran them wrote them.
            r.recorded_by = Some(NodeId::from_u128(2));
            log.record(r);
        }
        assert_eq!(log.len(), KEEP_RECORDS);
        assert!(
            log.get(JobId::from_uuid(uuid::Uuid::from_u128(0)))
                .is_none()
        );
        let id = KEEP_RECORDS as u128 + 4;
        // A peer's batch: the origin's own record of a held job (it wins
        // over the runner's), a replay of it still running (it never
        // wins), and a new record.
        let mut origin_s = rec(id, 0);
        origin_s.status = JobStatus::Failed;
        let mut replay = origin_s.clone();
        replay.status = JobStatus::Running;
        log.merge([replay.clone(), origin_s, rec(KEEP_RECORDS as u128 + 5, 0)]);
        // The emptied slot counts until it leaves the front.
        assert_eq!(log.len(), KEEP_RECORDS - 1);
        let recent = log.recent(2);
        assert_eq!(
            recent[0].id,
            JobId::from_uuid(uuid::Uuid::from_u128(KEEP_RECORDS as u128 + 5))
        );
        assert_eq!(recent[1].id, JobId::from_uuid(uuid::Uuid::from_u128(id)));
        assert_eq!(recent[1].status, JobStatus::Failed, "moved to the end");
        // A late replay of the running state changes nothing.
        log.merge([replay]);
        assert_eq!(
            log.get(recent[1].id).map(|r| r.status),
            Some(JobStatus::Failed)
        );
        assert_eq!(log.recent(1)[0].id, recent[0].id, "nothing appended");
    }

    #[test]
    fn the_writer_compacts_the_file_it_grows() {
        let dir = tempfile::tempdir().unwrap();
        {
            let log = JobLog::open_with_turn(dir.path(), 0, Duration::from_millis(10)).unwrap();
            // In bursts the writer writes whole (see below for larger ones).
            for burst in 0..(COMPACT_AT as u128 / 5000 + 1) {
                for i in 0..5000 {
                    log.record(rec(burst * 5000 + i, 0));
                }
                let t = std::time::Instant::now();
                while !log.shared.gather().unwrap().unwritten.is_empty() {
                    assert!(t.elapsed() < Duration::from_secs(30), "writer stuck");
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
        let text = std::fs::read_to_string(dir.path().join("jobs.jsonl")).unwrap();
        let lines = text.lines().count();
        assert!(
            (KEEP_RECORDS..=KEEP_RECORDS + 5000).contains(&lines),
            "compacted to the kept records plus what came after: {lines}"
        );
        let log = JobLog::open(dir.path(), 0).unwrap();
        assert_eq!(log.len(), KEEP_RECORDS);
    }

    #[test]
    fn a_turn_writes_only_the_newest_records_it_could_keep() {
        let dir = tempfile::tempdir().unwrap();
        let burst = KEEP_RECORDS as u128 + 2500;
        {
            // One turn that never comes before the stop: the whole burst is
            // unwritten when the log is dropped.
            let log = JobLog::open_with_turn(dir.path(), 0, Duration::from_secs(3600)).unwrap();
            for i in 0..burst {
                log.record(rec(i, 0));
            }
            assert_eq!(log.shared.gather().unwrap().unwritten.len(), KEEP_RECORDS);
        }
        let text = std::fs::read_to_string(dir.path().join("jobs.jsonl")).unwrap();
        assert_eq!(
            text.lines().count(),
            KEEP_RECORDS,
            "the stop wrote the newest only"
        );
        let log = JobLog::open(dir.path(), 0).unwrap();
        assert_eq!(log.len(), KEEP_RECORDS);
        let newest = log.recent(1)[0].id;
        assert_eq!(newest, JobId::from_uuid(uuid::Uuid::from_u128(burst - 1)));
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

    /// Records made on three event loops at once reach the log when it is
    /// read, in the order their jobs ended, each once; replication's cursor
    /// sees them all.
    #[tokio::test]
    async fn records_staged_on_every_loop_are_read_in_order_of_ending() {
        let log = Arc::new(JobLog::in_memory());
        let cursor = log.end();
        let loops = pair_runtime::runtime::EventLoops::start(3).unwrap();
        let tasks: Vec<_> = (0..6u64)
            .map(|c| {
                let log = Arc::clone(&log);
                loops.spawn_on(usize::try_from(c).unwrap(), async move {
                    // Task c's jobs end at c, c + 6, c + 12, ...: the
                    // loops' lists interleave.
                    for k in 0..50u64 {
                        let mut r = rec(u128::from(c * 1000 + k), c + 6 * k);
                        r.duration_ms = Some(0);
                        log.record(r);
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        loops.shutdown(std::time::Duration::from_secs(5)).await;
        let per_loop = log
            .shared
            .staged
            .iter()
            .filter(|s| !s.lock().unwrap().is_empty())
            .count();
        assert!(
            per_loop > 1 || pair_runtime::per_loop::slots() == 1,
            "staged on one loop only"
        );
        assert_eq!(log.len(), 300);
        let ended: Vec<u64> = log
            .recent(300)
            .iter()
            .rev()
            .map(|r| r.created_at_ms)
            .collect();
        assert_eq!(ended, (0..300).collect::<Vec<_>>());
        let (got, next) = log.after(cursor, 1000);
        assert_eq!((got.len(), next), (300, cursor + 300));
        assert!(
            log.shared
                .staged
                .iter()
                .all(|s| s.lock().unwrap().is_empty())
        );
    }

    /// A log nobody reads still holds at most [`STAGE_MAX`] staged records
    /// per loop: a full list moves into the log itself.
    #[test]
    fn an_unread_log_moves_a_full_stage_in_itself() {
        let log = JobLog::in_memory();
        for i in 0..=(STAGE_MAX as u128) {
            log.record(rec(i, 0));
            let staged = log.shared.staged.local().lock().unwrap().len();
            assert!(staged < STAGE_MAX, "{staged} staged");
        }
        assert_eq!(log.shared.staged.local().lock().unwrap().len(), 1);
        assert_eq!(
            log.shared.inner.lock().unwrap().records.len(),
            STAGE_MAX.min(KEEP_RECORDS)
        );
        assert_eq!(log.len(), (STAGE_MAX + 1).min(KEEP_RECORDS));
        let newest = log.recent(1)[0].id;
        assert_eq!(
            newest,
            JobId::from_uuid(uuid::Uuid::from_u128(STAGE_MAX as u128))
        );
    }
}
