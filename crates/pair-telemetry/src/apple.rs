//! Apple GPUs: utilisation and memory from the IOKit registry's
//! accelerator entries (`ioreg -r -d 1 -w 0 -c IOAccelerator`), read on
//! macOS only. On Apple silicon the GPU shares the machine's memory, so the
//! unified memory counts as its VRAM (total: the machine's memory; used:
//! what the GPU driver holds), and a Mac whose GPU Metal inference
//! saturates reports that pressure through the same bands as NVML.
//!
//! [`parse_ioreg`] is pure and tested on recorded readings; the probe runs
//! `ioreg` on a thread of its own (it takes tens of milliseconds, and the
//! sampler must not block), so [`AppleGpuProbe::latest`] reads the latest.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use pair_core::GpuDevice;

use crate::TelemetryError;

/// The GPUs in an `ioreg -r -d 1 -w 0 -c IOAccelerator` reading. A device
/// with discrete memory (`vramUsedBytes`/`vramFreeBytes`, an AMD GPU of an
/// Intel Mac) reports that; one without (Apple silicon) gets
/// `unified_memory_bytes` as its total and the driver's `In use system
/// memory` as used. Utilisation is `Device Utilization %` (else the larger
/// of the renderer's and tiler's). Entries without performance statistics
/// are skipped.
pub fn parse_ioreg(text: &str, unified_memory_bytes: u64) -> Vec<GpuDevice> {
    let mut out = Vec::new();
    for entry in text.split("+-o ").skip(1) {
        let class = entry.split_whitespace().next().unwrap_or("GPU").to_owned();
        let Some(stats) = dict_after(entry, "\"PerformanceStatistics\" = {") else {
            continue;
        };
        let num = |key: &str| number_in(stats, key);
        let Some(util) = num("Device Utilization %").or_else(|| {
            let r = num("Renderer Utilization %");
            let t = num("Tiler Utilization %");
            r.max(t)
        }) else {
            continue;
        };
        let (used, total) = match (num("vramUsedBytes"), num("vramFreeBytes")) {
            (Some(used), Some(free)) => (used, used.saturating_add(free)),
            _ => (
                num("In use system memory").unwrap_or(0),
                unified_memory_bytes,
            ),
        };
        let name = string_value(entry, "\"model\" = \"").unwrap_or(class);
        out.push(GpuDevice {
            index: u32::try_from(out.len()).unwrap_or(u32::MAX),
            name,
            utilisation_pct: u8::try_from(util.min(100)).unwrap_or(100),
            vram_used_bytes: used.min(total),
            vram_total_bytes: total,
        });
    }
    out
}

/// The `{...}` that follows `open` in `text` (without the braces).
fn dict_after<'a>(text: &'a str, open: &str) -> Option<&'a str> {
    let start = text.find(open)? + open.len();
    let mut depth = 1usize;
    for (i, c) in text[start..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(&text[start..start + i]);
                }
            }
            _ => {}
        }
    }
    None
}

/// `"key"=123` in an ioreg dictionary.
fn number_in(dict: &str, key: &str) -> Option<u64> {
    let pat = format!("\"{key}\"=");
    let at = dict.find(&pat)? + pat.len();
    let digits: String = dict[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// The string after `prefix` up to its closing quote.
fn string_value(text: &str, prefix: &str) -> Option<String> {
    let at = text.find(prefix)? + prefix.len();
    let end = text[at..].find('"')?;
    Some(text[at..at + end].to_owned()).filter(|s| !s.is_empty())
}

/// One `ioreg` reading of the accelerators (macOS's IOKit registry).
pub fn read_ioreg() -> std::io::Result<String> {
    let out = std::process::Command::new("ioreg")
        .args(["-r", "-d", "1", "-w", "0", "-c", "IOAccelerator"])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()?;
    if !out.status.success() {
        return Err(std::io::Error::other(format!("ioreg: {}", out.status)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

type Reader = Box<dyn FnMut() -> Option<Vec<GpuDevice>> + Send>;

/// GPUs read by a reader on a thread of its own every `every`; sampling
/// returns the latest reading (an error before the first, or after a failed
/// one: pressure is then unknown, not idle). The thread stops and is joined
/// when the probe is dropped.
pub struct AppleGpuProbe {
    latest: Arc<Mutex<Option<Vec<GpuDevice>>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for AppleGpuProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppleGpuProbe").finish_non_exhaustive()
    }
}

impl AppleGpuProbe {
    /// `ioreg` every second, the machine's memory as unified VRAM.
    pub fn start(unified_memory_bytes: u64) -> std::io::Result<Self> {
        Self::with_reader(
            Box::new(move || {
                read_ioreg()
                    .ok()
                    .map(|text| parse_ioreg(&text, unified_memory_bytes))
            }),
            Duration::from_secs(1),
        )
    }

    /// A probe over any reader (tests feed recorded readings).
    pub fn with_reader(mut read: Reader, every: Duration) -> std::io::Result<Self> {
        let latest = Arc::new(Mutex::new(None));
        let stop = Arc::new(AtomicBool::new(false));
        let (l, s) = (Arc::clone(&latest), Arc::clone(&stop));
        let thread = std::thread::Builder::new()
            .name("pair-apple-gpu".to_owned())
            .spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    let reading = read();
                    *l.lock().unwrap_or_else(PoisonError::into_inner) = reading;
                    // Sleep in short steps so a drop is not held up.
                    let mut slept = Duration::ZERO;
                    while slept < every && !s.load(Ordering::Relaxed) {
                        let step = Duration::from_millis(20).min(every - slept);
                        std::thread::sleep(step);
                        slept += step;
                    }
                }
            })?;
        Ok(Self {
            latest,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for AppleGpuProbe {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl AppleGpuProbe {
    /// The latest reading (`GpuProbe::sample`, implemented in `gpu`).
    pub fn latest(&self) -> Result<Vec<GpuDevice>, TelemetryError> {
        self.latest
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or(TelemetryError::NoReading)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ComputeSource, GpuProbe, PressureConfig, PressureTracker, compute_sample};

    /// An M2 Pro's accelerator entry, as `ioreg -r -d 1 -w 0 -c
    /// IOAccelerator` prints it, while Metal inference saturates the GPU.
    const M2_PRO_BUSY: &str = r#"+-o AGXAcceleratorG14X  <class AGXAcceleratorG14X, id 0x1000008a2, registered, matched, active, busy 0 (0 ms), retain 98>
    {
      "IOClass" = "AGXAcceleratorG14X"
      "gpu-core-count" = 19
      "model" = "Apple M2 Pro"
      "PerformanceStatistics" = {"In use system memory (driver)"=0,"Alloc system memory"=25769803776,"Tiler Utilization %"=97,"recoveryCount"=0,"lastRecoveryTime"=0,"Renderer Utilization %"=96,"TiledSceneBytes"=1572864,"SplitSceneCount"=0,"Allocated PB Size"=168034304,"In use system memory"=19327352832,"Device Utilization %"=99}
      "AGXParameterBufferMaxSize" = 1207959552
      "IOMatchedAtBoot" = Yes
    }
"#;

    /// The same Mac idle.
    const M2_PRO_IDLE: &str = r#"+-o AGXAcceleratorG14X  <class AGXAcceleratorG14X, id 0x1000008a2, registered, matched, active, busy 0 (0 ms), retain 98>
    {
      "model" = "Apple M2 Pro"
      "PerformanceStatistics" = {"In use system memory (driver)"=0,"Alloc system memory"=1073741824,"Tiler Utilization %"=0,"Renderer Utilization %"=0,"In use system memory"=402653184,"Device Utilization %"=0}
    }
"#;

    /// An Intel iMac with an AMD GPU: discrete VRAM, no Device Utilization.
    const IMAC_AMD: &str = r#"+-o AMDRadeonX6000_AMDNavi10GraphicsAccelerator  <class AMDRadeonX6000_AMDNavi10GraphicsAccelerator, id 0x100000302, registered, matched, active, busy 0 (0 ms), retain 33>
    {
      "IOClass" = "AMDRadeonX6000_AMDNavi10GraphicsAccelerator"
      "PerformanceStatistics" = {"vramFreeBytes"=6442450944,"Renderer Utilization %"=40,"Tiler Utilization %"=55,"vramUsedBytes"=2147483648,"hardwareWaitTime"=0}
    }
+-o IntelAccelerator  <class IntelAccelerator, id 0x100000400, registered, matched, active, busy 0 (0 ms), retain 12>
    {
      "IOClass" = "IntelAccelerator"
    }
"#;

    const GIB: u64 = 1 << 30;

    #[test]
    fn apple_silicon_counts_unified_memory_as_vram() {
        let gpus = parse_ioreg(M2_PRO_BUSY, 32 * GIB);
        assert_eq!(
            gpus,
            vec![GpuDevice {
                index: 0,
                name: "Apple M2 Pro".into(),
                utilisation_pct: 99,
                vram_used_bytes: 19_327_352_832,
                vram_total_bytes: 32 * GIB,
            }]
        );
        let idle = parse_ioreg(M2_PRO_IDLE, 32 * GIB);
        assert_eq!(idle[0].utilisation_pct, 0);
        assert_eq!(idle[0].vram_used_bytes, 402_653_184);
    }

    #[test]
    fn a_discrete_gpu_reports_its_own_vram_and_entries_without_stats_are_skipped() {
        let gpus = parse_ioreg(IMAC_AMD, 16 * GIB);
        assert_eq!(gpus.len(), 1);
        assert_eq!(gpus[0].name, "AMDRadeonX6000_AMDNavi10GraphicsAccelerator");
        assert_eq!(
            gpus[0].utilisation_pct, 55,
            "the busier of renderer and tiler"
        );
        assert_eq!(gpus[0].vram_total_bytes, 8 * GIB);
        assert_eq!(gpus[0].vram_used_bytes, 2 * GIB);
        assert!(parse_ioreg("", GIB).is_empty());
        assert!(parse_ioreg("+-o Broken {", GIB).is_empty());
    }

    /// A saturated Mac is high pressure, through the same bands as NVML.
    #[test]
    fn a_saturated_mac_reads_as_gpu_pressure() {
        let busy = parse_ioreg(M2_PRO_BUSY, 32 * GIB);
        let (source, sample) = compute_sample(Some(&busy), None);
        assert_eq!(source, ComputeSource::Gpu);
        let run = |sample| {
            let mut tracker = PressureTracker::new(PressureConfig::default());
            (0..30u64).fold(pair_core::Pressure::default(), |_, t| {
                tracker.observe(t * 1_000, sample)
            })
        };
        let idle = parse_ioreg(M2_PRO_IDLE, 32 * GIB);
        let (_, idle_sample) = compute_sample(Some(&idle), None);
        assert_eq!(run(sample), pair_core::Pressure::MAX);
        assert_eq!(run(idle_sample).band(), 0);
    }

    #[test]
    fn the_probe_reads_on_its_own_thread_and_stops_when_dropped() {
        let readings = [M2_PRO_IDLE, M2_PRO_BUSY];
        let mut n = 0;
        let mut probe = AppleGpuProbe::with_reader(
            Box::new(move || {
                let r = readings.get(n).map(|t| parse_ioreg(t, 32 * GIB));
                n += 1;
                r
            }),
            Duration::from_millis(30),
        )
        .unwrap();
        assert_eq!(probe.kind(), "apple");
        let mut seen = Vec::new();
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while std::time::Instant::now() < until {
            if let Ok(g) = probe.sample() {
                if seen.last() != Some(&g[0].utilisation_pct) {
                    seen.push(g[0].utilisation_pct);
                }
            } else if !seen.is_empty() {
                // The reader ran out: no reading is an error, not idle.
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(seen, [0, 99]);
        drop(probe);
    }
}
