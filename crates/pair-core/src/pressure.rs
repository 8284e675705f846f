//! Pure pressure core: EWMA of utilisation, bands 0-3 with hysteresis,
//! staleness, and the [`Telemetry`] value pair-telemetry's sampler publishes.
//!
//! It lives here rather than in pair-telemetry so that readers of the rule
//! and of the value (discovery, the simulator) need no probes, runtime or
//! HTTP. No clock here: every call takes `now_ms` (milliseconds since the
//! Unix epoch, like the rest of pair-core), so the rule is tested without
//! time.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::snapshot::{GpuDevice, Pressure};

/// Smoothing factor of the utilisation EWMA (PAIR's value).
pub const EWMA_ALPHA: f64 = 0.35;
/// Telemetry older than this counts as [`Pressure::UNKNOWN`] (PAIR's value).
pub const STALE_AFTER: Duration = Duration::from_secs(10);

/// Thresholds to step up into band 1, 2, 3 (percent).
const UP: [f64; 3] = [40.0, 70.0, 85.0];
/// Thresholds below which band 1, 2, 3 step down (percent). Each is 5 points
/// under its step-up twin, so a signal wobbling around a threshold holds.
const DOWN: [f64; 3] = [35.0, 65.0, 80.0];

/// The band a smoothed utilisation lands in, coming from band `previous`.
///
/// Steps up while the value reaches the next step-up threshold and down while
/// it is under the current band's step-down threshold. Because every
/// step-down threshold is below its step-up twin, the result is a fixed
/// point: feeding it back with the same value gives the same band.
pub fn band_for(previous: Pressure, utilisation_pct: f64) -> Pressure {
    let mut band = usize::from(previous.band());
    while band < 3 && utilisation_pct >= UP[band] {
        band += 1;
    }
    while band > 0 && utilisation_pct < DOWN[band - 1] {
        band -= 1;
    }
    // band is at most 3 by construction.
    Pressure::new(band as u8).unwrap_or(Pressure::MAX)
}

/// Tuning of the pressure rule; the defaults are PAIR's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PressureConfig {
    pub alpha: f64,
    pub stale_after: Duration,
}

impl Default for PressureConfig {
    fn default() -> Self {
        Self {
            alpha: EWMA_ALPHA,
            stale_after: STALE_AFTER,
        }
    }
}

/// One reading of the compute signal.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Sample {
    /// Utilisation in percent; values outside 0..=100 or NaN are invalid.
    Utilisation(f64),
    /// The probe failed or returned nothing usable.
    Invalid,
}

/// Which figure drives a node's compute pressure.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ComputeSource {
    /// The busiest GPU's utilisation (PAIR's rule).
    Gpu,
    /// No GPU: host CPU utilisation.
    #[default]
    Cpu,
}

/// EWMA + hysteresis state for one node.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PressureTracker {
    config: PressureConfig,
    ewma: Option<f64>,
    band: Pressure,
    /// When the last valid sample arrived.
    last_valid_ms: Option<u64>,
    /// Whether the most recent sample was invalid.
    last_invalid: bool,
}

impl PressureTracker {
    pub fn new(config: PressureConfig) -> Self {
        Self {
            config,
            ewma: None,
            band: Pressure::IDLE,
            last_valid_ms: None,
            last_invalid: false,
        }
    }

    /// Feeds one sample taken at `now_ms`; returns the pressure right after.
    pub fn observe(&mut self, now_ms: u64, sample: Sample) -> Pressure {
        match sample {
            Sample::Utilisation(v) if v.is_finite() && (0.0..=100.0).contains(&v) => {
                let alpha = self.config.alpha.clamp(0.0, 1.0);
                let smoothed = match self.ewma {
                    None => v,
                    Some(prev) => alpha * v + (1.0 - alpha) * prev,
                };
                self.ewma = Some(smoothed);
                self.band = band_for(self.band, smoothed);
                self.last_valid_ms = Some(now_ms);
                self.last_invalid = false;
            }
            // A bad reading neither moves the average nor the band; it makes
            // the node's figure unknown until a good one arrives.
            _ => self.last_invalid = true,
        }
        self.pressure(now_ms)
    }

    /// The pressure to report at `now_ms`: the band, or
    /// [`Pressure::UNKNOWN`] when the latest reading was invalid, there was
    /// none yet, or the last good one is older than `stale_after`.
    pub fn pressure(&self, now_ms: u64) -> Pressure {
        match self.last_valid_ms {
            Some(at) if !self.last_invalid && !is_stale(at, now_ms, self.config.stale_after) => {
                self.band
            }
            _ => Pressure::UNKNOWN,
        }
    }

    /// The smoothed utilisation, percent, if any valid sample was seen.
    pub fn ewma_pct(&self) -> Option<f64> {
        self.ewma
    }

    /// The band ignoring staleness (what hysteresis holds).
    pub fn band(&self) -> Pressure {
        self.band
    }
}

impl Default for PressureTracker {
    fn default() -> Self {
        Self::new(PressureConfig::default())
    }
}

fn is_stale(at_ms: u64, now_ms: u64, stale_after: Duration) -> bool {
    let limit = u64::try_from(stale_after.as_millis()).unwrap_or(u64::MAX);
    now_ms.saturating_sub(at_ms) > limit
}

/// Host figures of one sample.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HostStats {
    /// CPU utilisation over all cores since the previous sample, percent.
    pub cpu_pct: f32,
    pub cpu_count: u32,
    pub mem_used_bytes: u64,
    pub mem_total_bytes: u64,
}

/// One published telemetry reading of a node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Telemetry {
    /// When it was taken, ms since the Unix epoch (0: never sampled).
    pub taken_at_ms: u64,
    /// Host CPU and memory; `None` when they could not be read.
    pub host: Option<HostStats>,
    /// Every GPU with its own figures (PAIR keeps only the busiest).
    pub gpus: Vec<GpuDevice>,
    /// Which signal drives `pressure`.
    pub compute: ComputeSource,
    /// Smoothed utilisation of that signal, percent.
    pub utilisation_ewma_pct: Option<f32>,
    /// Pressure when the reading was taken; readers should prefer
    /// [`Telemetry::pressure_at`], which also applies staleness.
    pub pressure: Pressure,
}

impl Telemetry {
    /// The pressure this reading stands for at `now_ms`: stale readings
    /// (older than [`STALE_AFTER`]) count as [`Pressure::UNKNOWN`].
    pub fn pressure_at(&self, now_ms: u64) -> Pressure {
        if self.taken_at_ms == 0 || is_stale(self.taken_at_ms, now_ms, STALE_AFTER) {
            Pressure::UNKNOWN
        } else {
            self.pressure
        }
    }

    /// Free VRAM summed over GPUs; `None` on a node without GPUs.
    pub fn vram_free_bytes(&self) -> Option<u64> {
        (!self.gpus.is_empty()).then(|| self.gpus.iter().map(GpuDevice::vram_free_bytes).sum())
    }

    /// Total VRAM summed over GPUs; `None` on a node without GPUs.
    pub fn vram_total_bytes(&self) -> Option<u64> {
        (!self.gpus.is_empty()).then(|| self.gpus.iter().map(|g| g.vram_total_bytes).sum())
    }
}

/// The compute signal of one sample: busiest GPU when there are GPUs,
/// otherwise host CPU utilisation. `gpus` is `None` when the GPU probe failed.
pub fn compute_sample(
    gpus: Option<&[GpuDevice]>,
    host: Option<&HostStats>,
) -> (ComputeSource, Sample) {
    match gpus {
        Some(devs) if !devs.is_empty() => {
            let busiest = devs.iter().map(|g| g.utilisation_pct).max().unwrap_or(0);
            (ComputeSource::Gpu, Sample::Utilisation(f64::from(busiest)))
        }
        // A failing GPU probe on a GPU node is unknown, not idle.
        None => (ComputeSource::Gpu, Sample::Invalid),
        Some(_) => match host {
            Some(h) => (
                ComputeSource::Cpu,
                Sample::Utilisation(f64::from(h.cpu_pct)),
            ),
            None => (ComputeSource::Cpu, Sample::Invalid),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn p(b: u8) -> Pressure {
        Pressure::new(b).unwrap()
    }

    #[test]
    fn bands_step_up_at_40_70_85() {
        assert_eq!(band_for(p(0), 39.9), p(0));
        assert_eq!(band_for(p(0), 40.0), p(1));
        assert_eq!(band_for(p(0), 70.0), p(2));
        assert_eq!(band_for(p(0), 85.0), p(3));
        assert_eq!(band_for(p(0), 100.0), p(3));
    }

    #[test]
    fn bands_step_down_at_35_65_80() {
        assert_eq!(band_for(p(3), 80.0), p(3));
        assert_eq!(band_for(p(3), 79.9), p(2));
        assert_eq!(band_for(p(2), 65.0), p(2));
        assert_eq!(band_for(p(2), 64.9), p(1));
        assert_eq!(band_for(p(1), 35.0), p(1));
        assert_eq!(band_for(p(1), 34.9), p(0));
        assert_eq!(band_for(p(3), 0.0), p(0));
    }

    #[test]
    fn ewma_uses_alpha_035() {
        let mut t = PressureTracker::default();
        t.observe(1_000, Sample::Utilisation(100.0));
        t.observe(2_000, Sample::Utilisation(0.0));
        let e = t.ewma_pct().unwrap();
        assert!((e - 65.0).abs() < 1e-9, "{e}");
    }

    #[test]
    fn no_sample_invalid_or_stale_is_unknown() {
        let mut t = PressureTracker::default();
        assert_eq!(t.pressure(0), Pressure::UNKNOWN);
        assert_eq!(t.observe(1_000, Sample::Utilisation(0.0)), Pressure::IDLE);
        assert_eq!(t.pressure(11_000), Pressure::IDLE);
        assert_eq!(t.pressure(11_001), Pressure::UNKNOWN);
        assert_eq!(t.observe(2_000, Sample::Invalid), Pressure::UNKNOWN);
        assert_eq!(
            t.observe(3_000, Sample::Utilisation(f64::NAN)),
            Pressure::UNKNOWN
        );
        assert_eq!(
            t.observe(4_000, Sample::Utilisation(101.0)),
            Pressure::UNKNOWN
        );
        // The bad readings did not move the average.
        assert_eq!(t.ewma_pct(), Some(0.0));
        assert_eq!(t.observe(5_000, Sample::Utilisation(0.0)), Pressure::IDLE);
    }

    #[test]
    fn telemetry_goes_unknown_when_stale() {
        let t = Telemetry {
            taken_at_ms: 1_000,
            pressure: Pressure::MAX,
            ..Telemetry::default()
        };
        assert_eq!(t.pressure_at(5_000), Pressure::MAX);
        assert_eq!(t.pressure_at(11_001), Pressure::UNKNOWN);
        assert_eq!(Telemetry::default().pressure_at(5), Pressure::UNKNOWN);
    }

    #[test]
    fn cpu_only_node_uses_cpu_and_gpu_node_uses_busiest_device() {
        let host = HostStats {
            cpu_pct: 55.0,
            cpu_count: 4,
            mem_used_bytes: 1,
            mem_total_bytes: 2,
        };
        assert_eq!(
            compute_sample(Some(&[]), Some(&host)),
            (ComputeSource::Cpu, Sample::Utilisation(55.0))
        );
        let gpu = |i, u| GpuDevice {
            index: i,
            name: "g".into(),
            utilisation_pct: u,
            vram_used_bytes: 1,
            vram_total_bytes: 10,
        };
        let devs = [gpu(0, 20), gpu(1, 90)];
        assert_eq!(
            compute_sample(Some(&devs), Some(&host)),
            (ComputeSource::Gpu, Sample::Utilisation(90.0))
        );
        assert_eq!(compute_sample(None, Some(&host)).1, Sample::Invalid);
        assert_eq!(compute_sample(Some(&[]), None).1, Sample::Invalid);
        let t = Telemetry {
            gpus: devs.to_vec(),
            ..Telemetry::default()
        };
        assert_eq!(t.vram_free_bytes(), Some(18));
        assert_eq!(t.vram_total_bytes(), Some(20));
        assert_eq!(Telemetry::default().vram_free_bytes(), None);
    }

    proptest! {
        #[test]
        fn bands_are_monotone_in_utilisation(prev in 0u8..=3, a in 0.0f64..=100.0, b in 0.0f64..=100.0) {
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            prop_assert!(band_for(p(prev), lo) <= band_for(p(prev), hi));
        }

        #[test]
        fn band_is_a_fixed_point(prev in 0u8..=3, v in 0.0f64..=100.0) {
            let once = band_for(p(prev), v);
            prop_assert_eq!(band_for(once, v), once);
        }

        #[test]
        fn band_respects_thresholds_whatever_the_history(prev in 0u8..=3, v in 0.0f64..=100.0) {
            let b = band_for(p(prev), v).band();
            // Never above the no-hysteresis step-up band, never below the step-down one.
            let up = UP.iter().filter(|t| v >= **t).count() as u8;
            let down = DOWN.iter().filter(|t| v >= **t).count() as u8;
            prop_assert!(b >= up && b <= down, "v={} b={} up={} down={}", v, b, up, down);
        }

        #[test]
        fn constant_signal_never_flaps(v in 0.0f64..=100.0, start in proptest::collection::vec(0.0f64..=100.0, 0..8), n in 2usize..40) {
            let mut t = PressureTracker::default();
            let mut now = 0;
            for s in start {
                now += 1_000;
                t.observe(now, Sample::Utilisation(s));
            }
            // Once the band has changed direction on a constant input it must
            // not change again: the sequence of bands is monotone.
            let mut bands = Vec::new();
            for _ in 0..n {
                now += 1_000;
                bands.push(t.observe(now, Sample::Utilisation(v)));
            }
            let up = bands.windows(2).all(|w| w[0] <= w[1]);
            let down = bands.windows(2).all(|w| w[0] >= w[1]);
            prop_assert!(up || down, "{:?}", bands);
        }

        #[test]
        fn ewma_stays_within_the_samples(samples in proptest::collection::vec(0.0f64..=100.0, 1..50)) {
            let mut t = PressureTracker::default();
            for (i, s) in samples.iter().enumerate() {
                t.observe(i as u64 * 1_000 + 1, Sample::Utilisation(*s));
            }
            let lo = samples.iter().cloned().fold(f64::INFINITY, f64::min);
            let hi = samples.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e = t.ewma_pct().unwrap();
            prop_assert!(e >= lo - 1e-9 && e <= hi + 1e-9);
        }

        #[test]
        fn pressure_is_unknown_exactly_when_stale_or_invalid(gap in 0u64..30_000, invalid in any::<bool>(), v in 0.0f64..=100.0) {
            let mut t = PressureTracker::default();
            t.observe(1_000, Sample::Utilisation(v));
            if invalid {
                t.observe(1_000, Sample::Invalid);
            }
            let got = t.pressure(1_000 + gap);
            if invalid || gap > 10_000 {
                prop_assert_eq!(got, Pressure::UNKNOWN);
            } else {
                prop_assert_eq!(got, t.band());
            }
        }
    }
}
