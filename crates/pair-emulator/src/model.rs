//! The engine performance model: one engine on one machine, in virtual time.
//!
//! Pure and event-driven: the caller hands in `now` (microseconds, any epoch)
//! and the model reports what happened up to then. There are no per-token
//! events; something happens only when the set of running sequences changes
//! (a job takes a slot, finishes its prefill, finishes decoding, a model
//! finishes loading). Between events every decoding stream advances linearly
//! at a rate that depends on how many streams decode together, so the
//! simulator can push a million requests through in a second or two.
//!
//! Simplifications, chosen on purpose:
//! - Slots are per engine, not per loaded model (Ollama gives each runner
//!   NUM_PARALLEL slots; with one model loaded, as is usual, it is the same).
//! - Prefill is compute-bound, so prefills running together share it: with
//!   `n` prefilling, each advances at 1/n of its solo speed (the request
//!   overhead is counted as part of that work). Decode slows with the number
//!   of streams decoding together (§4); a prefill does not slow decodes
//!   (llama.cpp mixes prefill chunks into decode steps; not quantified in
//!   docs/engine-figures.md, so left out).
//! - A job whose model is not in memory takes its slot and waits there for
//!   the load, as Ollama's scheduler does. Idle models (no job holding a
//!   slot) are evicted least recently used first when the new one does not
//!   fit. A model larger than all memory still loads when nothing else is
//!   resident (partial CPU offload), at the same rates.

use std::collections::VecDeque;

use pair_core::{PromptChain, Workload};

use crate::cache::{CacheKind, HOST_RESTORE_TOKENS_PER_S, Lease, PromptCache};
use crate::{BatchScaling, EmulatorError, HardwareProfile, ModelRates, ModelSpec};

/// A request as the model sees it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct JobSpec {
    /// Caller's id; must be unique among jobs not yet finished.
    pub id: u64,
    /// Index into the engine's model list ([`EngineModel::model_index`]).
    pub model: usize,
    pub prompt_tokens: u32,
    /// Tokens to generate; 0 for embeddings (the job ends with its prefill).
    pub output_tokens: u32,
    /// The prompt's blocks, for the engine's prompt cache
    /// ([`EngineModel::with_cache`]); [`PromptChain::EMPTY`] caches nothing.
    /// Tokens past the chain's end are never cached.
    pub prompt: PromptChain,
}

/// When one finished job reached each stage, in microseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct JobTiming {
    pub id: u64,
    pub model: usize,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
    /// Prompt tokens the engine's cache held: only the rest were prefilled.
    pub cached_tokens: u32,
    pub submitted_us: u64,
    /// Took a slot.
    pub started_us: u64,
    /// Prefill done; the first token (or the embedding) is ready.
    pub first_token_us: u64,
    pub finished_us: u64,
    /// Its model had to be loaded while it held its slot.
    pub cold: bool,
}

impl JobTiming {
    pub fn ttft_us(&self) -> u64 {
        self.first_token_us - self.submitted_us
    }
    pub fn latency_us(&self) -> u64 {
        self.finished_us - self.submitted_us
    }
    pub fn queued_us(&self) -> u64 {
        self.started_us - self.submitted_us
    }
}

/// How far a job got before [`EngineModel::cut`] took its slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Cut {
    /// Answer tokens it had generated (the first one included).
    pub generated: u32,
    /// When its first token was ready; `None`: it was still prefilling
    /// (or waiting for its model).
    pub first_token_us: Option<u64>,
}

/// Something that happened inside the engine, in time order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EngineEvent {
    /// A job took a slot (its model may still have to load).
    Started {
        id: u64,
        at_us: u64,
    },
    LoadStarted {
        model: usize,
        at_us: u64,
    },
    Loaded {
        model: usize,
        at_us: u64,
    },
    Evicted {
        model: usize,
        at_us: u64,
    },
    FirstToken {
        id: u64,
        at_us: u64,
    },
    Finished(JobTiming),
    /// Removed by [`EngineModel::cancel`] before it finished.
    Cancelled {
        id: u64,
        at_us: u64,
    },
}

/// Whether a model is in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Residency {
    Unloaded,
    Loading { ready_at_us: u64 },
    Loaded,
}

/// One model's state, as [`EngineModel::models`] reports it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ModelStatus<'a> {
    pub index: usize,
    pub spec: &'a ModelSpec,
    pub rates: ModelRates,
    pub residency: Residency,
    /// Last time a job of this model took or left a slot (0: never).
    pub last_used_us: u64,
    /// Jobs of this model holding a slot.
    pub active: u32,
}

#[derive(Clone, Copy, Debug)]
enum Phase {
    /// Holding a slot, waiting for the model to be loaded.
    Waiting,
    /// Prefill (with the request overhead) shares the compute with other
    /// prefills: `base` microseconds of solo work were done by `base_at`.
    Prefill {
        base: f64,
        base_at: u64,
        done_at: u64,
    },
    /// `base` tokens after the first one were generated by `base_at`.
    Decode {
        base: f64,
        base_at: u64,
        finish_at: u64,
    },
}

#[derive(Clone, Debug)]
struct Running {
    spec: JobSpec,
    submitted_us: u64,
    started_us: u64,
    first_token_us: u64,
    cold: bool,
    phase: Phase,
    /// What the prompt cache gave it when it took its slot.
    lease: Lease,
    /// Its prefill is done (the cache holds its whole prompt).
    prefilled: bool,
}

#[derive(Clone, Debug)]
struct ModelState {
    spec: ModelSpec,
    rates: ModelRates,
    residency: Residency,
    last_used_us: u64,
    active: u32,
    /// Tokens per microsecond of one stream decoding alone.
    decode_per_us: f64,
}

/// One engine on one machine. See the module docs.
#[derive(Clone, Debug)]
pub struct EngineModel {
    scaling: BatchScaling,
    slots: u32,
    memory_bytes: u64,
    models: Vec<ModelState>,
    queue: VecDeque<(JobSpec, u64)>,
    running: Vec<Running>,
    decoding: u32,
    prefilling: u32,
    now_us: u64,
    pending: Vec<EngineEvent>,
    busy_since: Option<u64>,
    busy_total_us: u64,
    queued_prompt_tokens: u64,
    queued_output_tokens: u64,
    /// Idle time after which a loaded model is unloaded (Ollama's
    /// keep_alive); `None`: models stay until evicted.
    keep_alive_us: Option<u64>,
    /// Jobs allowed to wait for a slot (Ollama's OLLAMA_MAX_QUEUE).
    max_queue: Option<u32>,
    cache: PromptCache,
}

impl EngineModel {
    /// An engine holding `models` (all unloaded) on `profile`, with the
    /// profile's slot count unless `slots` overrides it (at least 1).
    pub fn new(profile: &HardwareProfile, models: &[ModelSpec], slots: Option<u32>) -> Self {
        let models = models
            .iter()
            .map(|spec| {
                let rates = profile.rates(spec.size_bytes);
                ModelState {
                    spec: spec.clone(),
                    rates,
                    residency: Residency::Unloaded,
                    last_used_us: 0,
                    active: 0,
                    decode_per_us: rates.decode_tps / 1e6,
                }
            })
            .collect();
        Self {
            scaling: profile.batch_scaling.clone(),
            slots: slots.unwrap_or(profile.slots).max(1),
            memory_bytes: profile.memory_bytes,
            models,
            queue: VecDeque::new(),
            running: Vec::new(),
            decoding: 0,
            prefilling: 0,
            now_us: 0,
            pending: Vec::new(),
            busy_since: None,
            busy_total_us: 0,
            queued_prompt_tokens: 0,
            queued_output_tokens: 0,
            keep_alive_us: None,
            max_queue: None,
            cache: PromptCache::default(),
        }
    }

    /// Keeps the KV of prompts it has seen as `kind` says (default
    /// [`CacheKind::None`]: every prompt is prefilled whole). The cache
    /// starts cold.
    pub fn with_cache(mut self, kind: CacheKind) -> Self {
        self.cache = PromptCache::new(kind, self.slots);
        self
    }

    /// The prompt cache, e.g. to [`PromptCache::peek`] what a job would
    /// find cached here.
    pub fn cache(&self) -> &PromptCache {
        &self.cache
    }

    /// Unloads models idle for `keep_alive_us` (Ollama default: 5 minutes,
    /// docs/engine-figures.md §3); `None` keeps them until evicted.
    pub fn with_keep_alive(mut self, keep_alive_us: Option<u64>) -> Self {
        self.keep_alive_us = keep_alive_us;
        self
    }

    /// Refuses jobs when this many already wait for a slot (Ollama answers
    /// 503 past OLLAMA_MAX_QUEUE = 512, §3); `None`: unbounded.
    pub fn with_max_queue(mut self, max_queue: Option<u32>) -> Self {
        self.max_queue = max_queue;
        self
    }

    pub fn keep_alive_us(&self) -> Option<u64> {
        self.keep_alive_us
    }

    /// When an idle loaded model will be unloaded by keep-alive, if ever.
    pub fn expires_at(&self, model: usize) -> Option<u64> {
        let m = self.models.get(model)?;
        let keep = self.keep_alive_us?;
        (matches!(m.residency, Residency::Loaded) && m.active == 0)
            .then(|| m.last_used_us.saturating_add(keep))
    }

    /// The engine as pair-core describes it: models with size, loaded state
    /// and the profile's rates as seed perf.
    pub fn engine_snapshot(&self, kind: pair_core::EngineKind) -> pair_core::EngineSnapshot {
        pair_core::EngineSnapshot {
            kind,
            healthy: true,
            silent: false,
            continues_chat: None,
            slots: u16::try_from(self.slots).unwrap_or(u16::MAX),
            models: self
                .models
                .iter()
                .filter_map(|m| {
                    Some(pair_core::ModelEntry {
                        name: pair_core::ModelName::new(m.spec.name.as_str()).ok()?,
                        size_bytes: Some(m.spec.size_bytes),
                        loaded: matches!(m.residency, Residency::Loaded),
                        perf: Some(m.rates.to_perf()),
                        learned: false,
                    })
                })
                .collect(),
        }
    }

    pub fn slots(&self) -> u32 {
        self.slots
    }

    pub fn memory_bytes(&self) -> u64 {
        self.memory_bytes
    }

    /// The latest time the model has been told about.
    pub fn now_us(&self) -> u64 {
        self.now_us
    }

    /// Index of a model by exact name.
    pub fn model_index(&self, name: &str) -> Option<usize> {
        self.models.iter().position(|m| m.spec.name == name)
    }

    /// Every model with its state.
    pub fn models(&self) -> impl Iterator<Item = ModelStatus<'_>> {
        self.models
            .iter()
            .enumerate()
            .map(|(index, m)| ModelStatus {
                index,
                spec: &m.spec,
                rates: m.rates,
                residency: m.residency,
                last_used_us: m.last_used_us,
                active: m.active,
            })
    }

    /// Models in memory (loaded, not loading).
    pub fn loaded_models(&self) -> impl Iterator<Item = ModelStatus<'_>> {
        self.models()
            .filter(|m| matches!(m.residency, Residency::Loaded))
    }

    /// Memory taken by loaded and loading models.
    pub fn memory_used_bytes(&self) -> u64 {
        self.models
            .iter()
            .filter(|m| !matches!(m.residency, Residency::Unloaded))
            .map(|m| m.spec.size_bytes)
            .sum()
    }

    /// Puts a model in memory at once (an engine that starts warm).
    pub fn preload(&mut self, model: usize) -> Result<(), EmulatorError> {
        let size = self.model(model)?.spec.size_bytes;
        if self.memory_used_bytes() + size > self.memory_bytes && self.memory_used_bytes() > 0 {
            return Err(EmulatorError::OutOfMemory {
                model: self.models[model].spec.name.clone(),
            });
        }
        self.models[model].residency = Residency::Loaded;
        Ok(())
    }

    /// Takes a job at `now_us`. Events up to then are processed first and,
    /// like the job's own `Started`, come out of the next [`Self::advance`].
    pub fn submit(&mut self, now_us: u64, job: JobSpec) -> Result<(), EmulatorError> {
        self.model(job.model)?;
        self.run_until(now_us);
        if let Some(max) = self.max_queue
            && self.queue.len() >= max as usize
            && self.running.len() >= self.slots as usize
        {
            return Err(EmulatorError::QueueFull { max });
        }
        let now = self.now_us;
        // Starting a job may change how many prefill together.
        self.rebase(now);
        self.queued_prompt_tokens += u64::from(job.prompt_tokens);
        self.queued_output_tokens += u64::from(job.output_tokens);
        self.queue.push_back((job, now));
        self.fill_slots(now);
        self.reschedule();
        self.update_busy(now);
        Ok(())
    }

    /// Removes a job (the client went away). Returns whether it was there.
    pub fn cancel(&mut self, now_us: u64, id: u64) -> bool {
        self.run_until(now_us);
        let now = self.now_us;
        if let Some(pos) = self.queue.iter().position(|(j, _)| j.id == id) {
            if let Some((job, _)) = self.queue.remove(pos) {
                self.unqueue_tokens(&job);
            }
            self.pending.push(EngineEvent::Cancelled { id, at_us: now });
            return true;
        }
        let Some(pos) = self.running.iter().position(|r| r.spec.id == id) else {
            return false;
        };
        self.rebase(now);
        let r = self.running.swap_remove(pos);
        self.release(&r, now);
        self.pending.push(EngineEvent::Cancelled { id, at_us: now });
        self.fill_slots(now);
        self.retry_loads(now);
        self.reschedule();
        self.update_busy(now);
        true
    }

    /// Cuts a job holding a slot at `now_us` (a router preempts it for
    /// other work): it leaves as [`Self::cancel`] leaves it, and this says
    /// how far it got, so that it can continue elsewhere from there.
    /// `None` when the job is not holding a slot (nothing is cut).
    pub fn cut(&mut self, now_us: u64, id: u64) -> Option<Cut> {
        self.run_until(now_us);
        let r = self.running.iter().find(|r| r.spec.id == id)?;
        let cut = Cut {
            generated: self.generated(r, self.now_us),
            first_token_us: r.prefilled.then_some(r.first_token_us),
        };
        self.cancel(now_us, id);
        Some(cut)
    }

    /// When the next event happens, if anything is going on. Events already
    /// due (from [`Self::submit`]) make this `now_us()`.
    pub fn next_event_at(&self) -> Option<u64> {
        if !self.pending.is_empty() {
            return Some(self.now_us);
        }
        self.next_internal_event()
    }

    /// Processes everything up to `now_us` and appends the events, in order.
    pub fn advance(&mut self, now_us: u64, events: &mut Vec<EngineEvent>) {
        self.run_until(now_us);
        events.append(&mut self.pending);
    }

    /// Tokens a running job has produced by `now_us` (0 before its first
    /// token), assuming no event lies between the last advance and `now_us`.
    /// `None` when the job is not holding a slot.
    pub fn tokens_generated(&self, id: u64, now_us: u64) -> Option<u32> {
        let r = self.running.iter().find(|r| r.spec.id == id)?;
        Some(self.generated(r, now_us))
    }

    /// Tokens `r` has produced by `now_us`.
    fn generated(&self, r: &Running, now_us: u64) -> u32 {
        match r.phase {
            Phase::Waiting | Phase::Prefill { .. } => 0,
            Phase::Decode { base, base_at, .. } => {
                let rate = self.stream_rate(r.spec.model);
                let done = base + rate * now_us.saturating_sub(base_at) as f64;
                let whole = (done.floor().max(0.0) as u64).saturating_add(1);
                u32::try_from(whole)
                    .unwrap_or(u32::MAX)
                    .min(r.spec.output_tokens)
            }
        }
    }

    /// When the next token of any decoding stream is due after `now_us`, for
    /// a real-time server that paces its stream. Not used by the simulator.
    pub fn next_token_at(&self, now_us: u64) -> Option<u64> {
        self.running
            .iter()
            .filter_map(|r| match r.phase {
                Phase::Decode {
                    base,
                    base_at,
                    finish_at,
                } => {
                    let rate = self.stream_rate(r.spec.model);
                    let done = base + rate * now_us.saturating_sub(base_at) as f64;
                    let next = done.floor() + 1.0;
                    let at = base_at + ((next - base) / rate).ceil().max(0.0) as u64;
                    Some(at.min(finish_at).max(now_us))
                }
                _ => None,
            })
            .min()
    }

    /// Instantaneous GPU utilisation as `nvidia-smi` reports it: the share
    /// of time a kernel runs, so 1.0 while anything prefills or decodes.
    pub fn utilisation(&self) -> f32 {
        if self.busy_since.is_some() { 1.0 } else { 0.0 }
    }

    /// Microseconds spent busy (prefilling or decoding) up to `now_us`;
    /// differences give utilisation over any window.
    pub fn busy_us(&self, now_us: u64) -> u64 {
        self.busy_total_us
            + self
                .busy_since
                .map_or(0, |since| now_us.saturating_sub(since))
    }

    /// Jobs and tokens accepted and not finished, at `now_us`.
    pub fn workload(&self, now_us: u64) -> Workload {
        let mut w = Workload {
            running: u32::try_from(self.running.len()).unwrap_or(u32::MAX),
            queued: u32::try_from(self.queue.len()).unwrap_or(u32::MAX),
            prefill_tokens: self.queued_prompt_tokens,
            decode_tokens: self.queued_output_tokens,
        };
        for r in &self.running {
            let out = u64::from(r.spec.output_tokens);
            match r.phase {
                Phase::Waiting | Phase::Prefill { .. } => {
                    let uncached = r.spec.prompt_tokens - r.lease.cached_tokens;
                    w.prefill_tokens += u64::from(uncached);
                    w.decode_tokens += out;
                }
                Phase::Decode { .. } => {
                    // Per stream directly: looking each up by id made this
                    // quadratic in the running streams.
                    let made = u64::from(self.generated(r, now_us));
                    w.decode_tokens += out.saturating_sub(made);
                }
            }
        }
        w
    }

    /// Streams decoding right now.
    pub fn decoding(&self) -> u32 {
        self.decoding
    }

    fn model(&self, model: usize) -> Result<&ModelState, EmulatorError> {
        self.models
            .get(model)
            .ok_or(EmulatorError::NoSuchModelIndex { index: model })
    }

    /// Tokens per microsecond of one stream of `model` right now.
    fn stream_rate(&self, model: usize) -> f64 {
        self.models[model].decode_per_us * self.scaling.per_stream(self.decoding)
    }

    fn next_internal_event(&self) -> Option<u64> {
        let jobs = self.running.iter().filter_map(|r| match r.phase {
            Phase::Waiting => None,
            Phase::Prefill { done_at, .. } => Some(done_at),
            Phase::Decode { finish_at, .. } => Some(finish_at),
        });
        let loads = self.models.iter().filter_map(|m| match m.residency {
            Residency::Loading { ready_at_us } => Some(ready_at_us),
            _ => None,
        });
        let expiries = (0..self.models.len()).filter_map(|i| self.expires_at(i));
        jobs.chain(loads).chain(expiries).min()
    }

    fn run_until(&mut self, now_us: u64) {
        while let Some(t) = self.next_internal_event() {
            if t > now_us {
                break;
            }
            self.step(t.max(self.now_us));
        }
        self.now_us = self.now_us.max(now_us);
    }

    /// Everything due at `t`.
    fn step(&mut self, t: u64) {
        self.now_us = t;
        self.rebase(t);
        for m in 0..self.models.len() {
            if let Residency::Loading { ready_at_us } = self.models[m].residency
                && ready_at_us <= t
            {
                self.models[m].residency = Residency::Loaded;
                self.pending
                    .push(EngineEvent::Loaded { model: m, at_us: t });
                for i in 0..self.running.len() {
                    if self.running[i].spec.model == m
                        && matches!(self.running[i].phase, Phase::Waiting)
                    {
                        self.running[i].phase = Self::start_prefill(t);
                        self.prefilling += 1;
                    }
                }
            }
        }
        for m in 0..self.models.len() {
            if self.expires_at(m).is_some_and(|at| at <= t) {
                self.models[m].residency = Residency::Unloaded;
                self.cache.forget_model(m);
                self.pending
                    .push(EngineEvent::Evicted { model: m, at_us: t });
            }
        }
        let mut i = 0;
        while i < self.running.len() {
            let (phase, id, output_tokens) = {
                let r = &self.running[i];
                (r.phase, r.spec.id, r.spec.output_tokens)
            };
            match phase {
                Phase::Prefill { done_at, .. } if done_at <= t => {
                    self.prefilling -= 1;
                    let r = &mut self.running[i];
                    r.phase = Phase::Waiting;
                    r.first_token_us = t;
                    r.prefilled = true;
                    self.cache
                        .prefilled(t, r.spec.model, &r.spec.prompt, &mut r.lease);
                    self.pending.push(EngineEvent::FirstToken { id, at_us: t });
                    if output_tokens <= 1 {
                        self.finish(i, t);
                        continue;
                    }
                    self.running[i].phase = Phase::Decode {
                        base: 0.0,
                        base_at: t,
                        finish_at: u64::MAX,
                    };
                    self.decoding += 1;
                }
                Phase::Decode { finish_at, .. } if finish_at <= t => {
                    self.finish(i, t);
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
        self.fill_slots(t);
        self.retry_loads(t);
        self.reschedule();
        self.update_busy(t);
    }

    fn finish(&mut self, i: usize, t: u64) {
        let r = self.running.swap_remove(i);
        self.release(&r, t);
        self.pending.push(EngineEvent::Finished(JobTiming {
            id: r.spec.id,
            model: r.spec.model,
            prompt_tokens: r.spec.prompt_tokens,
            output_tokens: r.spec.output_tokens,
            cached_tokens: r.lease.cached_tokens,
            submitted_us: r.submitted_us,
            started_us: r.started_us,
            first_token_us: r.first_token_us,
            finished_us: t,
            cold: r.cold,
        }));
    }

    /// Gives back the slot of a job that left `running`.
    fn release(&mut self, r: &Running, t: u64) {
        match r.phase {
            Phase::Decode { .. } => self.decoding -= 1,
            Phase::Prefill { .. } => self.prefilling -= 1,
            Phase::Waiting => {}
        }
        let m = &mut self.models[r.spec.model];
        m.active -= 1;
        m.last_used_us = t;
        self.cache
            .release(t, r.spec.model, &r.spec.prompt, &r.lease, r.prefilled);
    }

    fn unqueue_tokens(&mut self, job: &JobSpec) {
        self.queued_prompt_tokens -= u64::from(job.prompt_tokens);
        self.queued_output_tokens -= u64::from(job.output_tokens);
    }

    /// A prefill starting at `t`; [`Self::reschedule`] sets its end.
    fn start_prefill(t: u64) -> Phase {
        Phase::Prefill {
            base: 0.0,
            base_at: t,
            // Not due before reschedule() computes it.
            done_at: u64::MAX,
        }
    }

    /// Solo time of a job's prefill: overhead, a context restored from
    /// host memory at [`HOST_RESTORE_TOKENS_PER_S`], then the prompt tokens
    /// the cache did not hold at the full rate.
    fn prefill_us(&self, r: &Running) -> u64 {
        let rates = &self.models[r.spec.model].rates;
        let uncached = r.spec.prompt_tokens - r.lease.cached_tokens;
        let restore = f64::from(r.lease.restored_tokens) / HOST_RESTORE_TOKENS_PER_S;
        rates.overhead_us
            + ((f64::from(uncached) / rates.prefill_tps + restore) * 1e6).ceil() as u64
    }

    /// Moves queued jobs into free slots, in arrival order.
    fn fill_slots(&mut self, t: u64) {
        while self.running.len() < self.slots as usize {
            let Some((job, submitted_us)) = self.queue.pop_front() else {
                break;
            };
            self.unqueue_tokens(&job);
            let m = &mut self.models[job.model];
            m.active += 1;
            m.last_used_us = t;
            let residency = m.residency;
            let lease = self
                .cache
                .acquire(t, job.model, &job.prompt, job.prompt_tokens);
            self.pending.push(EngineEvent::Started {
                id: job.id,
                at_us: t,
            });
            let phase = match residency {
                Residency::Loaded => {
                    self.prefilling += 1;
                    Self::start_prefill(t)
                }
                Residency::Loading { .. } => Phase::Waiting,
                Residency::Unloaded => {
                    self.try_load(job.model, t);
                    Phase::Waiting
                }
            };
            self.running.push(Running {
                spec: job,
                submitted_us,
                started_us: t,
                first_token_us: 0,
                cold: !matches!(residency, Residency::Loaded),
                phase,
                lease,
                prefilled: false,
            });
        }
    }

    /// Starts loads that were waiting for memory.
    fn retry_loads(&mut self, t: u64) {
        for i in 0..self.running.len() {
            let m = self.running[i].spec.model;
            if matches!(self.running[i].phase, Phase::Waiting)
                && matches!(self.models[m].residency, Residency::Unloaded)
            {
                self.try_load(m, t);
            }
        }
    }

    /// Loads `model` if it fits, evicting idle models (least recently used
    /// first) only when that makes it fit.
    fn try_load(&mut self, model: usize, t: u64) {
        let need = self.models[model].spec.size_bytes;
        let used = self.memory_used_bytes();
        let mut idle: Vec<usize> = (0..self.models.len())
            .filter(|&i| {
                i != model
                    && self.models[i].active == 0
                    && matches!(self.models[i].residency, Residency::Loaded)
            })
            .collect();
        let idle_bytes: u64 = idle.iter().map(|&i| self.models[i].spec.size_bytes).sum();
        let fits_after_eviction = used - idle_bytes + need <= self.memory_bytes;
        let alone_after_eviction = used == idle_bytes;
        if used + need > self.memory_bytes {
            if !(fits_after_eviction || alone_after_eviction) {
                return;
            }
            idle.sort_by_key(|&i| (self.models[i].last_used_us, i));
            let mut used = used;
            for i in idle {
                if used + need <= self.memory_bytes {
                    break;
                }
                used -= self.models[i].spec.size_bytes;
                self.models[i].residency = Residency::Unloaded;
                self.cache.forget_model(i);
                self.pending
                    .push(EngineEvent::Evicted { model: i, at_us: t });
            }
        }
        let ready_at_us = t + self.models[model].rates.load_us;
        self.models[model].residency = Residency::Loading { ready_at_us };
        self.pending
            .push(EngineEvent::LoadStarted { model, at_us: t });
    }

    /// Share of its solo prefill speed each prefilling job gets now.
    fn prefill_share(&self) -> f64 {
        1.0 / f64::from(self.prefilling.max(1))
    }

    /// Brings every prefill's and decoding stream's progress up to `t` at
    /// the current rates.
    fn rebase(&mut self, t: u64) {
        let per_stream = self.scaling.per_stream(self.decoding);
        let share = self.prefill_share();
        for r in &mut self.running {
            match &mut r.phase {
                Phase::Decode { base, base_at, .. } => {
                    let rate = self.models[r.spec.model].decode_per_us * per_stream;
                    *base += rate * t.saturating_sub(*base_at) as f64;
                    *base_at = t;
                }
                Phase::Prefill { base, base_at, .. } => {
                    *base += share * t.saturating_sub(*base_at) as f64;
                    *base_at = t;
                }
                Phase::Waiting => {}
            }
        }
    }

    /// Recomputes every prefill's and decoding stream's end at the current
    /// rates.
    fn reschedule(&mut self) {
        let per_stream = self.scaling.per_stream(self.decoding);
        let share = self.prefill_share();
        for i in 0..self.running.len() {
            let solo = self.prefill_us(&self.running[i]) as f64;
            let r = &mut self.running[i];
            match &mut r.phase {
                Phase::Decode {
                    base,
                    base_at,
                    finish_at,
                } => {
                    let rate = self.models[r.spec.model].decode_per_us * per_stream;
                    let left = (f64::from(r.spec.output_tokens - 1) - *base).max(0.0);
                    *finish_at = *base_at + (left / rate).ceil() as u64;
                }
                Phase::Prefill {
                    base,
                    base_at,
                    done_at,
                } => {
                    let left = (solo - *base).max(0.0);
                    // Rounded to the nearest microsecond: rounding up would
                    // add a spurious microsecond on every rebase.
                    *done_at = *base_at + (left / share - 1e-6).ceil().max(0.0) as u64;
                }
                Phase::Waiting => {}
            }
        }
    }

    fn update_busy(&mut self, t: u64) {
        let busy = self
            .running
            .iter()
            .any(|r| !matches!(r.phase, Phase::Waiting));
        match (busy, self.busy_since) {
            (true, None) => self.busy_since = Some(t),
            (false, Some(since)) => {
                self.busy_total_us += t - since;
                self.busy_since = None;
            }
            _ => {}
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    fn smol() -> (EngineModel, HardwareProfile) {
        let p = HardwareProfile::cpu_smollm2_135m();
        let spec = ModelSpec::new("smollm2", p.reference_model_bytes);
        let mut e = EngineModel::new(&p, &[spec], None);
        e.preload(0).unwrap();
        (e, p)
    }

    /// Runs the engine until nothing is left; returns every event.
    fn drain(e: &mut EngineModel) -> Vec<EngineEvent> {
        let mut out = Vec::new();
        while let Some(t) = e.next_event_at() {
            e.advance(t, &mut out);
        }
        out
    }

    fn finished(events: &[EngineEvent]) -> HashMap<u64, JobTiming> {
        events
            .iter()
            .filter_map(|e| match e {
                EngineEvent::Finished(t) => Some((t.id, *t)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn measured_box_queues_streams_like_the_real_server() {
        // docs/engine-figures.md §1: 64-token streams started together; the k-th
        // stream's TTFT ≈ (k−1) × 0.58 s + 0.08 s. Prompts of ~20 tokens.
        let (mut e, _) = smol();
        for id in 0..4 {
            e.submit(
                0,
                JobSpec {
                    id,
                    model: 0,
                    prompt_tokens: 20,
                    output_tokens: 64,
                    prompt: PromptChain::EMPTY,
                },
            )
            .unwrap();
        }
        let done = finished(&drain(&mut e));
        for k in 0..4u64 {
            let ttft = done[&k].ttft_us() as f64 / 1e6;
            let expect = k as f64 * 0.58 + 0.08;
            assert!(
                (ttft - expect).abs() < 0.03,
                "stream {k}: ttft {ttft:.3} s, expected {expect:.3} s"
            );
        }
        // Measured total for 4 streams: 2.3 s.
        let total = done[&3].finished_us as f64 / 1e6;
        assert!((total - 2.3).abs() < 0.1, "total {total:.3} s");
    }

    #[test]
    fn measured_box_prefill_matches_the_ttft_table() {
        // §1 /v1/completions TTFT: 127 tokens 316 ms, 511 tokens 1306 ms,
        // 1023 tokens 2739 ms (within 15 %).
        for (tokens, ms) in [(127u32, 316.0), (511, 1306.0), (1023, 2739.0)] {
            let (mut e, _) = smol();
            e.submit(
                0,
                JobSpec {
                    id: 1,
                    model: 0,
                    prompt_tokens: tokens,
                    output_tokens: 4,
                    prompt: PromptChain::EMPTY,
                },
            )
            .unwrap();
            let t = finished(&drain(&mut e))[&1].ttft_us() as f64 / 1e3;
            assert!(
                (t - ms).abs() / ms < 0.15,
                "{tokens} tokens: {t:.0} ms vs {ms} ms"
            );
        }
    }

    #[test]
    fn decode_rate_is_the_measured_single_stream_rate() {
        let (mut e, _) = smol();
        e.submit(
            0,
            JobSpec {
                id: 7,
                model: 0,
                prompt_tokens: 10,
                output_tokens: 127,
                prompt: PromptChain::EMPTY,
            },
        )
        .unwrap();
        let t = finished(&drain(&mut e))[&7];
        let tps = 126.0 / ((t.finished_us - t.first_token_us) as f64 / 1e6);
        assert!((tps - 126.0).abs() < 0.5, "{tps}");
    }

    #[test]
    fn batching_slows_each_stream_but_raises_the_total() {
        let p = HardwareProfile::rtx4090();
        let spec = ModelSpec::guess("llama3.1:8b");
        let run = |n: u64| {
            let mut e = EngineModel::new(&p, std::slice::from_ref(&spec), Some(8));
            e.preload(0).unwrap();
            for id in 0..n {
                e.submit(
                    0,
                    JobSpec {
                        id,
                        model: 0,
                        prompt_tokens: 0,
                        output_tokens: 501,
                        prompt: PromptChain::EMPTY,
                    },
                )
                .unwrap();
            }
            let done = finished(&drain(&mut e));
            let t = done[&0];
            500.0 / ((t.finished_us - t.first_token_us) as f64 / 1e6)
        };
        let one = run(1);
        let four = run(4);
        assert!((one - 130.6).abs() < 0.5, "{one}");
        // §4: 3.0× aggregate at 4 streams, so each runs at 0.75×.
        assert!((four - 130.6 * 0.75).abs() < 0.5, "{four}");
    }

    #[test]
    fn cold_model_loads_then_serves_and_evicts_the_idle_one() {
        let mut p = HardwareProfile::rtx3060();
        p.memory_bytes = 6_000_000_000;
        let a = ModelSpec::new("a", 4_000_000_000);
        let b = ModelSpec::new("b", 4_000_000_000);
        let mut e = EngineModel::new(&p, &[a, b], Some(1));
        e.submit(
            0,
            JobSpec {
                id: 1,
                model: 0,
                prompt_tokens: 10,
                output_tokens: 5,
                prompt: PromptChain::EMPTY,
            },
        )
        .unwrap();
        e.submit(
            0,
            JobSpec {
                id: 2,
                model: 1,
                prompt_tokens: 10,
                output_tokens: 5,
                prompt: PromptChain::EMPTY,
            },
        )
        .unwrap();
        let events = drain(&mut e);
        let done = finished(&events);
        let load = e.models().next().unwrap().rates.load_us;
        assert!(done[&1].cold && done[&1].first_token_us >= load);
        assert!(done[&2].cold && done[&2].first_token_us >= done[&1].finished_us + load);
        assert!(events.contains(&EngineEvent::Evicted {
            model: 0,
            at_us: done[&1].finished_us
        }));
        let loaded: Vec<_> = e.loaded_models().map(|m| m.spec.name.clone()).collect();
        assert_eq!(loaded, ["b"]);
        assert_eq!(e.memory_used_bytes(), 4_000_000_000);
    }

    #[test]
    fn workload_counts_tokens_not_yet_done() {
        let (mut e, _) = smol();
        e.submit(
            0,
            JobSpec {
                id: 1,
                model: 0,
                prompt_tokens: 100,
                output_tokens: 50,
                prompt: PromptChain::EMPTY,
            },
        )
        .unwrap();
        e.submit(
            0,
            JobSpec {
                id: 2,
                model: 0,
                prompt_tokens: 30,
                output_tokens: 20,
                prompt: PromptChain::EMPTY,
            },
        )
        .unwrap();
        let w = e.workload(0);
        assert_eq!(
            (w.running, w.queued, w.prefill_tokens, w.decode_tokens),
            (1, 1, 130, 70)
        );
        let mut ev = Vec::new();
        e.advance(400_000, &mut ev);
        let w = e.workload(400_000);
        assert_eq!(w.prefill_tokens, 30);
        assert!(w.decode_tokens < 70 && w.decode_tokens > 20);
        assert_eq!(e.utilisation(), 1.0);
        drain(&mut e);
        assert_eq!(e.workload(e.now_us()), Workload::default());
        assert_eq!(e.utilisation(), 0.0);
        assert!(e.busy_us(e.now_us()) > 0 && e.busy_us(e.now_us()) <= e.now_us());
    }

    #[test]
    fn cancel_frees_the_slot_for_the_next_job() {
        let (mut e, _) = smol();
        e.submit(
            0,
            JobSpec {
                id: 1,
                model: 0,
                prompt_tokens: 10,
                output_tokens: 1000,
                prompt: PromptChain::EMPTY,
            },
        )
        .unwrap();
        e.submit(
            0,
            JobSpec {
                id: 2,
                model: 0,
                prompt_tokens: 10,
                output_tokens: 10,
                prompt: PromptChain::EMPTY,
            },
        )
        .unwrap();
        assert!(e.cancel(100_000, 1));
        assert!(!e.cancel(100_000, 1));
        let events = drain(&mut e);
        assert!(events.contains(&EngineEvent::Cancelled {
            id: 1,
            at_us: 100_000
        }));
        assert_eq!(finished(&events)[&2].started_us, 100_000);
    }

    #[test]
    fn a_cut_job_says_how_far_it_got_and_frees_its_slot() {
        let (mut e, _) = smol();
        let job = |id, output_tokens| JobSpec {
            id,
            model: 0,
            prompt_tokens: 10,
            output_tokens,
            prompt: PromptChain::EMPTY,
        };
        e.submit(0, job(1, 1000)).unwrap();
        e.submit(0, job(2, 10)).unwrap();
        e.submit(0, job(3, 10)).unwrap();
        let first = finished(&drain(&mut e.clone()))[&1].first_token_us;
        let cut = e.cut(first + 1_000_000, 1).unwrap();
        assert_eq!(cut.first_token_us, Some(first));
        let rate = e.models().next().unwrap().rates.decode_tps;
        let expected = 1.0 + rate;
        assert!(
            (f64::from(cut.generated) - expected).abs() <= 1.0,
            "{} tokens in a second at {rate}/s",
            cut.generated
        );
        assert_eq!(e.cut(first + 1_000_000, 1), None, "once");
        // A job still waiting for a slot is not cut (cancel it instead).
        assert_eq!(e.cut(first + 1_000_000, 3), None);
        let events = drain(&mut e);
        assert!(events.contains(&EngineEvent::Cancelled {
            id: 1,
            at_us: first + 1_000_000
        }));
        assert!(!finished(&events).contains_key(&1));
        assert_eq!(finished(&events)[&2].started_us, first + 1_000_000);
    }

    #[test]
    fn tokens_generated_paces_a_stream() {
        let (mut e, _) = smol();
        e.submit(
            0,
            JobSpec {
                id: 1,
                model: 0,
                prompt_tokens: 0,
                output_tokens: 100,
                prompt: PromptChain::EMPTY,
            },
        )
        .unwrap();
        let mut ev = Vec::new();
        e.advance(30_000, &mut ev);
        assert_eq!(e.tokens_generated(1, 30_000), Some(1));
        let next = e.next_token_at(30_000).unwrap();
        assert!((7_000..9_000).contains(&(next - 30_000)), "{next}");
        assert_eq!(e.tokens_generated(1, next), Some(2));
        assert_eq!(e.tokens_generated(1, next - 1), Some(1));
        assert_eq!(e.tokens_generated(9, next), None);
    }

    #[test]
    fn prefills_running_together_share_the_compute() {
        let p = HardwareProfile::rtx4090();
        let spec = ModelSpec::guess("llama3.1:8b");
        let mut e = EngineModel::new(&p, std::slice::from_ref(&spec), Some(4));
        e.preload(0).unwrap();
        // Solo: 15 ms overhead + 7,139 tokens at 7,139 tok/s = 1,015 ms.
        let job = |id| JobSpec {
            id,
            model: 0,
            prompt_tokens: 7_139,
            output_tokens: 2,
            prompt: PromptChain::EMPTY,
        };
        e.submit(0, job(1)).unwrap();
        e.submit(0, job(2)).unwrap();
        // A third joins half-way through (each of the two has done 507.5 ms
        // of solo work by then).
        e.submit(1_015_000, job(3)).unwrap();
        let done = finished(&drain(&mut e));
        // The two left 507.5 ms each at 1/3 speed: 1,522.5 ms more.
        for id in [1, 2] {
            let t = done[&id].first_token_us as i64;
            assert!((t - 2_537_500).abs() <= 2, "{id}: {t}");
        }
        // The third did 507.5 ms of work in that time at 1/3 speed, the
        // rest (507.5 ms) alone.
        let t3 = done[&3].first_token_us as i64;
        assert!((t3 - 3_045_000).abs() <= 2, "{t3}");
    }

    #[test]
    fn keep_alive_unloads_idle_models() {
        let p = HardwareProfile::cpu_smollm2_135m();
        let spec = ModelSpec::new("smollm2", p.reference_model_bytes);
        let mut e = EngineModel::new(&p, &[spec], None).with_keep_alive(Some(300_000_000));
        e.submit(
            0,
            JobSpec {
                id: 1,
                model: 0,
                prompt_tokens: 10,
                output_tokens: 10,
                prompt: PromptChain::EMPTY,
            },
        )
        .unwrap();
        let events = drain(&mut e);
        let done = finished(&events)[&1];
        assert!(done.cold);
        assert_eq!(
            events.last(),
            Some(&EngineEvent::Evicted {
                model: 0,
                at_us: done.finished_us + 300_000_000
            })
        );
        assert_eq!(e.loaded_models().count(), 0);
        assert_eq!(e.expires_at(0), None);
    }

    #[test]
    fn a_full_queue_refuses_jobs() {
        let (e, _) = smol();
        let mut e = e.with_max_queue(Some(1));
        let job = |id| JobSpec {
            id,
            model: 0,
            prompt_tokens: 1,
            output_tokens: 1,
            prompt: PromptChain::EMPTY,
        };
        e.submit(0, job(1)).unwrap();
        e.submit(0, job(2)).unwrap();
        assert!(matches!(
            e.submit(0, job(3)),
            Err(EmulatorError::QueueFull { max: 1 })
        ));
        assert!(e.submit(0, JobSpec { model: 5, ..job(4) }).is_err());
    }

    #[test]
    fn snapshot_speaks_pair_core() {
        let (e, p) = smol();
        let s = e.engine_snapshot(pair_core::EngineKind::OpenAiCompat);
        assert_eq!(s.slots, 1);
        assert!(s.models[0].loaded);
        let perf = s.models[0].perf.unwrap();
        assert_eq!(perf.decode_tps, 126.0);
        assert_eq!(perf.overhead_ms, 30);
        assert_eq!(
            u64::from(perf.load_ms),
            p.rates(p.reference_model_bytes).load_us / 1000
        );
    }

    /// A chain of named segments of the given lengths.
    fn chain(segments: &[(u64, u32)]) -> PromptChain {
        let mut b = pair_core::ChainBuilder::new();
        for &(id, tokens) in segments {
            b.segment(id, tokens);
        }
        b.finish()
    }

    fn job_of(id: u64, prompt: PromptChain, output_tokens: u32) -> JobSpec {
        JobSpec {
            id,
            model: 0,
            prompt_tokens: prompt.tokens(),
            output_tokens,
            prompt,
        }
    }

    /// The 4090 with an 8B model loaded and `kind` of cache.
    fn cached_engine(kind: CacheKind, slots: u32) -> EngineModel {
        let p = HardwareProfile::rtx4090();
        let spec = ModelSpec::guess("llama3.1:8b");
        let mut e = EngineModel::new(&p, &[spec], Some(slots)).with_cache(kind);
        e.preload(0).unwrap();
        e
    }

    /// Solo prefill of `tokens` on [`cached_engine`]: 15 ms + 7,139 tok/s.
    fn solo_ttft_us(tokens: u32) -> u64 {
        15_000 + (f64::from(tokens) / 7_139.0 * 1e6).ceil() as u64
    }

    #[test]
    fn a_later_turn_on_the_same_slot_prefills_only_the_new_part() {
        let mut e = cached_engine(CacheKind::slots(32_768), 1);
        e.submit(0, job_of(1, chain(&[(1, 7_000), (2, 139)]), 10))
            .unwrap();
        let first = finished(&drain(&mut e))[&1];
        assert_eq!(first.cached_tokens, 0);
        assert_eq!(first.ttft_us(), solo_ttft_us(7_139));
        // The next turn re-sends the context and adds 714 tokens.
        let now = e.now_us();
        let next = chain(&[(1, 7_000), (2, 139), (3, 700), (4, 14)]);
        e.submit(now, job_of(2, next, 10)).unwrap();
        let second = finished(&drain(&mut e))[&2];
        assert_eq!(second.cached_tokens, 7_139);
        assert_eq!(second.prompt_tokens, 7_853);
        assert_eq!(second.ttft_us(), solo_ttft_us(714));
    }

    #[test]
    fn a_context_restored_from_host_memory_costs_a_copy_not_a_prefill() {
        // One slot, two conversations in turn: the first's context is
        // saved when the second takes the slot, and restored for its next
        // turn at the host's copy rate.
        let mut e = cached_engine(CacheKind::llama_cpp(32_768), 1);
        let a = chain(&[(1, 7_000), (2, 139)]);
        e.submit(0, job_of(1, a, 10)).unwrap();
        drain(&mut e);
        let now = e.now_us();
        e.submit(now, job_of(2, chain(&[(5, 3_000)]), 10)).unwrap();
        drain(&mut e);
        let now = e.now_us();
        let a2 = chain(&[(1, 7_000), (2, 139), (3, 700), (4, 14)]);
        e.submit(now, job_of(3, a2, 10)).unwrap();
        let third = finished(&drain(&mut e))[&3];
        assert_eq!(third.cached_tokens, 7_139);
        let restore_us = (7_139.0 / HOST_RESTORE_TOKENS_PER_S * 1e6) as u64;
        let ttft = third.ttft_us();
        assert!(
            ttft.abs_diff(solo_ttft_us(714) + restore_us) <= 1,
            "{ttft} against {} + {restore_us}",
            solo_ttft_us(714)
        );
        assert!(ttft < solo_ttft_us(7_853) / 2);
    }

    #[test]
    fn a_shared_system_prompt_is_reused_across_conversations() {
        let system = (1, 20_000);
        for kind in [
            CacheKind::slots(32_768),
            CacheKind::Pool {
                capacity_tokens: 100_000,
            },
        ] {
            let mut e = cached_engine(kind, 2);
            e.submit(0, job_of(1, chain(&[system, (2, 500)]), 10))
                .unwrap();
            drain(&mut e);
            let now = e.now_us();
            // Two other conversations at once: on a pool both find the
            // system prompt; on slots only the one taking the slot that
            // holds it.
            e.submit(now, job_of(2, chain(&[system, (3, 800)]), 10))
                .unwrap();
            e.submit(now, job_of(3, chain(&[system, (4, 900)]), 10))
                .unwrap();
            let done = finished(&drain(&mut e));
            assert_eq!(done[&2].cached_tokens, 20_000, "{kind:?}");
            let third = match kind {
                CacheKind::Pool { .. } => 20_000,
                _ => 0,
            };
            assert_eq!(done[&3].cached_tokens, third, "{kind:?}");
            // No cache: nothing is reused.
            let mut none = cached_engine(CacheKind::None, 2);
            none.submit(0, job_of(1, chain(&[system, (2, 500)]), 10))
                .unwrap();
            drain(&mut none);
            let now = none.now_us();
            none.submit(now, job_of(2, chain(&[system, (3, 800)]), 10))
                .unwrap();
            assert_eq!(finished(&drain(&mut none))[&2].cached_tokens, 0);
        }
    }

    #[test]
    fn workload_counts_only_uncached_prefill() {
        let mut e = cached_engine(CacheKind::slots(32_768), 1);
        e.submit(0, job_of(1, chain(&[(1, 5_000)]), 2)).unwrap();
        drain(&mut e);
        let now = e.now_us();
        e.submit(now, job_of(2, chain(&[(1, 5_000), (2, 300)]), 2))
            .unwrap();
        assert_eq!(e.workload(now).prefill_tokens, 300);
        assert_eq!(e.cache().held_tokens(), 5_000);
    }

    #[test]
    fn an_evicted_model_loses_its_cached_prompts() {
        let mut p = HardwareProfile::rtx3060();
        p.memory_bytes = 6_000_000_000;
        let specs = [
            ModelSpec::new("a", 4_000_000_000),
            ModelSpec::new("b", 4_000_000_000),
        ];
        let mut e = EngineModel::new(&p, &specs, Some(2)).with_cache(CacheKind::slots(32_768));
        let prompt = chain(&[(1, 1_000)]);
        let on = |id, model| JobSpec {
            model,
            ..job_of(id, prompt.clone(), 2)
        };
        e.submit(0, on(1, 0)).unwrap();
        drain(&mut e);
        let now = e.now_us();
        assert_eq!(e.cache().peek(0, &prompt, 1_001), 1_000);
        e.submit(now, on(2, 1)).unwrap();
        drain(&mut e);
        assert_eq!(e.cache().peek(0, &prompt, 1_001), 0);
    }

    fn arb_jobs() -> impl Strategy<Value = Vec<(u64, u8, u32, u32)>> {
        prop::collection::vec((0u64..2_000_000, 0u8..3, 0u32..600, 0u32..200), 1..40)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        #[test]
        fn every_job_finishes_once_in_order_and_within_slots(
            jobs in arb_jobs(),
            slots in 1u32..5,
            small_memory in any::<bool>(),
        ) {
            let mut p = HardwareProfile::rtx3060();
            if small_memory {
                p.memory_bytes = 5_000_000_000;
            }
            let specs = [
                ModelSpec::new("a", 4_000_000_000),
                ModelSpec::new("b", 2_000_000_000),
                ModelSpec::new("c", 900_000_000),
            ];
            let mut e = EngineModel::new(&p, &specs, Some(slots));
            let mut arrivals: Vec<_> = jobs.iter().enumerate()
                .map(|(i, &(at, m, pt, ot))| (at, JobSpec { id: i as u64, model: usize::from(m), prompt_tokens: pt, output_tokens: ot, prompt: PromptChain::EMPTY }))
                .collect();
            arrivals.sort_by_key(|a| a.0);
            let mut events = Vec::new();
            let mut submitted = HashMap::new();
            let mut now = 0;
            for (at, job) in arrivals.iter().cloned() {
                // Step through the events in between, checking invariants.
                while let Some(t) = e.next_event_at() {
                    if t > at { break; }
                    e.advance(t, &mut events);
                    prop_assert!(e.workload(t).running <= slots);
                    now = t;
                }
                prop_assert!(at >= now);
                submitted.insert(job.id, (at, job.clone()));
                e.submit(at, job).unwrap();
            }
            events.extend(drain(&mut e));

            let mut seen = HashMap::new();
            let mut start_order = Vec::new();
            let mut running = 0i64;
            let mut last_at = 0;
            for ev in &events {
                let at = match ev {
                    EngineEvent::Started { at_us, .. } | EngineEvent::LoadStarted { at_us, .. }
                    | EngineEvent::Loaded { at_us, .. } | EngineEvent::Evicted { at_us, .. }
                    | EngineEvent::FirstToken { at_us, .. } | EngineEvent::Cancelled { at_us, .. } => *at_us,
                    EngineEvent::Finished(t) => t.finished_us,
                };
                prop_assert!(at >= last_at, "events out of time order");
                last_at = at;
                match ev {
                    EngineEvent::Started { id, .. } => { running += 1; start_order.push(*id); }
                    EngineEvent::Finished(t) => {
                        running -= 1;
                        prop_assert!(seen.insert(t.id, *t).is_none(), "finished twice");
                    }
                    _ => {}
                }
                prop_assert!(running <= i64::from(slots) && running >= 0);
            }
            prop_assert_eq!(seen.len(), arrivals.len());
            // FIFO: slots are taken in arrival order.
            let arrival_order: Vec<u64> = arrivals.iter().map(|a| a.1.id).collect();
            prop_assert_eq!(start_order, arrival_order);
            for (id, t) in &seen {
                let (at, job) = &submitted[id];
                let at = *at;
                let rates = p.rates(specs[job.model].size_bytes);
                let prefill = rates.overhead_us + (f64::from(job.prompt_tokens) / rates.prefill_tps * 1e6).ceil() as u64;
                prop_assert_eq!(t.submitted_us, at);
                prop_assert!(t.started_us >= at);
                // Shared prefill only slows a job down (1 µs of float rounding).
                prop_assert!(t.first_token_us + 1 >= t.started_us + prefill);
                prop_assert!(t.finished_us >= t.first_token_us);
                // Decoding can never beat one stream alone.
                let alone = (f64::from(job.output_tokens.saturating_sub(1)) / rates.decode_tps * 1e6) as u64;
                prop_assert!(t.finished_us - t.first_token_us + 1 >= alone);
            }
            prop_assert_eq!(e.workload(e.now_us()), Workload::default());
        }

        /// In isolation, a job that finds more of its prompt cached never
        /// gets its first token later.
        #[test]
        fn more_cached_never_makes_ttft_longer(
            prompt in 1u32..20_000,
            a in 0u32..20_000,
            b in 0u32..20_000,
            pool in any::<bool>(),
        ) {
            let (less, more) = (a.min(b).min(prompt), a.max(b).min(prompt));
            let kind = if pool {
                CacheKind::Pool { capacity_tokens: 1_000_000 }
            } else {
                CacheKind::slots(32_768)
            };
            let run = |warm: u32| {
                let mut e = cached_engine(kind, 1);
                e.submit(0, job_of(1, chain(&[(1, warm)]), 1)).unwrap();
                drain(&mut e);
                let now = e.now_us();
                let target = chain(&[(1, warm), (2, prompt - warm)]);
                e.submit(now, job_of(2, target, 5)).unwrap();
                finished(&drain(&mut e))[&2]
            };
            let (l, m) = (run(less), run(more));
            prop_assert!(m.cached_tokens >= l.cached_tokens);
            prop_assert!(m.ttft_us() <= l.ttft_us());
            prop_assert_eq!(m.ttft_us(), solo_ttft_us(prompt - m.cached_tokens));
        }

        #[test]
        fn more_concurrency_never_makes_a_stream_faster(
            out in 2u32..400, others in 0u64..6, other_out in 1u32..400,
        ) {
            let p = HardwareProfile::rtx4090();
            let spec = ModelSpec::guess("llama3.1:8b");
            let run = |n: u64| {
                let mut e = EngineModel::new(&p, std::slice::from_ref(&spec), Some(8));
                e.preload(0).unwrap();
                e.submit(0, JobSpec { id: 0, model: 0, prompt_tokens: 8, output_tokens: out, prompt: PromptChain::EMPTY }).unwrap();
                for id in 1..=n {
                    e.submit(0, JobSpec { id, model: 0, prompt_tokens: 8, output_tokens: other_out, prompt: PromptChain::EMPTY }).unwrap();
                }
                finished(&drain(&mut e))[&0].finished_us
            };
            let alone = run(0);
            let crowded = run(others);
            prop_assert!(crowded >= alone);
            if others > 0 { prop_assert!(run(others - 1) <= crowded); }
        }

        #[test]
        fn work_is_conserved_no_idle_slot_while_jobs_queue(
            jobs in arb_jobs(), slots in 1u32..5,
        ) {
            let p = HardwareProfile::rtx4090();
            let specs = [ModelSpec::guess("a:1b"), ModelSpec::guess("b:3b"), ModelSpec::guess("c:8b")];
            let mut e = EngineModel::new(&p, &specs, Some(slots));
            let mut arrivals: Vec<_> = jobs.iter().enumerate()
                .map(|(i, &(at, m, pt, ot))| (at, JobSpec { id: i as u64, model: usize::from(m), prompt_tokens: pt, output_tokens: ot, prompt: PromptChain::EMPTY }))
                .collect();
            arrivals.sort_by_key(|a| a.0);
            let mut events = Vec::new();
            for (at, job) in arrivals.iter().cloned() {
                e.submit(at, job).unwrap();
                let w = e.workload(at);
                prop_assert!(w.queued == 0 || w.running == slots);
            }
            while let Some(t) = e.next_event_at() {
                e.advance(t, &mut events);
                let w = e.workload(t);
                prop_assert!(w.queued == 0 || w.running == slots);
            }
            // Busy time never exceeds elapsed time.
            prop_assert!(e.busy_us(e.now_us()) <= e.now_us());
        }
    }
}
