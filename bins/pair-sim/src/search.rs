//! Users at SLO: the largest number of closed-loop users whose p95 TTFT
//! stays within the SLO, found by galloping then bisecting.
//!
//! The search is generic over the probe so it can be tested against known
//! predicates. Each probe of the simulator is a full seeded run, so probes
//! are memoised: the same user count is never simulated twice.

use std::collections::BTreeMap;

use serde::Serialize;

/// One probe: how many users, what p95 TTFT they saw, and whether it passed.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Probe {
    pub users: u32,
    pub ttft_p95_ms: f64,
    pub e2e_p95_ms: f64,
    pub pass: bool,
}

/// The search's answer and every probe it made, sorted by users.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SearchOutcome {
    pub users_at_slo: u32,
    /// The search stopped at its upper bound while still passing.
    pub capped: bool,
    pub probes: Vec<Probe>,
}

/// Finds `r` with `pass(r)` and `!pass(r + 1)` (0 when one user already
/// fails, `max` when `max` still passes). For a monotone predicate that is
/// the unique threshold; for a noisy one it is a boundary the probes
/// actually saw, never a value contradicted by its own neighbour.
pub fn users_at_slo<E>(
    max: u32,
    mut probe: impl FnMut(u32) -> Result<Probe, E>,
) -> Result<SearchOutcome, E> {
    let mut seen: BTreeMap<u32, Probe> = BTreeMap::new();
    let mut pass = |u: u32, seen: &mut BTreeMap<u32, Probe>| -> Result<bool, E> {
        if let Some(p) = seen.get(&u) {
            return Ok(p.pass);
        }
        let p = probe(u)?;
        seen.insert(u, p);
        Ok(p.pass)
    };
    let max = max.max(1);
    let (answer, capped) = 'search: {
        if !pass(1, &mut seen)? {
            break 'search (0, false);
        }
        // Gallop: double while passing.
        let mut lo = 1u32;
        let hi = loop {
            let next = lo.saturating_mul(2).min(max);
            if next == lo {
                break 'search (lo, true);
            }
            if pass(next, &mut seen)? {
                lo = next;
            } else {
                break next;
            }
        };
        // Bisect: pass(lo), !pass(hi).
        let (mut lo, mut hi) = (lo, hi);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if pass(mid, &mut seen)? {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        (lo, false)
    };
    Ok(SearchOutcome {
        users_at_slo: answer,
        capped,
        probes: seen.into_values().collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::convert::Infallible;

    fn probe_of(pass: impl Fn(u32) -> bool) -> impl FnMut(u32) -> Result<Probe, Infallible> {
        move |users| {
            Ok(Probe {
                users,
                ttft_p95_ms: f64::from(users),
                e2e_p95_ms: 0.0,
                pass: pass(users),
            })
        }
    }

    #[test]
    fn edges() {
        let none = users_at_slo(100, probe_of(|_| false)).unwrap();
        assert_eq!((none.users_at_slo, none.capped), (0, false));
        let all = users_at_slo(100, probe_of(|_| true)).unwrap();
        assert_eq!((all.users_at_slo, all.capped), (100, true));
        let one = users_at_slo(1, probe_of(|_| true)).unwrap();
        assert_eq!(one.users_at_slo, 1);
    }

    proptest! {
        #[test]
        fn monotone_predicate_gives_its_threshold(t in 0u32..2_000, max in 1u32..2_000) {
            let mut calls = 0;
            let out = users_at_slo(max, |u| { calls += 1; probe_of(|u| u <= t)(u) }).unwrap();
            prop_assert_eq!(out.users_at_slo, t.min(max));
            // Galloping plus bisection: logarithmic, and each count once.
            prop_assert!(calls <= 2 * (32 - max.leading_zeros()) + 2, "calls {}", calls);
            let mut users: Vec<u32> = out.probes.iter().map(|p| p.users).collect();
            users.dedup();
            prop_assert_eq!(users.len(), out.probes.len());
        }

        #[test]
        fn any_predicate_gives_a_consistent_boundary(bits in proptest::collection::vec(any::<bool>(), 1..300)) {
            let max = bits.len() as u32;
            let pass = |u: u32| bits[(u - 1) as usize];
            let out = users_at_slo(max, probe_of(pass)).unwrap();
            let r = out.users_at_slo;
            if r == 0 {
                prop_assert!(!pass(1));
            } else {
                prop_assert!(pass(r));
                if r < max {
                    prop_assert!(!pass(r + 1));
                }
            }
            // Every probe the outcome lists agrees with the predicate.
            for p in &out.probes {
                prop_assert_eq!(p.pass, pass(p.users));
            }
        }
    }
}
