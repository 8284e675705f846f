//! Hardware profiles as data: how fast one machine prefills and decodes, how
//! batching scales, how much memory it has and how fast it loads weights.
//!
//! Figures come from `docs/engine-figures.md` (cited per field as
//! §N plus the label there: M measured, P published, C community, E estimate).
//! A profile is stated for a *reference model size*; [`HardwareProfile::rates`]
//! scales it to any model by weight bytes, because decode is bound by memory
//! bandwidth (tg ≈ k × bandwidth / weight bytes, §2 rule of thumb) and prefill
//! by compute, which for one quantisation also grows with the weight count.

use serde::{Deserialize, Serialize};

use crate::EmulatorError;

/// Aggregate decode throughput of `n` streams decoding together, relative to
/// one stream alone: `(n, factor)` points with linear interpolation between
/// them and the last segment's slope beyond the last point.
///
/// Built only through [`BatchScaling::new`], which checks the two properties
/// the engine model relies on: the aggregate never falls as streams are added,
/// and a single stream never gets faster because others joined.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "Vec<(u32, f64)>", into = "Vec<(u32, f64)>")]
pub struct BatchScaling {
    points: Vec<(u32, f64)>,
    /// Slope (aggregate factor per extra stream) past the last point.
    tail_slope: f64,
}

impl BatchScaling {
    /// llama.cpp batched matmul on an RTX 3090, 8B Q4_0: 1.0/1.8/3.0/3.7× at
    /// 1/2/4/8 streams (§4, P: llama.cpp PR #15802).
    pub fn llama_cpp_gpu() -> Self {
        Self::from_checked(vec![(1, 1.0), (2, 1.8), (4, 3.0), (8, 3.7)])
    }

    /// CPU decode is partly compute-bound, so batching gains much less
    /// (E: no published figure; §2 notes CPUs prefill only 5–10× faster than
    /// they decode, i.e. there is little idle compute to batch into).
    pub fn cpu() -> Self {
        Self::from_checked(vec![(1, 1.0), (2, 1.3), (4, 1.5)])
    }

    /// No gain at all: streams take turns (llama-cpp-python, §1 and §4).
    pub fn flat() -> Self {
        Self::from_checked(vec![(1, 1.0)])
    }

    pub fn new(mut points: Vec<(u32, f64)>) -> Result<Self, EmulatorError> {
        let bad = |reason: &'static str| Err(EmulatorError::BadScaling { reason });
        points.sort_by_key(|p| p.0);
        match points.first() {
            Some(&(1, f)) if (f - 1.0).abs() < 1e-9 => {}
            _ => return bad("the first point must be (1, 1.0)"),
        }
        for w in points.windows(2) {
            let ((n1, a1), (n2, a2)) = (w[0], w[1]);
            if n1 == n2 {
                return bad("two points for the same stream count");
            }
            if !(a2.is_finite() && a2 >= a1) {
                return bad("aggregate throughput must not fall as streams are added");
            }
            if a2 / f64::from(n2) > a1 / f64::from(n1) + 1e-12 {
                return bad("a stream must not get faster when others join");
            }
        }
        Ok(Self::from_checked(points))
    }

    fn from_checked(points: Vec<(u32, f64)>) -> Self {
        let tail_slope = match points.as_slice() {
            [.., (n1, a1), (n2, a2)] => (a2 - a1) / f64::from(n2 - n1),
            _ => 0.0,
        };
        Self { points, tail_slope }
    }

    /// Aggregate factor at `n` streams (`n` = 0 gives 0).
    pub fn aggregate(&self, n: u32) -> f64 {
        if n == 0 {
            return 0.0;
        }
        let mut prev = (1u32, 1.0f64);
        for &(pn, pa) in &self.points {
            if n == pn {
                return pa;
            }
            if n < pn {
                let t = f64::from(n - prev.0) / f64::from(pn - prev.0);
                return prev.1 + t * (pa - prev.1);
            }
            prev = (pn, pa);
        }
        prev.1 + self.tail_slope * f64::from(n - prev.0)
    }

    /// Speed of each stream at `n` streams, relative to one stream alone.
    pub fn per_stream(&self, n: u32) -> f64 {
        if n == 0 {
            1.0
        } else {
            self.aggregate(n) / f64::from(n)
        }
    }

    pub fn points(&self) -> &[(u32, f64)] {
        &self.points
    }
}

impl TryFrom<Vec<(u32, f64)>> for BatchScaling {
    type Error = EmulatorError;
    fn try_from(points: Vec<(u32, f64)>) -> Result<Self, Self::Error> {
        Self::new(points)
    }
}

impl From<BatchScaling> for Vec<(u32, f64)> {
    fn from(s: BatchScaling) -> Self {
        s.points
    }
}

/// One machine running one inference engine.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HardwareProfile {
    pub name: String,
    /// Weight bytes of the model the rates below were measured on.
    pub reference_model_bytes: u64,
    /// Prompt tokens per second on the reference model.
    pub prefill_tps: f64,
    /// Tokens per second of one stream decoding alone on the reference model.
    pub decode_tps: f64,
    pub batch_scaling: BatchScaling,
    /// Sequences decoded at once (OLLAMA_NUM_PARALLEL, llama-server `-np`).
    pub slots: u32,
    /// Memory models can be loaded into (VRAM, or RAM on CPU-only boxes).
    pub memory_bytes: u64,
    /// Weight bytes per second when loading a model.
    pub load_bytes_per_s: f64,
    /// Fixed part of a cold load (runner start-up), microseconds.
    pub load_fixed_us: u64,
    /// Fixed cost of every request (HTTP, template, scheduling), microseconds.
    pub request_overhead_us: u64,
}

/// A profile's rates for one model size.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ModelRates {
    pub prefill_tps: f64,
    pub decode_tps: f64,
    pub load_us: u64,
    pub overhead_us: u64,
}

impl ModelRates {
    /// The rates an engine running at `time_scale` (wall seconds per
    /// modelled second) shows on the wall clock.
    #[must_use]
    pub fn at_time_scale(&self, time_scale: f64) -> ModelRates {
        let s = if time_scale.is_finite() && time_scale > 0.0 {
            time_scale
        } else {
            1.0
        };
        ModelRates {
            prefill_tps: self.prefill_tps / s,
            decode_tps: self.decode_tps / s,
            load_us: (self.load_us as f64 * s) as u64,
            overhead_us: (self.overhead_us as f64 * s) as u64,
        }
    }

    /// The same figures in pair-core's vocabulary, to seed a scheduler.
    pub fn to_perf(&self) -> pair_core::ModelPerf {
        let ms = |us: u64| u32::try_from(us / 1_000).unwrap_or(u32::MAX);
        // Rounded to the nearest millisecond, so a 15 ms overhead stays 15.
        pair_core::ModelPerf {
            prefill_tps: self.prefill_tps as f32,
            decode_tps: self.decode_tps as f32,
            load_ms: ms(self.load_us),
            overhead_ms: ms(self.overhead_us + 500),
            // Learned from the engine's requests, not claimed up front.
            batch_exponent: None,
        }
    }
}

/// Llama 3 8B Q4_K_M: 4.58 GiB on disk (§2, "4.9 GB of weights").
const LLAMA3_8B_Q4KM: u64 = 4_920_000_000;
const GIB: u64 = 1 << 30;

impl HardwareProfile {
    /// Names of the shipped profiles, for CLIs and error messages.
    pub const NAMES: [&'static str; 6] = [
        "rtx4090",
        "rtx3060",
        "laptop",
        "m3-max",
        "cpu",
        "cpu-smollm2-135m",
    ];

    /// Desktop RTX 4090 24 GB.
    pub fn rtx4090() -> Self {
        Self {
            name: "rtx4090".into(),
            reference_model_bytes: LLAMA3_8B_Q4KM,
            // §2 P: XiongjieDai GPU-Benchmarks-on-LLM-Inference, pp512 / tg512.
            prefill_tps: 7_139.0,
            decode_tps: 130.6,
            batch_scaling: BatchScaling::llama_cpp_gpu(),
            // §4 P: llama-server auto = 4 slots.
            slots: 4,
            memory_bytes: 24 * GIB,
            // §2 E: NVMe at ~2.5 GB/s (≈2 s for 4.6 GB).
            load_bytes_per_s: 2.5e9,
            load_fixed_us: 300_000,
            // E: template + scheduling + first kernel launch.
            request_overhead_us: 15_000,
        }
    }

    /// Desktop RTX 3060 12 GB.
    pub fn rtx3060() -> Self {
        Self {
            name: "rtx3060".into(),
            reference_model_bytes: LLAMA3_8B_Q4KM,
            // §2 E: pp = 3070's 2,402 × 28/46 SMs; tg = 3080's 109.6 × 360/760
            // GB/s (≈48, and the P figure 122.9 tok/s on a 2 GB 3B model
            // scales to 50 on this size).
            prefill_tps: 1_400.0,
            decode_tps: 48.0,
            batch_scaling: BatchScaling::llama_cpp_gpu(),
            slots: 4,
            memory_bytes: 12 * GIB,
            // §2 E: SATA/NVMe mix, slower than the 4090 box.
            load_bytes_per_s: 1.5e9,
            load_fixed_us: 300_000,
            request_overhead_us: 20_000,
        }
    }

    /// A laptop: Apple M2 Pro / M3 Pro class, 16 GB unified memory.
    pub fn laptop() -> Self {
        Self {
            name: "laptop".into(),
            reference_model_bytes: LLAMA3_8B_Q4KM,
            // §2 E: scaled from the M3 Max (tg by bandwidth 150–200 vs 400
            // GB/s, pp by GPU cores 18–19 vs 40).
            prefill_tps: 300.0,
            decode_tps: 21.0,
            // E: same batching shape as llama.cpp on GPUs (§4).
            batch_scaling: BatchScaling::llama_cpp_gpu(),
            // §3 P: Ollama default OLLAMA_NUM_PARALLEL = 1.
            slots: 1,
            // E: macOS lets the GPU wire about 2/3 of 16 GB.
            memory_bytes: 10 * GIB + GIB / 2,
            // E: internal SSD, ~3 GB/s.
            load_bytes_per_s: 3.0e9,
            load_fixed_us: 400_000,
            request_overhead_us: 25_000,
        }
    }

    /// MacBook Pro M3 Max, 40-core GPU, 64 GB.
    pub fn m3_max() -> Self {
        Self {
            name: "m3-max".into(),
            reference_model_bytes: LLAMA3_8B_Q4KM,
            // §2 P: XiongjieDai README.
            prefill_tps: 693.0,
            decode_tps: 49.0,
            batch_scaling: BatchScaling::llama_cpp_gpu(),
            slots: 4,
            // E: ~3/4 of 64 GB usable by the GPU.
            memory_bytes: 48 * GIB,
            load_bytes_per_s: 3.0e9,
            load_fixed_us: 400_000,
            request_overhead_us: 20_000,
        }
    }

    /// CPU-only desktop: 6-core Intel i5-9500, 16 GB.
    pub fn cpu() -> Self {
        Self {
            name: "cpu".into(),
            reference_model_bytes: LLAMA3_8B_Q4KM,
            // §2 C: normiebench issue #34.
            prefill_tps: 35.4,
            decode_tps: 6.5,
            batch_scaling: BatchScaling::cpu(),
            // §3 P: Ollama default.
            slots: 1,
            // E: 16 GB minus the OS.
            memory_bytes: 12 * GIB,
            load_bytes_per_s: 1.5e9,
            load_fixed_us: 300_000,
            request_overhead_us: 30_000,
        }
    }

    /// The measured box of §1: 2 vCPU EPYC, llama-cpp-python 0.3.36,
    /// SmolLM2-135M-Instruct Q4_1 (all M unless marked).
    pub fn cpu_smollm2_135m() -> Self {
        Self {
            name: "cpu-smollm2-135m".into(),
            reference_model_bytes: 98_362_432,
            // §1 profile seed: ≈390 tok/s (fit: 0.03 s + 2.65 ms/token).
            prefill_tps: 390.0,
            // §1: 126 tok/s median at one stream.
            decode_tps: 126.0,
            // §1: one global lock, streams take turns.
            batch_scaling: BatchScaling::flat(),
            slots: 1,
            // §1: 23 GiB RAM.
            memory_bytes: 23 * GIB,
            // §1: cold start 0.55 s; the split between start-up and reading
            // 98 MB (page cache, ~1 GB/s) is E.
            load_bytes_per_s: 1.0e9,
            load_fixed_us: 450_000,
            // §1: the TTFT fit's intercept.
            request_overhead_us: 30_000,
        }
    }

    /// Every shipped profile.
    pub fn shipped() -> Vec<Self> {
        vec![
            Self::rtx4090(),
            Self::rtx3060(),
            Self::laptop(),
            Self::m3_max(),
            Self::cpu(),
            Self::cpu_smollm2_135m(),
        ]
    }

    /// A shipped profile by name.
    pub fn by_name(name: &str) -> Result<Self, EmulatorError> {
        Self::shipped()
            .into_iter()
            .find(|p| p.name.eq_ignore_ascii_case(name))
            .ok_or_else(|| EmulatorError::UnknownProfile {
                name: name.to_owned(),
            })
    }

    /// Rates for a model of `model_bytes` weight bytes: decode and prefill
    /// scale inversely with size relative to the reference model.
    pub fn rates(&self, model_bytes: u64) -> ModelRates {
        let size = model_bytes.max(1) as f64;
        let factor = self.reference_model_bytes.max(1) as f64 / size;
        ModelRates {
            prefill_tps: self.prefill_tps * factor,
            decode_tps: self.decode_tps * factor,
            load_us: self.load_fixed_us + (size / self.load_bytes_per_s * 1e6) as u64,
            overhead_us: self.request_overhead_us,
        }
    }
}

/// A model an engine holds: its name and weight bytes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ModelSpec {
    pub name: String,
    pub size_bytes: u64,
}

impl ModelSpec {
    pub fn new(name: impl Into<String>, size_bytes: u64) -> Self {
        Self {
            name: name.into(),
            size_bytes,
        }
    }

    /// A spec whose size is guessed from the parameter count in the name
    /// (`llama3.1:8b`, `qwen2.5:0.5b`, `smollm2:135m`) at Q4_K_M's ~0.61
    /// bytes per weight; names without one are taken as 8B models.
    pub fn guess(name: impl Into<String>) -> Self {
        let name = name.into();
        let size_bytes = guess_params(&name)
            .map(|p| (p * 0.615) as u64)
            .unwrap_or(LLAMA3_8B_Q4KM);
        Self { name, size_bytes }
    }
}

impl From<&str> for ModelSpec {
    fn from(name: &str) -> Self {
        Self::guess(name)
    }
}

impl From<String> for ModelSpec {
    fn from(name: String) -> Self {
        Self::guess(name)
    }
}

/// The parameter count spelled in a model name, e.g. `8b`, `0.5b`, `135m`.
fn guess_params(name: &str) -> Option<f64> {
    let lower = name.to_ascii_lowercase();
    let bytes = lower.as_bytes();
    let mut best = None;
    let mut i = 0;
    while i < bytes.len() {
        let starts_number =
            bytes[i].is_ascii_digit() && (i == 0 || !bytes[i - 1].is_ascii_alphanumeric());
        if starts_number {
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_digit() || bytes[i] == b'.') {
                i += 1;
            }
            let unit = bytes.get(i).copied();
            let ends = bytes.get(i + 1).is_none_or(|c| !c.is_ascii_alphanumeric());
            let scale = match unit {
                Some(b'b') if ends => Some(1e9),
                Some(b'm') if ends => Some(1e6),
                _ => None,
            };
            if let (Some(scale), Ok(v)) = (scale, lower[start..i].parse::<f64>()) {
                best = Some(v * scale);
            }
        } else {
            i += 1;
        }
    }
    best
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn scaling_interpolates_and_extrapolates() {
        let s = BatchScaling::llama_cpp_gpu();
        assert_eq!(s.aggregate(1), 1.0);
        assert_eq!(s.aggregate(4), 3.0);
        assert!((s.aggregate(3) - 2.4).abs() < 1e-9);
        assert!((s.aggregate(16) - (3.7 + 0.175 * 8.0)).abs() < 1e-9);
        for n in 1..64 {
            assert!(s.per_stream(n + 1) <= s.per_stream(n) + 1e-12);
            assert!(s.aggregate(n + 1) >= s.aggregate(n));
        }
        assert_eq!(BatchScaling::flat().aggregate(7), 1.0);
    }

    #[test]
    fn scaling_rejects_superlinear_and_falling_tables() {
        assert!(BatchScaling::new(vec![(1, 1.0), (2, 2.5)]).is_err());
        assert!(BatchScaling::new(vec![(1, 1.0), (2, 0.5)]).is_err());
        assert!(BatchScaling::new(vec![(2, 1.0)]).is_err());
        assert!(BatchScaling::new(vec![(1, 1.0), (1, 1.0)]).is_err());
        let json = serde_json::to_string(&BatchScaling::cpu()).unwrap();
        let back: BatchScaling = serde_json::from_str(&json).unwrap();
        assert_eq!(back, BatchScaling::cpu());
        assert!(serde_json::from_str::<BatchScaling>("[[1,1.0],[2,3.0]]").is_err());
    }

    proptest::proptest! {
        #[test]
        fn accepted_tables_never_speed_a_stream_up(
            points in proptest::collection::vec((2u32..64, 1.0f64..40.0), 0..6),
        ) {
            let mut all = vec![(1, 1.0)];
            all.extend(points);
            if let Ok(s) = BatchScaling::new(all) {
                for n in 1..80 {
                    proptest::prop_assert!(s.aggregate(n + 1) >= s.aggregate(n) - 1e-9);
                    proptest::prop_assert!(s.per_stream(n + 1) <= s.per_stream(n) + 1e-9);
                }
            }
        }
    }

    #[test]
    fn rates_scale_with_weight_bytes() {
        let p = HardwareProfile::rtx4090();
        let big = p.rates(LLAMA3_8B_Q4KM);
        assert_eq!(big.decode_tps, 130.6);
        let small = p.rates(LLAMA3_8B_Q4KM / 2);
        assert!((small.decode_tps - 261.2).abs() < 1e-9);
        assert!(small.load_us < big.load_us);
        // §1: the measured box cold-starts in about 0.55 s.
        let m = HardwareProfile::cpu_smollm2_135m();
        let r = m.rates(m.reference_model_bytes);
        assert!((500_000..600_000).contains(&r.load_us), "{}", r.load_us);
    }

    #[test]
    fn shipped_profiles_are_found_by_name() {
        for name in HardwareProfile::NAMES {
            assert_eq!(HardwareProfile::by_name(name).unwrap().name, name);
        }
        assert!(HardwareProfile::by_name("tpu").is_err());
    }

    #[test]
    fn model_sizes_are_guessed_from_names() {
        assert_eq!(ModelSpec::guess("llama3.1:8b").size_bytes, 4_920_000_000);
        assert_eq!(ModelSpec::guess("qwen2.5:0.5b").size_bytes, 307_500_000);
        assert_eq!(ModelSpec::guess("smollm2:135m").size_bytes, 83_025_000);
        assert_eq!(ModelSpec::guess("llama3").size_bytes, LLAMA3_8B_Q4KM);
        assert_eq!(
            ModelSpec::guess("mistral-7b-instruct").size_bytes,
            4_305_000_000
        );
    }
}
