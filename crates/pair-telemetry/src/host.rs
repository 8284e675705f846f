//! Host CPU and memory: the [`HostProbe`] trait, sysinfo, and a fake.

pub use pair_core::HostStats;
use sysinfo::System;

use crate::TelemetryError;

/// Reads host CPU and memory.
pub trait HostProbe: Send + 'static {
    fn sample(&mut self) -> Result<HostStats, TelemetryError>;
}

/// [`HostProbe`] over the `sysinfo` crate. CPU usage is measured between two
/// calls, so the first sample reads 0 %.
pub struct SysinfoHost {
    sys: System,
}

impl std::fmt::Debug for SysinfoHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SysinfoHost").finish_non_exhaustive()
    }
}

impl SysinfoHost {
    pub fn new() -> Result<Self, TelemetryError> {
        let mut sys = System::new().map_err(TelemetryError::Host)?;
        sys.refresh_cpu_usage();
        Ok(Self { sys })
    }
}

impl HostProbe for SysinfoHost {
    fn sample(&mut self) -> Result<HostStats, TelemetryError> {
        self.sys.refresh_cpu_usage();
        self.sys.refresh_memory();
        let cpu = self.sys.global_cpu_usage();
        Ok(HostStats {
            cpu_pct: if cpu.is_finite() {
                cpu.clamp(0.0, 100.0)
            } else {
                0.0
            },
            cpu_count: u32::try_from(self.sys.cpus().len()).unwrap_or(u32::MAX),
            mem_used_bytes: self.sys.used_memory(),
            mem_total_bytes: self.sys.total_memory(),
        })
    }
}

/// A host probe returning scripted CPU percentages (then repeating the last).
#[derive(Clone, Debug)]
pub struct FakeHostProbe {
    base: HostStats,
    script: std::collections::VecDeque<f32>,
}

impl FakeHostProbe {
    pub fn new(base: HostStats) -> Self {
        Self {
            base,
            script: Default::default(),
        }
    }
    pub fn then_cpu(mut self, values: impl IntoIterator<Item = f32>) -> Self {
        self.script.extend(values);
        self
    }
}

impl HostProbe for FakeHostProbe {
    fn sample(&mut self) -> Result<HostStats, TelemetryError> {
        if let Some(v) = self.script.pop_front() {
            self.base.cpu_pct = v;
        }
        Ok(self.base)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysinfo_reads_this_machine() {
        let mut h = SysinfoHost::new().unwrap();
        let s = h.sample().unwrap();
        assert!(s.cpu_count >= 1);
        assert!(s.mem_total_bytes > 0);
        assert!(s.mem_used_bytes <= s.mem_total_bytes);
        assert!((0.0..=100.0).contains(&s.cpu_pct));
    }
}
