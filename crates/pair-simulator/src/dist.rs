//! Random distributions for workload generation: lengths, think times, gaps.
//!
//! Written here (inverse CDF and Box-Muller) rather than pulled from
//! `rand_distr` so that a seed gives the same numbers on every platform and
//! every dependency upgrade: the simulator's output must be byte-identical
//! for a seed.

use rand::Rng;

/// A distribution of non-negative values, clamped to `[min, max]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dist {
    pub shape: Shape,
    pub min: f64,
    pub max: f64,
}

/// The shape of a [`Dist`] before clamping.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Shape {
    Fixed(f64),
    Uniform {
        lo: f64,
        hi: f64,
    },
    Exponential {
        mean: f64,
    },
    /// `exp(N(mu, sigma))`; `mu = ln(median)`.
    LogNormal {
        mu: f64,
        sigma: f64,
    },
    /// Pareto type I: `scale / U^(1/alpha)`, heavy-tailed for small alpha.
    Pareto {
        scale: f64,
        alpha: f64,
    },
}

impl Dist {
    pub const fn fixed(v: f64) -> Self {
        Dist {
            shape: Shape::Fixed(v),
            min: 0.0,
            max: f64::MAX,
        }
    }

    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> f64 {
        let v = match self.shape {
            Shape::Fixed(v) => v,
            Shape::Uniform { lo, hi } => lo + (hi - lo) * unit_open(rng),
            Shape::Exponential { mean } => exponential(rng, mean),
            Shape::LogNormal { mu, sigma } => (mu + sigma * standard_normal(rng)).exp(),
            Shape::Pareto { scale, alpha } => scale / unit_open(rng).powf(1.0 / alpha),
        };
        v.clamp(self.min, self.max)
    }

    /// A sample rounded to a whole count of at least `floor`.
    pub fn sample_count<R: Rng + ?Sized>(&self, rng: &mut R, floor: u32) -> u32 {
        let v = self.sample(rng).round();
        // Clamped by `max` already; the cast saturates anyway.
        (v as u32).max(floor)
    }

    /// The distribution's median before clamping (for documentation output).
    pub fn median(&self) -> f64 {
        let m = match self.shape {
            Shape::Fixed(v) => v,
            Shape::Uniform { lo, hi } => (lo + hi) / 2.0,
            Shape::Exponential { mean } => mean * std::f64::consts::LN_2,
            Shape::LogNormal { mu, .. } => mu.exp(),
            Shape::Pareto { scale, alpha } => scale * 2f64.powf(1.0 / alpha),
        };
        m.clamp(self.min, self.max)
    }
}

/// Uniform in (0, 1]: never 0, so logarithms and powers stay finite.
pub fn unit_open<R: Rng + ?Sized>(rng: &mut R) -> f64 {
    // 53 random bits, shifted so that 0 maps to 2^-53 and the top to 1.
    let bits = rng.next_u64() >> 11;
    (bits as f64 + 1.0) * (1.0 / (1u64 << 53) as f64)
}

/// Exponential with the given mean (inverse CDF).
pub fn exponential<R: Rng + ?Sized>(rng: &mut R, mean: f64) -> f64 {
    -mean * unit_open(rng).ln()
}

/// Standard normal by Box-Muller (one value per call; the twin is dropped to
/// keep the generator stateless).
pub fn standard_normal<R: Rng + ?Sized>(rng: &mut R) -> f64 {
    let u1 = unit_open(rng);
    let u2 = unit_open(rng);
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn mean_of(d: &Dist, n: usize) -> f64 {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        (0..n).map(|_| d.sample(&mut rng)).sum::<f64>() / n as f64
    }

    #[test]
    fn exponential_mean_is_close() {
        let d = Dist {
            shape: Shape::Exponential { mean: 10.0 },
            min: 0.0,
            max: f64::MAX,
        };
        let m = mean_of(&d, 100_000);
        assert!((m - 10.0).abs() < 0.2, "mean {m}");
    }

    #[test]
    fn lognormal_median_is_close() {
        let d = Dist {
            shape: Shape::LogNormal {
                mu: 300f64.ln(),
                sigma: 1.0,
            },
            min: 0.0,
            max: f64::MAX,
        };
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut v: Vec<f64> = (0..50_001).map(|_| d.sample(&mut rng)).collect();
        v.sort_by(f64::total_cmp);
        let median = v[25_000];
        assert!((median - 300.0).abs() < 10.0, "median {median}");
        assert!((d.median() - 300.0).abs() < 1e-9);
    }

    #[test]
    fn pareto_has_a_heavy_tail_above_its_scale() {
        let d = Dist {
            shape: Shape::Pareto {
                scale: 50.0,
                alpha: 1.2,
            },
            min: 0.0,
            max: f64::MAX,
        };
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let v: Vec<f64> = (0..20_000).map(|_| d.sample(&mut rng)).collect();
        assert!(v.iter().all(|x| *x >= 50.0));
        // P(X > 10 * scale) = 10^-1.2, about 6 %.
        let tail = v.iter().filter(|x| **x > 500.0).count() as f64 / v.len() as f64;
        assert!((0.04..0.09).contains(&tail), "tail {tail}");
    }

    proptest! {
        #[test]
        fn samples_respect_clamps(seed in any::<u64>(), lo in 0.0f64..100.0, span in 0.0f64..1000.0) {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            for shape in [
                Shape::Fixed(5.0),
                Shape::Uniform { lo: 0.0, hi: 2000.0 },
                Shape::Exponential { mean: 300.0 },
                Shape::LogNormal { mu: 5.0, sigma: 2.0 },
                Shape::Pareto { scale: 1.0, alpha: 0.5 },
            ] {
                let d = Dist { shape, min: lo, max: lo + span };
                let x = d.sample(&mut rng);
                prop_assert!(x >= lo && x <= lo + span && x.is_finite());
            }
        }

        #[test]
        fn same_seed_same_samples(seed in any::<u64>()) {
            let d = Dist { shape: Shape::LogNormal { mu: 4.0, sigma: 1.5 }, min: 1.0, max: 1e6 };
            let mut a = ChaCha8Rng::seed_from_u64(seed);
            let mut b = ChaCha8Rng::seed_from_u64(seed);
            for _ in 0..16 {
                prop_assert_eq!(d.sample(&mut a).to_bits(), d.sample(&mut b).to_bits());
            }
        }
    }
}
