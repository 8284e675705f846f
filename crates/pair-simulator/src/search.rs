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
    /// Some smaller user count failed the SLO although this one passes
    /// (p95 is not monotone in load for policies that send light traffic to
    /// slow nodes).
    pub fails_below: bool,
    pub probes: Vec<Probe>,
}

/// Finds the largest user count that passes, as far as the probes can tell:
/// gallop (1, 2, 4, ...) until, after some count passed, two doublings in a
/// row fail (the cluster is saturated) or `max` is reached; then bisect
/// between the largest passing probe and the failing probe above it.
///
/// The answer `r` passes and `r + 1` fails (0: nothing probed passed; `max`:
/// `max` passes), and no probed count above `r` passes. Low counts may fail
/// while `r` passes; [`SearchOutcome::fails_below`] says so.
///
/// `known` are probes already made (for example a common sweep): they are
/// not repeated, and a passing one above the gallop's answer is refined too.
pub fn users_at_slo<E>(
    max: u32,
    known: &[Probe],
    mut probe: impl FnMut(u32) -> Result<Probe, E>,
) -> Result<SearchOutcome, E> {
    let mut seen: BTreeMap<u32, Probe> = known.iter().map(|p| (p.users, *p)).collect();
    let mut pass = |u: u32, seen: &mut BTreeMap<u32, Probe>| -> Result<bool, E> {
        if let Some(p) = seen.get(&u) {
            return Ok(p.pass);
        }
        let p = probe(u)?;
        seen.insert(u, p);
        Ok(p.pass)
    };
    let max = max.max(1);
    // Gallop.
    let mut u = 1u32;
    let mut passed_once = false;
    let mut fails_in_a_row = 0;
    loop {
        if pass(u, &mut seen)? {
            passed_once = true;
            fails_in_a_row = 0;
        } else {
            fails_in_a_row += 1;
        }
        if u == max || (passed_once && fails_in_a_row >= 2) {
            break;
        }
        u = u.saturating_mul(2).min(max);
    }
    let best_pass = seen
        .values()
        .filter(|p| p.pass && p.users <= max)
        .map(|p| p.users)
        .max();
    let (answer, capped) = match best_pass {
        None => (0, false),
        Some(lo) if lo == max => (max, true),
        Some(lo) => {
            // The smallest failing probe above the best pass bounds the
            // bisection; the gallop guarantees one exists.
            let mut hi = seen
                .range(lo + 1..)
                .find(|(_, p)| !p.pass)
                .map_or(max, |(u, _)| *u);
            let mut lo = lo;
            while hi - lo > 1 {
                let mid = lo + (hi - lo) / 2;
                if pass(mid, &mut seen)? {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            (lo, false)
        }
    };
    let fails_below = seen.range(..answer).any(|(_, p)| !p.pass);
    Ok(SearchOutcome {
        users_at_slo: answer,
        capped,
        fails_below,
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
        let none = users_at_slo(100, &[], probe_of(|_| false)).unwrap();
        assert_eq!((none.users_at_slo, none.capped), (0, false));
        let all = users_at_slo(100, &[], probe_of(|_| true)).unwrap();
        assert_eq!((all.users_at_slo, all.capped), (100, true));
        let one = users_at_slo(1, &[], probe_of(|_| true)).unwrap();
        assert_eq!(one.users_at_slo, 1);
        // Fails at light load (a slow node gets the idle traffic), passes
        // under load, saturates later: the answer is the upper boundary.
        let bumpy = users_at_slo(1000, &[], probe_of(|u| (20..=90).contains(&u))).unwrap();
        assert_eq!(bumpy.users_at_slo, 90);
        assert!(bumpy.fails_below);
        // A pass the gallop cannot see (between powers of two) is found
        // when a sweep probed it.
        let island = |u: u32| (20..=30).contains(&u);
        let blind = users_at_slo(1000, &[], probe_of(island)).unwrap();
        assert_eq!(blind.users_at_slo, 0);
        let sweep: Vec<Probe> = [10, 25, 40]
            .iter()
            .map(|&u| probe_of(island)(u).unwrap())
            .collect();
        let seen = users_at_slo(1000, &sweep, probe_of(island)).unwrap();
        assert_eq!(seen.users_at_slo, 30);
    }

    proptest! {
        #[test]
        fn monotone_predicate_gives_its_threshold(t in 0u32..2_000, max in 1u32..2_000) {
            let mut calls = 0;
            let out = users_at_slo(max, &[], |u| { calls += 1; probe_of(|u| u <= t)(u) }).unwrap();
            prop_assert_eq!(out.users_at_slo, t.min(max));
            // Galloping plus bisection: logarithmic, and each count once.
            prop_assert!(calls <= 2 * (32 - max.leading_zeros()) + 3, "calls {}", calls);
            prop_assert!(!out.fails_below);
            let mut users: Vec<u32> = out.probes.iter().map(|p| p.users).collect();
            users.dedup();
            prop_assert_eq!(users.len(), out.probes.len());
        }

        #[test]
        fn any_predicate_gives_a_consistent_boundary(bits in proptest::collection::vec(any::<bool>(), 1..300)) {
            let max = bits.len() as u32;
            let pass = |u: u32| bits[(u - 1) as usize];
            let out = users_at_slo(max, &[], probe_of(pass)).unwrap();
            let r = out.users_at_slo;
            if r == 0 {
                prop_assert!(!pass(1));
            } else {
                prop_assert!(pass(r));
                if r < max {
                    prop_assert!(!pass(r + 1));
                }
            }
            // Every probe the outcome lists agrees with the predicate, and
            // none above the answer passed.
            for p in &out.probes {
                prop_assert_eq!(p.pass, pass(p.users));
                if p.users > r {
                    prop_assert!(!p.pass);
                }
            }
        }
    }
}
