//! Fuzz target: a peer's job-replication batch, the JSON array of
//! `pair_core::JobRecord` a paired node posts to `/pair/v1/jobs` (decoded
//! by the route with serde_json, as here). Never panics; an accepted batch
//! round-trips (`decode(encode(b)) == b`, and the encoding is canonical);
//! merged into a job log as the route does (`pair_jobs::JobLog::merge`),
//! every job is held once, by a record no record of it in the batch
//! supersedes, and merging the batch again changes nothing.
#![no_main]

use std::collections::HashSet;

use libfuzzer_sys::fuzz_target;
use pair_core::JobRecord;
use pair_jobs::JobLog;

fuzz_target!(|data: &[u8]| {
    let Ok(batch) = serde_json::from_slice::<Vec<JobRecord>>(data) else {
        return;
    };

    let wire = serde_json::to_vec(&batch).expect("a decoded batch encodes");
    let again: Vec<JobRecord> =
        serde_json::from_slice(&wire).unwrap_or_else(|e| panic!("re-encoded batch refused: {e}"));
    assert_eq!(again, batch, "round trip");
    assert_eq!(serde_json::to_vec(&again).unwrap(), wire, "not canonical");

    let log = JobLog::in_memory();
    log.merge(batch.clone());
    let ids: HashSet<_> = batch.iter().map(|r| r.id).collect();
    assert_eq!(log.len(), ids.len(), "one record per job");
    let held: Vec<JobRecord> = batch
        .iter()
        .map(|r| log.get(r.id).expect("a merged job is held"))
        .collect();
    for (rec, kept) in batch.iter().zip(&held) {
        assert!(
            !rec.supersedes(kept),
            "kept {kept:?} though the batch had {rec:?}"
        );
        assert!(batch.contains(kept), "kept a record not in the batch");
    }

    log.merge(batch.clone());
    assert_eq!(log.len(), ids.len(), "merging again added records");
    for (rec, kept) in batch.iter().zip(&held) {
        assert_eq!(
            log.get(rec.id).as_ref(),
            Some(kept),
            "merging again changed a job"
        );
    }
});
