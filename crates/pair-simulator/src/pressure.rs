//! PAIR's pressure signal in the simulator: an EWMA of GPU utilisation
//! (alpha 0.35) mapped to bands 0..=3 at 40/70/85 %, stepping down only
//! below 35/65/80 % (hysteresis). The tracker is pair-core's, the one real
//! nodes' telemetry runs; this module adds clamping of the model's
//! utilisation and the router-side staleness rule in virtual time.

use pair_core::{Pressure, PressureTracker, Sample};

/// One node's pressure state as its telemetry loop keeps it: the tracker
/// real nodes run (EWMA alpha 0.35, bands at 40/70/85 %, hysteresis), fed in
/// virtual time; staleness is judged router-side by [`pair_pressure_seen`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PairPressure {
    tracker: PressureTracker,
}

impl PairPressure {
    /// Feeds one utilisation sample (percent, clamped to 0..=100; the model
    /// can overshoot) and returns the new band.
    pub fn sample(&mut self, utilisation_pct: f64) -> Pressure {
        let u = if utilisation_pct.is_finite() {
            utilisation_pct.clamp(0.0, 100.0)
        } else {
            0.0
        };
        // One timestamp for every sample: the tracker's own staleness never
        // fires here.
        self.tracker.observe(0, Sample::Utilisation(u))
    }

    pub fn pressure(&self) -> Pressure {
        self.tracker.band()
    }

    pub fn ewma(&self) -> Option<f64> {
        self.tracker.ewma_pct()
    }
}

/// What the router uses: the band, or PAIR's "unknown" (1) when the latest
/// sample is older than `stale_after` or there is none.
pub fn pair_pressure_seen(
    band: Option<Pressure>,
    sampled_at: u64,
    now: u64,
    stale_after: u64,
) -> Pressure {
    match band {
        Some(p) if now.saturating_sub(sampled_at) <= stale_after => p,
        _ => Pressure::UNKNOWN,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ewma_smooths_with_alpha_035() {
        let mut p = PairPressure::default();
        // Out-of-range model output is clamped, not dropped.
        assert_eq!(p.sample(130.0).band(), 3);
        let mut p = PairPressure::default();
        assert_eq!(p.sample(100.0).band(), 3);
        p.sample(0.0);
        assert!((p.ewma().unwrap() - 65.0).abs() < 1e-9);
        // 65 % is below 80 (leave band 3) but not below 65 (stay in 2).
        assert_eq!(p.pressure().band(), 2);
    }

    #[test]
    fn stale_or_missing_telemetry_is_unknown() {
        let p = Pressure::new(3);
        assert_eq!(pair_pressure_seen(p, 0, 10, 10).band(), 3);
        assert_eq!(pair_pressure_seen(p, 0, 11, 10), Pressure::UNKNOWN);
        assert_eq!(pair_pressure_seen(None, 0, 0, 10), Pressure::UNKNOWN);
    }
}
