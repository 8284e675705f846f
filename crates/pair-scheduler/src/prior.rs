//! What a node's hardware says about its speed on a model before any job
//! has: decode is bound by memory bandwidth (about 0.6 x bandwidth / weight
//! bytes for llama.cpp-family engines, batch 1) and prefill runs some 30x
//! faster on a GPU. Figures and sources: `docs/engine-figures.md` ("Rule
//! of thumb"). A prior only ranks a node nothing
//! has been learned about yet; the first jobs replace it.

use pair_core::{GpuDevice, ModelPerf};

/// Memory bandwidth (GB/s, vendor figures) by a fragment of the GPU's name
/// as NVML (or the simulator's profiles) give it. More specific fragments
/// come first ("4090 D" before "4090" would be; "3060 Ti" before "3060").
const BANDWIDTH_GBPS: &[(&str, f32)] = &[
    ("H200", 4800.0),
    ("H100", 3350.0),
    ("A100", 1935.0),
    ("L40", 864.0),
    ("A6000", 768.0),
    ("5090", 1792.0),
    ("5080", 960.0),
    ("4090", 1008.0),
    ("4080", 717.0),
    ("4070 Ti", 504.0),
    ("4070", 504.0),
    ("4060 Ti", 288.0),
    ("4060", 272.0),
    ("3090", 936.0),
    ("3080", 760.0),
    ("3070", 448.0),
    ("3060 Ti", 448.0),
    ("3060", 360.0),
    ("2080", 448.0),
    ("m3-max", 400.0),
    ("M3 Max", 400.0),
    ("M2 Max", 400.0),
    ("M2 Pro", 200.0),
    ("M3 Pro", 150.0),
];

/// Share of the bandwidth ceiling decode reaches (0.45-0.7 measured).
const DECODE_EFFICIENCY: f32 = 0.6;
/// Prefill over decode speed on a GPU (10-60x measured).
const PREFILL_OVER_DECODE: f32 = 30.0;
/// Weights assumed when the engine does not say (an 8B model at Q4_K_M).
const DEFAULT_WEIGHT_BYTES: u64 = 4_900_000_000;

/// The prior for a model of `size_bytes` on the fastest GPU of `gpus` that
/// the table knows, if any.
pub fn from_hardware(gpus: &[GpuDevice], size_bytes: Option<u64>) -> Option<ModelPerf> {
    let bandwidth = gpus
        .iter()
        .filter_map(|g| bandwidth_of(&g.name))
        .fold(None, |best: Option<f32>, b| {
            Some(best.map_or(b, |x| x.max(b)))
        })?;
    let weights = size_bytes
        .filter(|&b| b > 0)
        .unwrap_or(DEFAULT_WEIGHT_BYTES) as f32;
    let decode = DECODE_EFFICIENCY * bandwidth * 1e9 / weights;
    Some(ModelPerf {
        prefill_tps: decode * PREFILL_OVER_DECODE,
        decode_tps: decode,
        ..ModelPerf::FALLBACK
    })
}

/// The slowest load a healthy machine shows: weights read at 10 MB/s (an
/// SD card, a USB 2 drive, a share over Wi-Fi), after a runner start-up
/// of half a minute. A load is waited for however long it takes on any
/// real disk; the bound only ends a "load" that never finishes.
const LOAD_FLOOR_BYTES_PER_S: u64 = 10_000_000;
const LOAD_STARTUP: std::time::Duration = std::time::Duration::from_secs(30);

/// How long a cold load of a model of `size_bytes` may take on the slowest
/// healthy machine: while an engine is loading the model (it answers its
/// polls and does not list the model loaded yet), a request on it is
/// waited for this long with no other sign of progress; an engine that
/// never finishes is left after it.
pub fn cold_load_bound(size_bytes: Option<u64>) -> std::time::Duration {
    let weights = size_bytes
        .filter(|&b| b > 0)
        .unwrap_or(DEFAULT_WEIGHT_BYTES);
    LOAD_STARTUP + std::time::Duration::from_millis(weights / (LOAD_FLOOR_BYTES_PER_S / 1_000))
}

fn bandwidth_of(name: &str) -> Option<f32> {
    BANDWIDTH_GBPS
        .iter()
        .find(|(fragment, _)| contains_ignoring_case(name, fragment))
        .map(|&(_, b)| b)
}

/// Whether `hay` contains `needle`, ASCII case ignored (no allocation: it
/// runs in ranking).
fn contains_ignoring_case(hay: &str, needle: &str) -> bool {
    let (h, n) = (hay.as_bytes(), needle.as_bytes());
    n.len() <= h.len() && h.windows(n.len()).any(|w| w.eq_ignore_ascii_case(n))
}

#[cfg(test)]
mod load_tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_cold_load_is_bounded_by_the_slowest_disk_read_of_the_weights() {
        // 2 GB at 10 MB/s, plus the start-up: past a 130 s cold load.
        assert_eq!(
            cold_load_bound(Some(2_000_000_000)),
            Duration::from_secs(230)
        );
        // A 70B model at Q4 (about 40 GB): over an hour.
        assert_eq!(
            cold_load_bound(Some(40_000_000_000)),
            Duration::from_secs(4_030)
        );
        // Unknown size: an 8B model's weights.
        assert_eq!(
            cold_load_bound(None),
            cold_load_bound(Some(DEFAULT_WEIGHT_BYTES))
        );
        assert_eq!(cold_load_bound(Some(0)), cold_load_bound(None));
        assert!(cold_load_bound(Some(u64::MAX)) > Duration::from_secs(3600));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(name: &str) -> GpuDevice {
        GpuDevice {
            index: 0,
            name: name.into(),
            utilisation_pct: 0,
            vram_used_bytes: 0,
            vram_total_bytes: 24 << 30,
        }
    }

    #[test]
    fn known_gpus_get_a_prior_near_the_measured_figures() {
        // engine-figures.md: 4090, Llama 3 8B Q4_K_M (4.58 GB): tg 130.6.
        let p = from_hardware(&[gpu("NVIDIA GeForce RTX 4090")], Some(4_580_000_000)).unwrap();
        assert!((100.0..=170.0).contains(&p.decode_tps), "{p:?}");
        // 3060, 8B Q4_K_M: tg ~45-52.
        let p = from_hardware(&[gpu("NVIDIA GeForce RTX 3060")], None).unwrap();
        assert!((35.0..=60.0).contains(&p.decode_tps), "{p:?}");
        assert!(p.prefill_tps > 10.0 * p.decode_tps);
        // The simulator's profile names are matched too.
        assert!(from_hardware(&[gpu("rtx4090")], None).is_some());
        // The fastest of several GPUs counts; unknown ones say nothing.
        let two = from_hardware(&[gpu("RTX 3060"), gpu("RTX 4090")], None).unwrap();
        let one = from_hardware(&[gpu("RTX 4090")], None).unwrap();
        assert_eq!(two, one);
        assert_eq!(from_hardware(&[gpu("Some iGPU")], None), None);
        assert_eq!(from_hardware(&[], None), None);
        // A "3060 Ti" is not taken for a 3060.
        let ti = from_hardware(&[gpu("RTX 3060 Ti")], None).unwrap();
        let plain = from_hardware(&[gpu("RTX 3060")], None).unwrap();
        assert!(ti.decode_tps > plain.decode_tps);
    }
}
