//! PAIR's pressure signal, replicated for the simulator: an EWMA of GPU
//! utilisation (alpha 0.35) mapped to bands 0..=3 at 40/70/85 %, stepping
//! down only below 35/65/80 % (hysteresis).
//!
//! The band rule itself is pair-telemetry's (`band_for`), the one real nodes
//! run; this module adds the simulator's virtual-time bookkeeping.

use pair_core::Pressure;

/// PAIR's EWMA weight of the newest sample.
pub const PAIR_EWMA_ALPHA: f64 = 0.35;
/// Utilisation (percent) at which the band steps up to 1, 2, 3.
pub const PAIR_BAND_UP: [f64; 3] = [40.0, 70.0, 85.0];
/// Utilisation (percent) below which the band steps down from 1, 2, 3.
pub const PAIR_BAND_DOWN: [f64; 3] = [35.0, 65.0, 80.0];

/// One node's pressure state as its telemetry loop keeps it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PairPressure {
    ewma: Option<f64>,
    band: u8,
}

impl PairPressure {
    /// Feeds one utilisation sample (percent, clamped to 0..=100) and returns
    /// the new band.
    pub fn sample(&mut self, utilisation_pct: f64) -> Pressure {
        let u = if utilisation_pct.is_finite() {
            utilisation_pct.clamp(0.0, 100.0)
        } else {
            0.0
        };
        let ewma = match self.ewma {
            None => u,
            Some(prev) => PAIR_EWMA_ALPHA * u + (1.0 - PAIR_EWMA_ALPHA) * prev,
        };
        self.ewma = Some(ewma);
        self.band = pair_pressure_band(self.band, ewma);
        self.pressure()
    }

    pub fn pressure(&self) -> Pressure {
        Pressure::new(self.band).unwrap_or(Pressure::UNKNOWN)
    }

    pub fn ewma(&self) -> Option<f64> {
        self.ewma
    }
}

/// The band after `prev` given the smoothed utilisation, with hysteresis
/// (pair-telemetry's rule, as nodes run it).
pub fn pair_pressure_band(prev: u8, ewma_pct: f64) -> u8 {
    let prev = Pressure::new(prev.min(3)).unwrap_or(Pressure::MAX);
    pair_telemetry::band_for(prev, ewma_pct).band()
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
    use proptest::prelude::*;

    #[test]
    fn bands_step_up_at_40_70_85_and_down_at_35_65_80() {
        assert_eq!(pair_pressure_band(0, 39.9), 0);
        assert_eq!(pair_pressure_band(0, 40.0), 1);
        assert_eq!(pair_pressure_band(0, 86.0), 3);
        assert_eq!(pair_pressure_band(1, 36.0), 1);
        assert_eq!(pair_pressure_band(1, 34.9), 0);
        assert_eq!(pair_pressure_band(3, 81.0), 3);
        assert_eq!(pair_pressure_band(3, 79.0), 2);
        assert_eq!(pair_pressure_band(3, 10.0), 0);
        assert_eq!(pair_pressure_band(2, 67.0), 2);
    }

    #[test]
    fn ewma_smooths_with_alpha_035() {
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

    proptest! {
        #[test]
        fn band_is_consistent_with_thresholds(prev in 0u8..=3, u in 0.0f64..100.0) {
            let b = pair_pressure_band(prev, u);
            prop_assert!(b <= 3);
            // Never above what the rising thresholds allow, never below what
            // the falling thresholds force.
            let rising = PAIR_BAND_UP.iter().filter(|t| u >= **t).count() as u8;
            let falling = PAIR_BAND_DOWN.iter().filter(|t| u >= **t).count() as u8;
            prop_assert!(b >= rising);
            prop_assert!(b <= falling.max(rising));
            // Idempotent: the same reading again changes nothing.
            prop_assert_eq!(pair_pressure_band(b, u), b);
        }
    }
}
