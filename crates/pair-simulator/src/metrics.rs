//! Per-request records and their summaries: exact percentiles (by sorting),
//! throughput, per-node shares of requests and of SLO misses.

use serde::Serialize;

use crate::scenario::{Micros, US_PER_MS, US_PER_S};

/// What happened to one measured request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    pub arrival: Micros,
    /// Node index; `None` when no node could take it.
    pub node: Option<u16>,
    pub source: u16,
    /// Time to first token as the client sees it (network included).
    pub ttft: Micros,
    /// Whole answer as the client sees it.
    pub e2e: Micros,
    /// Waiting for a slot on the engine.
    pub queue: Micros,
    pub output_tokens: u32,
    pub cold: bool,
    /// The prompt's tokens, those its node held cached at dispatch, and
    /// the most any node that holds the model held (an oracle placement).
    pub prompt_tokens: u32,
    pub cached_tokens: u32,
    pub oracle_tokens: u32,
}

/// p50/p95/p99 (nearest rank), mean and max, in milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Percentiles {
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub mean_ms: f64,
    pub max_ms: f64,
}

impl Percentiles {
    /// Sorts `values` (microseconds) in place and summarises them.
    pub fn of(values: &mut [Micros]) -> Percentiles {
        if values.is_empty() {
            return Percentiles::default();
        }
        values.sort_unstable();
        let sum: u128 = values.iter().map(|v| u128::from(*v)).sum();
        Percentiles {
            p50_ms: to_ms(nearest_rank(values, 50)),
            p95_ms: to_ms(nearest_rank(values, 95)),
            p99_ms: to_ms(nearest_rank(values, 99)),
            mean_ms: round3(sum as f64 / values.len() as f64 / US_PER_MS as f64),
            max_ms: to_ms(values[values.len() - 1]),
        }
    }
}

/// The nearest-rank percentile of sorted values: the smallest value with at
/// least `pct` % of the values at or below it.
pub fn nearest_rank(sorted: &[Micros], pct: u32) -> Micros {
    if sorted.is_empty() {
        return 0;
    }
    let n = sorted.len();
    let rank = (n * pct as usize).div_ceil(100).clamp(1, n);
    sorted[rank - 1]
}

/// Milliseconds with three decimals (microsecond resolution), so JSON stays
/// short and byte-stable.
pub fn to_ms(us: Micros) -> f64 {
    round3(us as f64 / US_PER_MS as f64)
}

pub fn round3(v: f64) -> f64 {
    (v * 1_000.0).round() / 1_000.0
}

/// One node's part in a run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NodeSummary {
    pub name: String,
    pub profile: String,
    pub requests: u64,
    /// Share of all measured requests, 0..=1.
    pub request_share: f64,
    /// Requests whose TTFT exceeded the miss threshold.
    pub slo_misses: u64,
    /// Share of all SLO misses, 0..=1.
    pub miss_share: f64,
    /// Busy (prefilling or decoding) share of the run, 0..=1.
    pub utilisation: f64,
    pub ttft_p95_ms: f64,
    pub cold_starts: u64,
}

/// One workload source's requests in a run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SourceSummary {
    pub name: String,
    pub requests: u64,
    pub ttft: Percentiles,
    pub e2e: Percentiles,
}

/// Summary of one simulated run under one policy.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunSummary {
    /// Requests measured (arrived after warm-up and served).
    pub requests: u64,
    /// Every request generated, warm-up included.
    pub generated: u64,
    pub completed: u64,
    pub rejected: u64,
    pub ttft: Percentiles,
    pub e2e: Percentiles,
    pub queue: Percentiles,
    /// Measured requests completed per second over the measured window.
    pub throughput_rps: f64,
    pub output_tokens_per_s: f64,
    pub slo_misses: u64,
    pub simulated_s: f64,
    pub nodes: Vec<NodeSummary>,
    pub sources: Vec<SourceSummary>,
    /// Agent jobs (a fan-out burst of sub-tasks) that started after the
    /// warm-up, when a source has them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fan_out: Option<FanOutSummary>,
    /// Later turns of multi-turn conversations, when a source has them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub turns: Option<TurnSummary>,
    /// Prompt tokens served from engines' caches, when any node held any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheSummary>,
}

/// Prompt tokens of the measured requests, those their node held cached
/// when they were dispatched, and those an oracle placement would have
/// found: per request the most any node holding its model held at that
/// instant (caches as they were under this policy's placements).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct CacheSummary {
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub oracle_tokens: u64,
    /// `cached_tokens / prompt_tokens`.
    pub hit_share: f64,
    /// `cached_tokens / oracle_tokens` (1 when the oracle finds nothing).
    pub of_oracle: f64,
}

/// How many later turns of a conversation ran where its previous turn did
/// (where its prompt cache is).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TurnSummary {
    pub later_turns: u64,
    pub on_previous_node: u64,
}

impl TurnSummary {
    pub fn share(&self) -> f64 {
        if self.later_turns == 0 {
            0.0
        } else {
            self.on_previous_node as f64 / self.later_turns as f64
        }
    }
}

/// Agent jobs from their start to their last sub-task's answer: the
/// makespans of the jobs that started at or after the warm-up.
#[derive(Clone, Debug, Default)]
pub struct Jobs {
    /// In flight, by (source, job): start, ideals, sub-tasks left, latest
    /// sub-task end.
    in_flight: std::collections::HashMap<(u16, u32), (Micros, Ideal, u32, Micros)>,
    done: Vec<FanOut>,
}

impl Jobs {
    /// Job `key` of `tasks` sub-tasks started at `start`, with its ideal
    /// makespans.
    pub fn start(&mut self, key: (u16, u32), start: Micros, ideal: Ideal, tasks: usize) {
        let left = u32::try_from(tasks).unwrap_or(u32::MAX);
        self.in_flight.insert(key, (start, ideal, left, start));
    }

    /// One sub-task of job `key` answered at `at`; a job is kept when its
    /// last one is, if it started at or after `warmup`.
    pub fn part_done(&mut self, key: (u16, u32), at: Micros, warmup: Micros) {
        let Some(job) = self.in_flight.get_mut(&key) else {
            return;
        };
        job.2 = job.2.saturating_sub(1);
        job.3 = job.3.max(at);
        if job.2 == 0 {
            let (start, ideal, _, end) = *job;
            self.in_flight.remove(&key);
            if start >= warmup && ideal.whole_tasks.is_finite() {
                self.done.push(FanOut {
                    job: key,
                    makespan: end - start,
                    ideal,
                });
            }
        }
    }

    /// The finished jobs, in the order they finished.
    pub fn done(&self) -> &[FanOut] {
        &self.done
    }

    /// The summary of the finished jobs, if any.
    pub fn summary(&self) -> Option<FanOutSummary> {
        summarise_fan_out(&self.done)
    }
}

/// Follows conversations turn by turn: where each one's last turn ran.
#[derive(Clone, Debug, Default)]
pub struct Turns {
    last: std::collections::HashMap<pair_core::SessionKey, u16>,
    summary: TurnSummary,
}

impl Turns {
    /// A turn of `session` ran on `node`; counted when `measured`.
    pub fn ran(&mut self, session: pair_core::SessionKey, node: u16, measured: bool) {
        if let Some(prev) = self.last.insert(session, node)
            && measured
        {
            self.summary.later_turns += 1;
            self.summary.on_previous_node += u64::from(prev == node);
        }
    }

    /// The summary, if any later turn was measured.
    pub fn summary(&self) -> Option<TurnSummary> {
        (self.summary.later_turns > 0).then_some(self.summary)
    }
}

/// An agent job's ideal makespans, µs (infinite where no node holds its
/// models): the capacity-weighted one shares its work over the nodes as
/// if sub-tasks could be split; the whole-task one does not split them
/// (`Cluster::ideal_makespan`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ideal {
    pub capacity: f64,
    pub whole_tasks: f64,
    /// The job on the one node that would finish it soonest alone.
    pub alone: f64,
}

/// How long agent jobs took from their start to their last sub-task's end
/// (the makespan), against the capacity-weighted ideal (the job's work
/// shared over every node that holds its model in proportion to speed)
/// and the whole-task ideal (the same with sub-tasks not split).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct FanOutSummary {
    pub jobs: u64,
    pub makespan_p50_ms: f64,
    pub ideal_p50_ms: f64,
    /// Makespan over the capacity-weighted ideal, per job: median and 95th
    /// percentile.
    pub ratio_p50: f64,
    pub ratio_p95: f64,
    pub whole_ideal_p50_ms: f64,
    /// Makespan over the whole-task ideal, per job: median and 95th
    /// percentile.
    pub whole_ratio_p50: f64,
    pub whole_ratio_p95: f64,
    /// The job on the fastest node alone, median, and the makespan over it
    /// per job (median, 95th percentile): below 1 when sharing the job
    /// beat keeping it on one node.
    pub alone_p50_ms: f64,
    pub alone_ratio_p50: f64,
    pub alone_ratio_p95: f64,
}

/// One finished agent job: makespan and ideals, µs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FanOut {
    /// Its source and its number there: the same job in every run of a
    /// scenario's seed (jobs are drawn whole, in order, from their
    /// developer's stream), wherever its sub-agents ran.
    pub job: (u16, u32),
    pub makespan: Micros,
    pub ideal: Ideal,
}

/// The fan-out summary of `jobs`, if there are any.
pub fn summarise_fan_out(jobs: &[FanOut]) -> Option<FanOutSummary> {
    if jobs.is_empty() {
        return None;
    }
    let median = |mut v: Vec<f64>, q: f64| {
        v.sort_by(f64::total_cmp);
        let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
        v[rank - 1]
    };
    let ms = |us: f64| us / 1000.0;
    let ideal_p50_ms =
        |ideal: fn(&Ideal) -> f64| ms(median(jobs.iter().map(|j| ideal(&j.ideal)).collect(), 0.5));
    let ratio = |q: f64, ideal: fn(&Ideal) -> f64| {
        median(
            jobs.iter()
                .map(|j| j.makespan as f64 / ideal(&j.ideal).max(1.0))
                .collect(),
            q,
        )
    };
    let capacity = |i: &Ideal| i.capacity;
    let whole = |i: &Ideal| i.whole_tasks;
    let alone = |i: &Ideal| i.alone;
    Some(FanOutSummary {
        jobs: jobs.len() as u64,
        makespan_p50_ms: ms(median(
            jobs.iter().map(|j| j.makespan as f64).collect(),
            0.5,
        )),
        ideal_p50_ms: ideal_p50_ms(capacity),
        ratio_p50: ratio(0.5, capacity),
        ratio_p95: ratio(0.95, capacity),
        whole_ideal_p50_ms: ideal_p50_ms(whole),
        whole_ratio_p50: ratio(0.5, whole),
        whole_ratio_p95: ratio(0.95, whole),
        alone_p50_ms: ideal_p50_ms(alone),
        alone_ratio_p50: ratio(0.5, alone),
        alone_ratio_p95: ratio(0.95, alone),
    })
}

/// Builds the summary, and the sorted TTFTs (for CDF plots) on request.
pub fn summarise(
    records: &[Record],
    nodes: &[(String, String, f64)],
    sources: &[String],
    miss_threshold: Micros,
    generated: u64,
    completed: u64,
    window: (Micros, Micros),
) -> (RunSummary, Vec<Micros>) {
    let mut ttft: Vec<Micros> = Vec::with_capacity(records.len());
    let mut e2e: Vec<Micros> = Vec::with_capacity(records.len());
    let mut queue: Vec<Micros> = Vec::with_capacity(records.len());
    let mut per_node_ttft: Vec<Vec<Micros>> = vec![Vec::new(); nodes.len()];
    let mut per_node = vec![(0u64, 0u64, 0u64); nodes.len()];
    let mut per_source: Vec<(Vec<Micros>, Vec<Micros>)> =
        vec![(Vec::new(), Vec::new()); sources.len()];
    let mut rejected = 0u64;
    let mut misses = 0u64;
    let mut tokens = 0u64;
    let mut cache = CacheSummary::default();
    for r in records {
        cache.prompt_tokens += u64::from(r.prompt_tokens);
        cache.cached_tokens += u64::from(r.cached_tokens);
        cache.oracle_tokens += u64::from(r.oracle_tokens);
        let Some(n) = r.node else {
            rejected += 1;
            continue;
        };
        ttft.push(r.ttft);
        e2e.push(r.e2e);
        if let Some(src) = per_source.get_mut(usize::from(r.source)) {
            src.0.push(r.ttft);
            src.1.push(r.e2e);
        }
        queue.push(r.queue);
        tokens += u64::from(r.output_tokens);
        let miss = r.ttft > miss_threshold;
        misses += u64::from(miss);
        if let Some(p) = per_node.get_mut(usize::from(n)) {
            p.0 += 1;
            p.1 += u64::from(miss);
            p.2 += u64::from(r.cold);
            per_node_ttft[usize::from(n)].push(r.ttft);
        }
    }
    let served = ttft.len() as u64;
    let span_s = (window.1.saturating_sub(window.0)).max(1) as f64 / US_PER_S as f64;
    let share = |a: u64, b: u64| {
        if b == 0 {
            0.0
        } else {
            round3(a as f64 / b as f64)
        }
    };
    let node_summaries = nodes
        .iter()
        .zip(per_node.iter().zip(per_node_ttft.iter_mut()))
        .map(
            |((name, profile, util), (&(req, miss, cold), t))| NodeSummary {
                name: name.clone(),
                profile: profile.clone(),
                requests: req,
                request_share: share(req, served),
                slo_misses: miss,
                miss_share: share(miss, misses),
                utilisation: round3(*util),
                ttft_p95_ms: {
                    t.sort_unstable();
                    to_ms(nearest_rank(t, 95))
                },
                cold_starts: cold,
            },
        )
        .collect();
    let summary = RunSummary {
        requests: served,
        generated,
        completed,
        rejected,
        ttft: Percentiles::of(&mut ttft),
        e2e: Percentiles::of(&mut e2e),
        queue: Percentiles::of(&mut queue),
        throughput_rps: round3(served as f64 / span_s),
        output_tokens_per_s: round3(tokens as f64 / span_s),
        slo_misses: misses,
        simulated_s: round3(window.1 as f64 / US_PER_S as f64),
        nodes: node_summaries,
        sources: sources
            .iter()
            .zip(per_source.iter_mut())
            .map(|(name, (t, e))| SourceSummary {
                name: name.clone(),
                requests: t.len() as u64,
                ttft: Percentiles::of(t),
                e2e: Percentiles::of(e),
            })
            .collect(),
        fan_out: None,
        turns: None,
        cache: (cache.oracle_tokens > 0 || cache.cached_tokens > 0).then(|| CacheSummary {
            hit_share: share(cache.cached_tokens, cache.prompt_tokens),
            of_oracle: if cache.oracle_tokens == 0 {
                1.0
            } else {
                round3(cache.cached_tokens as f64 / cache.oracle_tokens as f64)
            },
            ..cache
        }),
    };
    (summary, ttft)
}

/// Downsamples a sorted sample into at most `points` (ms, fraction) pairs
/// for a CDF plot; always keeps the first and last value.
pub fn cdf_points(sorted: &[Micros], points: usize) -> Vec<(f64, f64)> {
    let n = sorted.len();
    if n == 0 || points == 0 {
        return Vec::new();
    }
    let step = n.div_ceil(points).max(1);
    let mut out: Vec<(f64, f64)> = (0..n)
        .step_by(step)
        .map(|i| (to_ms(sorted[i]), round3((i + 1) as f64 / n as f64)))
        .collect();
    if out.last().map(|p| p.1) != Some(1.0) {
        out.push((to_ms(sorted[n - 1]), 1.0));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn later_turns_count_whether_they_stayed() {
        use pair_core::SessionKey;
        let mut t = Turns::default();
        assert_eq!(t.summary(), None);
        t.ran(SessionKey(1), 0, true); // a first turn: nothing to compare
        t.ran(SessionKey(2), 1, true);
        t.ran(SessionKey(1), 0, true); // stayed
        t.ran(SessionKey(1), 2, true); // moved
        t.ran(SessionKey(2), 1, false); // stayed, in the warm-up
        let s = t.summary().unwrap();
        assert_eq!((s.later_turns, s.on_previous_node), (2, 1));
        assert!((s.share() - 0.5).abs() < 1e-12);
    }

    #[test]
    fn nearest_rank_matches_the_definition() {
        let v: Vec<Micros> = (1..=100).collect();
        assert_eq!(nearest_rank(&v, 50), 50);
        assert_eq!(nearest_rank(&v, 95), 95);
        assert_eq!(nearest_rank(&v, 99), 99);
        assert_eq!(nearest_rank(&[7], 95), 7);
        assert_eq!(nearest_rank(&[], 95), 0);
        let mut w = vec![3_000, 1_000, 2_000];
        let p = Percentiles::of(&mut w);
        assert_eq!(
            (p.p50_ms, p.p95_ms, p.max_ms, p.mean_ms),
            (2.0, 3.0, 3.0, 2.0)
        );
    }

    #[test]
    fn shares_and_misses_add_up() {
        let rec = |node, ttft| Record {
            arrival: 0,
            node,
            source: 0,
            ttft,
            e2e: ttft * 2,
            queue: 0,
            output_tokens: 10,
            cold: false,
            prompt_tokens: 0,
            cached_tokens: 0,
            oracle_tokens: 0,
        };
        let records = vec![
            rec(Some(0), 100),
            rec(Some(0), 5_000),
            rec(Some(1), 9_000),
            rec(None, 0),
        ];
        let nodes = vec![
            ("a".to_owned(), "rtx4090".to_owned(), 0.5),
            ("b".to_owned(), "laptop".to_owned(), 0.25),
        ];
        let (s, sorted) = summarise(
            &records,
            &nodes,
            &["chat".to_owned()],
            1_000,
            4,
            3,
            (0, US_PER_S),
        );
        assert_eq!(s.sources[0].requests, 3);
        assert_eq!(s.sources[0].ttft.max_ms, 9.0);
        assert_eq!(s.requests, 3);
        assert_eq!(s.rejected, 1);
        assert_eq!(s.slo_misses, 2);
        assert_eq!(s.nodes[0].requests, 2);
        assert_eq!(s.nodes[1].miss_share, 0.5);
        assert_eq!(sorted, vec![100, 5_000, 9_000]);
        assert_eq!(s.throughput_rps, 3.0);
    }

    proptest! {
        #[test]
        fn percentiles_are_ordered_and_within_range(mut v in proptest::collection::vec(0u64..10_000_000, 1..500)) {
            let lo = *v.iter().min().unwrap();
            let hi = *v.iter().max().unwrap();
            let p = Percentiles::of(&mut v);
            prop_assert!(p.p50_ms <= p.p95_ms && p.p95_ms <= p.p99_ms && p.p99_ms <= p.max_ms);
            prop_assert!(p.p50_ms >= to_ms(lo) && p.max_ms == to_ms(hi));
        }

        #[test]
        fn cdf_is_monotone_and_ends_at_one(mut v in proptest::collection::vec(0u64..1_000_000, 1..3_000), pts in 1usize..200) {
            v.sort_unstable();
            let c = cdf_points(&v, pts);
            prop_assert!(c.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1));
            prop_assert_eq!(c.last().map(|p| p.1), Some(1.0));
            prop_assert!(c.len() <= pts + 2);
        }
    }
}
