//! Workload generators: when requests arrive and what they ask for.
//!
//! Each source, and each closed-loop user, draws from its own seeded RNG
//! stream, so the demand is the same whatever the routing policy does: two
//! policies are compared on the same requests (closed-loop users send the
//! same sequence; only its timing follows the service they get).

use pair_core::SessionKey;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::dist::{exponential, unit_open};
use crate::scenario::{Micros, Source, SourceKind, US_PER_MS, US_PER_S};

/// One request as the client sends it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Demand {
    pub source: u16,
    pub model: u16,
    /// Tokens the engine must prefill (whole context for multi-turn chats).
    pub prompt_tokens: u32,
    /// Tokens the engine will generate.
    pub output_tokens: u32,
    /// What the router is told to expect (the client's max, or the API
    /// default when it sets none).
    pub declared_output: u32,
    pub streaming: bool,
    pub session: Option<SessionKey>,
    /// The closed-loop user waiting for this answer.
    pub user: Option<u32>,
    /// The agent job (one fan-out burst of its source) this sub-task is
    /// part of.
    pub burst: Option<u32>,
}

/// Mixes a seed with stream identifiers (SplitMix64 finaliser), so each
/// source and user gets an independent, reproducible stream.
pub fn stream_seed(seed: u64, a: u64, b: u64) -> u64 {
    let mut z = seed
        ^ a.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ b.wrapping_mul(0xD1B5_4A32_D192_ED03).rotate_left(17);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A closed-loop user's conversation state.
#[derive(Clone, Debug)]
struct User {
    rng: ChaCha8Rng,
    /// Context carried into the next turn.
    context: u32,
    turns_left: u32,
    conversation: u64,
}

/// Generator state of one source.
#[derive(Clone, Debug)]
pub struct SourceState {
    index: u16,
    rng: ChaCha8Rng,
    /// Bursty sources: in a burst, and when that flips.
    bursting: bool,
    flip_at: Micros,
    users: Vec<User>,
    /// Agent jobs started so far (their ids).
    bursts: u32,
}

impl SourceState {
    pub fn new(seed: u64, index: usize, source: &Source) -> Self {
        let index16 = u16::try_from(index).unwrap_or(u16::MAX);
        let mut rng = ChaCha8Rng::seed_from_u64(stream_seed(seed, 1 + index as u64, 0));
        let users = match source.kind {
            SourceKind::ClosedLoop { users, .. } => (0..users)
                .map(|u| User {
                    rng: ChaCha8Rng::seed_from_u64(stream_seed(
                        seed,
                        1 + index as u64,
                        1 + u64::from(u),
                    )),
                    context: 0,
                    turns_left: 0,
                    conversation: 0,
                })
                .collect(),
            _ => Vec::new(),
        };
        let flip_at = match source.kind {
            SourceKind::Bursty { mean_gap, .. } => exponential(&mut rng, mean_gap as f64) as Micros,
            _ => Micros::MAX,
        };
        Self {
            index: index16,
            rng,
            bursting: false,
            flip_at,
            users,
            bursts: 0,
        }
    }

    /// For open-loop sources: the next arrival after `now` (None for
    /// closed-loop sources, whose users wake themselves).
    pub fn next_arrival(&mut self, source: &Source, now: Micros) -> Option<Micros> {
        let rate_at = |bursting: bool| match source.kind {
            SourceKind::Poisson { rate_per_s } => rate_per_s,
            SourceKind::Bursty {
                rate_per_s,
                burst_rate_per_s,
                ..
            } => {
                if bursting {
                    burst_rate_per_s
                } else {
                    rate_per_s
                }
            }
            SourceKind::Agents { bursts_per_s, .. } => bursts_per_s,
            SourceKind::ClosedLoop { .. } => 0.0,
        };
        if matches!(source.kind, SourceKind::ClosedLoop { .. }) {
            return None;
        }
        let mut t = now;
        loop {
            let rate = rate_at(self.bursting);
            let gap = exponential(&mut self.rng, US_PER_S as f64 / rate).max(1.0) as Micros;
            let next = t.saturating_add(gap);
            if next < self.flip_at {
                return Some(next);
            }
            // The rate changes before the next arrival: memorylessness lets
            // us restart the draw at the switch with the new rate.
            t = self.flip_at;
            self.bursting = !self.bursting;
            if let SourceKind::Bursty {
                mean_gap,
                mean_burst,
                ..
            } = source.kind
            {
                let mean = if self.bursting { mean_burst } else { mean_gap };
                self.flip_at =
                    t.saturating_add(exponential(&mut self.rng, mean as f64).max(1.0) as Micros);
            }
        }
    }

    /// Requests arriving at one open-loop arrival instant (agents fan out).
    pub fn open_loop_batch(&mut self, source: &Source, out: &mut Vec<Demand>) {
        let n = match &source.kind {
            SourceKind::Agents { fan_out, .. } => fan_out.sample_count(&mut self.rng, 1),
            _ => 1,
        };
        let burst = matches!(source.kind, SourceKind::Agents { .. }).then(|| {
            self.bursts = self.bursts.wrapping_add(1);
            self.bursts
        });
        for _ in 0..n {
            let mut d = draw(&mut self.rng, source, self.index, 0, None, None);
            d.burst = burst;
            out.push(d);
        }
    }

    /// Closed-loop users in this source.
    pub fn users(&self) -> u32 {
        u32::try_from(self.users.len()).unwrap_or(u32::MAX)
    }

    /// A closed-loop user's first wake-up: a random phase within one think
    /// time, so users do not all start in the same microsecond.
    pub fn first_wake(&mut self, source: &Source, user: u32) -> Micros {
        match (&source.kind, self.users.get_mut(user as usize)) {
            (SourceKind::ClosedLoop { think_ms, .. }, Some(u)) => {
                (think_ms.sample(&mut u.rng) * US_PER_MS as f64 * unit_open(&mut u.rng)) as Micros
            }
            _ => 0,
        }
    }

    /// The next request of a closed-loop user.
    pub fn user_request(&mut self, source: &Source, user: u32) -> Option<Demand> {
        let SourceKind::ClosedLoop {
            turns,
            context_limit,
            ..
        } = &source.kind
        else {
            return None;
        };
        let index = self.index;
        let u = self.users.get_mut(user as usize)?;
        let Some(turns) = turns else {
            return Some(draw(&mut u.rng, source, index, 0, None, Some(user)));
        };
        if u.turns_left == 0 {
            u.turns_left = turns.sample_count(&mut u.rng, 1);
            u.context = 0;
            u.conversation += 1;
        }
        let session = SessionKey(stream_seed(
            u64::from(index),
            u64::from(user),
            u.conversation,
        ));
        let mut d = draw(
            &mut u.rng,
            source,
            index,
            u.context,
            Some(session),
            Some(user),
        );
        if d.prompt_tokens > *context_limit {
            // The chat outgrew its context: the client starts a new one.
            d.prompt_tokens = (d.prompt_tokens - u.context).min(*context_limit);
            u.conversation += 1;
            u.context = 0;
            d.session = Some(SessionKey(stream_seed(
                u64::from(index),
                u64::from(user),
                u.conversation,
            )));
        }
        u.turns_left -= 1;
        // The answer joins the context of the next turn.
        u.context = d.prompt_tokens.saturating_add(d.output_tokens);
        if u.turns_left == 0 {
            u.context = 0;
        }
        Some(d)
    }

    /// Think time before a closed-loop user's next request, in microseconds.
    pub fn think(&mut self, source: &Source, user: u32) -> Micros {
        match (&source.kind, self.users.get_mut(user as usize)) {
            (SourceKind::ClosedLoop { think_ms, .. }, Some(u)) => {
                (think_ms.sample(&mut u.rng) * US_PER_MS as f64) as Micros
            }
            _ => 0,
        }
    }
}

/// Draws one request's model and lengths.
fn draw<R: Rng + ?Sized>(
    rng: &mut R,
    source: &Source,
    index: u16,
    context: u32,
    session: Option<SessionKey>,
    user: Option<u32>,
) -> Demand {
    let model = u16::try_from(source.mix.pick(unit_open(rng))).unwrap_or(0);
    let fresh = source.prompt_tokens.sample_count(rng, 1);
    let mut output = source.output_tokens.sample_count(rng, 1);
    let declared = match source.max_tokens {
        Some(max) => {
            output = output.min(max);
            max
        }
        None => pair_core::RequestProfile::DEFAULT_OUTPUT_TOKENS,
    };
    let streaming = unit_open(rng) <= source.streaming;
    Demand {
        source: index,
        model,
        prompt_tokens: context.saturating_add(fresh),
        output_tokens: output,
        declared_output: declared,
        streaming,
        session,
        user,
        burst: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Scenario;

    const S: &str = r#"
name = "w"
duration_s = 100
slo = { ttft_p95_ms = 1000 }
[[models]]
name = "a"
size_gb = 1
[[models]]
name = "b"
size_gb = 2
[[nodes]]
name = "n"
profile = "rtx4090"
models = ["a", "b"]
[[workload]]
name = "p"
kind = "poisson"
rate_per_s = 10
models = { a = 3, b = 1 }
prompt_tokens = { dist = "fixed", value = 100 }
output_tokens = { dist = "fixed", value = 50 }
max_tokens = 40
[[workload]]
name = "burst"
kind = "bursty"
rate_per_s = 1
burst_rate_per_s = 50
burst_every_s = 10
burst_length_s = 2
prompt_tokens = { dist = "fixed", value = 100 }
output_tokens = { dist = "fixed", value = 50 }
[[workload]]
name = "agents"
kind = "agents"
bursts_per_s = 1
fan_out = { dist = "uniform", min = 2, max = 8 }
prompt_tokens = { dist = "fixed", value = 100 }
output_tokens = { dist = "fixed", value = 50 }
[[workload]]
name = "chat"
kind = "closed-loop"
users = 3
think_ms = { dist = "fixed", value = 1000 }
turns = { dist = "fixed", value = 3 }
context_limit = 100000
prompt_tokens = { dist = "fixed", value = 100 }
output_tokens = { dist = "fixed", value = 50 }
"#;

    #[test]
    fn poisson_rate_and_model_mix() {
        let s = Scenario::parse(S).unwrap();
        let src = &s.sources[0];
        let mut st = SourceState::new(1, 0, src);
        let mut t = 0;
        let mut n = 0u32;
        let mut batch = Vec::new();
        while let Some(next) = st.next_arrival(src, t) {
            if next > 1_000 * US_PER_S {
                break;
            }
            t = next;
            n += 1;
            st.open_loop_batch(src, &mut batch);
        }
        assert!((9_500..10_500).contains(&n), "n {n}");
        let a = batch.iter().filter(|d| d.model == 0).count() as f64 / batch.len() as f64;
        assert!((0.72..0.78).contains(&a), "share of a {a}");
        assert!(
            batch
                .iter()
                .all(|d| d.output_tokens == 40 && d.declared_output == 40)
        );
    }

    #[test]
    fn bursty_source_alternates_rates() {
        let s = Scenario::parse(S).unwrap();
        let src = &s.sources[1];
        let mut st = SourceState::new(1, 1, src);
        let mut t = 0;
        let mut n = 0u32;
        while let Some(next) = st.next_arrival(src, t) {
            if next > 1_000 * US_PER_S {
                break;
            }
            t = next;
            n += 1;
        }
        // 1/6 of the time at 50/s, 5/6 at 1/s: about 9.2/s on average.
        assert!((6_000..13_000).contains(&n), "n {n}");
    }

    #[test]
    fn agents_fan_out() {
        let s = Scenario::parse(S).unwrap();
        let src = &s.sources[2];
        let mut st = SourceState::new(1, 2, src);
        let mut sizes = Vec::new();
        for _ in 0..200 {
            let mut b = Vec::new();
            st.open_loop_batch(src, &mut b);
            sizes.push(b.len());
        }
        assert!(sizes.iter().all(|n| (2..=8).contains(n)));
        assert!(sizes.iter().any(|n| *n >= 6));
    }

    #[test]
    fn multi_turn_context_grows_within_a_session() {
        let s = Scenario::parse(S).unwrap();
        let src = &s.sources[3];
        let mut st = SourceState::new(1, 3, src);
        let turns: Vec<Demand> = (0..6).map(|_| st.user_request(src, 1).unwrap()).collect();
        let prompts: Vec<u32> = turns.iter().map(|d| d.prompt_tokens).collect();
        assert_eq!(prompts, vec![100, 250, 400, 100, 250, 400]);
        assert_eq!(turns[0].session, turns[2].session);
        assert_ne!(turns[2].session, turns[3].session);
        assert!(turns.iter().all(|d| d.user == Some(1)));
        assert_eq!(turns[0].declared_output, 256);
    }

    #[test]
    fn users_draw_independent_reproducible_streams() {
        let s = Scenario::parse(S).unwrap();
        let src = &s.sources[3];
        let mut a = SourceState::new(9, 3, src);
        let mut b = SourceState::new(9, 3, src);
        // Interleaving users differently does not change any user's stream.
        let a0 = a.think(src, 0);
        let _ = a.think(src, 1);
        let _ = b.think(src, 1);
        assert_eq!(b.think(src, 0), a0);
    }
}
