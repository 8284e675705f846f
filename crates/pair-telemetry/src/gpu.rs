//! GPU probes: the [`GpuProbe`] trait, NVML (feature `nvml`), "no GPU", a
//! probe fed from outside (an emulated engine's GPU), and a scriptable fake
//! for tests.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use pair_core::GpuDevice;

use crate::TelemetryError;

/// Reads every GPU of the machine once.
///
/// Called from the sampler about once a second; implementations should be
/// quick (NVML queries take microseconds) and must not block on I/O.
pub trait GpuProbe: Send + 'static {
    /// Short name for logs ("nvml", "none", "fake").
    fn kind(&self) -> &'static str;
    /// Current figures per device. An empty list means "no GPU"; an error
    /// means the reading is invalid (pressure becomes unknown).
    fn sample(&mut self) -> Result<Vec<GpuDevice>, TelemetryError>;
}

/// A machine without GPUs (or without a usable driver).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoGpu;

impl GpuProbe for NoGpu {
    fn kind(&self) -> &'static str {
        "none"
    }
    fn sample(&mut self) -> Result<Vec<GpuDevice>, TelemetryError> {
        Ok(Vec::new())
    }
}

/// NVIDIA GPUs through NVML.
#[cfg(feature = "nvml")]
pub struct NvmlProbe {
    nvml: nvml_wrapper::Nvml,
}

#[cfg(feature = "nvml")]
impl std::fmt::Debug for NvmlProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlProbe").finish_non_exhaustive()
    }
}

#[cfg(feature = "nvml")]
impl NvmlProbe {
    /// Loads the NVML library and initialises it. Fails on machines without
    /// the NVIDIA driver; [`default_gpu_probe`] turns that into [`NoGpu`].
    pub fn init() -> Result<Self, TelemetryError> {
        nvml_wrapper::Nvml::init()
            .map(|nvml| Self { nvml })
            .map_err(TelemetryError::NvmlUnavailable)
    }

    fn device(&self, index: u32) -> Result<GpuDevice, TelemetryError> {
        let q = |what| {
            move |source| TelemetryError::NvmlQuery {
                what,
                index,
                source,
            }
        };
        let dev = self
            .nvml
            .device_by_index(index)
            .map_err(q("device_by_index"))?;
        let name = dev.name().map_err(q("name"))?;
        let util = dev.utilization_rates().map_err(q("utilization_rates"))?;
        let mem = dev.memory_info().map_err(q("memory_info"))?;
        Ok(GpuDevice {
            index,
            name,
            utilisation_pct: u8::try_from(util.gpu.min(100)).unwrap_or(100),
            vram_used_bytes: mem.used,
            vram_total_bytes: mem.total,
        })
    }
}

#[cfg(feature = "nvml")]
impl GpuProbe for NvmlProbe {
    fn kind(&self) -> &'static str {
        "nvml"
    }
    fn sample(&mut self) -> Result<Vec<GpuDevice>, TelemetryError> {
        let count = self
            .nvml
            .device_count()
            .map_err(|source| TelemetryError::NvmlQuery {
                what: "device_count",
                index: 0,
                source,
            })?;
        (0..count).map(|i| self.device(i)).collect()
    }
}

/// The best probe this build and machine offer: on macOS the Apple GPU
/// (`crate::apple`, the machine's memory as its unified VRAM); elsewhere
/// NVML when the feature is on and the driver loads; otherwise [`NoGpu`]. A
/// missing driver is logged once, at info level, and is not an error.
pub fn default_gpu_probe() -> Box<dyn GpuProbe> {
    #[cfg(target_os = "macos")]
    {
        let memory = sysinfo::System::new().map_or(0, |mut sys| {
            sys.refresh_memory();
            sys.total_memory()
        });
        match crate::apple::AppleGpuProbe::start(memory) {
            Ok(probe) => return Box::new(probe),
            Err(err) => {
                tracing::info!(error = %err, "no Apple GPU telemetry; continuing without GPU")
            }
        }
    }
    #[cfg(feature = "nvml")]
    {
        match NvmlProbe::init() {
            Ok(probe) => return Box::new(probe),
            Err(err) => {
                tracing::info!(error = %err, cause = ?std::error::Error::source(&err).map(ToString::to_string),
                    "no NVIDIA GPU telemetry (NVML unavailable); continuing without GPU");
            }
        }
    }
    Box::new(NoGpu)
}

/// Apple GPUs, read on a thread of their own (`crate::apple`).
impl GpuProbe for crate::apple::AppleGpuProbe {
    fn kind(&self) -> &'static str {
        "apple"
    }
    fn sample(&mut self) -> Result<Vec<GpuDevice>, TelemetryError> {
        self.latest()
    }
}

/// A fake GPU probe whose utilisation follows a script, for tests.
///
/// Each [`GpuProbe::sample`] pops the next step; when the script runs out
/// the last step repeats. A step is either utilisation per device or a
/// failure.
#[derive(Clone, Debug)]
pub struct FakeGpuProbe {
    devices: Vec<GpuDevice>,
    script: VecDeque<Option<Vec<u8>>>,
    last: Option<Vec<u8>>,
}

impl FakeGpuProbe {
    /// Devices as given (their utilisation is the value before the script).
    pub fn new(devices: Vec<GpuDevice>) -> Self {
        let last = Some(devices.iter().map(|d| d.utilisation_pct).collect());
        Self {
            devices,
            script: VecDeque::new(),
            last,
        }
    }

    /// One device named `name` with `vram_total_bytes` of memory, half used.
    pub fn single(name: &str, vram_total_bytes: u64) -> Self {
        Self::new(vec![GpuDevice {
            index: 0,
            name: name.to_owned(),
            utilisation_pct: 0,
            vram_used_bytes: vram_total_bytes / 2,
            vram_total_bytes,
        }])
    }

    /// Appends a step: utilisation per device (missing devices keep 0).
    pub fn then(mut self, utilisation_pct: &[u8]) -> Self {
        self.script.push_back(Some(utilisation_pct.to_vec()));
        self
    }

    /// Appends one step per value, every device at that value.
    pub fn then_all(mut self, values: impl IntoIterator<Item = u8>) -> Self {
        let n = self.devices.len();
        for v in values {
            self.script.push_back(Some(vec![v; n]));
        }
        self
    }

    /// Appends a failing step.
    pub fn then_fail(mut self) -> Self {
        self.script.push_back(None);
        self
    }
}

impl GpuProbe for FakeGpuProbe {
    fn kind(&self) -> &'static str {
        "fake"
    }
    fn sample(&mut self) -> Result<Vec<GpuDevice>, TelemetryError> {
        if let Some(step) = self.script.pop_front() {
            self.last = step;
        }
        let utils = self.last.as_ref().ok_or(TelemetryError::Scripted)?;
        Ok(self
            .devices
            .iter()
            .enumerate()
            .map(|(i, d)| GpuDevice {
                utilisation_pct: utils.get(i).copied().unwrap_or(0).min(100),
                ..d.clone()
            })
            .collect())
    }
}

/// A GPU whose readings come from elsewhere: a task that asks an emulated
/// engine how busy it was feeds them in through the [`GpuFeed`], and the
/// sampler reads the latest one. Until a reading arrives, or after a failed
/// one, the probe fails, so pressure is unknown rather than idle.
#[derive(Debug)]
pub struct FedGpuProbe {
    shared: Arc<Mutex<Option<GpuDevice>>>,
}

/// The feeding side of a [`FedGpuProbe`].
#[derive(Clone, Debug)]
pub struct GpuFeed {
    shared: Arc<Mutex<Option<GpuDevice>>>,
}

impl FedGpuProbe {
    /// A probe of one device and the feed that updates it.
    pub fn new() -> (Self, GpuFeed) {
        let shared = Arc::new(Mutex::new(None));
        (
            Self {
                shared: shared.clone(),
            },
            GpuFeed { shared },
        )
    }
}

impl GpuFeed {
    /// The device as it stands now.
    pub fn set(&self, device: GpuDevice) {
        *self.shared.lock().unwrap_or_else(PoisonError::into_inner) = Some(device);
    }

    /// No valid reading now (the source did not answer).
    pub fn fail(&self) {
        *self.shared.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }
}

impl GpuProbe for FedGpuProbe {
    fn kind(&self) -> &'static str {
        "fed"
    }
    fn sample(&mut self) -> Result<Vec<GpuDevice>, TelemetryError> {
        let device = self
            .shared
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        device.map(|d| vec![d]).ok_or(TelemetryError::NoReading)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fed_probe_reads_what_was_fed_and_fails_without_a_reading() {
        let (mut probe, feed) = FedGpuProbe::new();
        assert!(probe.sample().is_err(), "nothing fed yet");
        let mut d = GpuDevice {
            index: 0,
            name: "rtx4090".into(),
            utilisation_pct: 73,
            vram_used_bytes: 1,
            vram_total_bytes: 2,
        };
        feed.set(d.clone());
        assert_eq!(probe.sample().unwrap(), vec![d.clone()]);
        assert_eq!(probe.sample().unwrap(), vec![d.clone()], "repeats");
        d.utilisation_pct = 5;
        feed.set(d.clone());
        assert_eq!(probe.sample().unwrap()[0].utilisation_pct, 5);
        feed.fail();
        assert!(probe.sample().is_err());
    }

    #[test]
    fn fake_probe_follows_its_script_then_repeats() {
        let mut p = FakeGpuProbe::single("fake", 100)
            .then(&[10])
            .then_fail()
            .then(&[90]);
        assert_eq!(p.sample().unwrap()[0].utilisation_pct, 10);
        assert!(matches!(p.sample(), Err(TelemetryError::Scripted)));
        assert_eq!(p.sample().unwrap()[0].utilisation_pct, 90);
        assert_eq!(p.sample().unwrap()[0].utilisation_pct, 90);
        assert_eq!(p.sample().unwrap()[0].vram_free_bytes(), 50);
    }

    #[test]
    fn default_probe_never_fails_to_build() {
        // On machines without the NVIDIA driver this is NoGpu; with one, NVML.
        let mut probe = default_gpu_probe();
        let kind = probe.kind();
        assert!(
            kind == "none" || kind == "nvml" || kind == "apple",
            "{kind}"
        );
        if kind == "none" {
            assert!(probe.sample().unwrap().is_empty());
        }
    }

    #[cfg(feature = "nvml")]
    #[test]
    fn nvml_reports_devices_or_is_unavailable() {
        match NvmlProbe::init() {
            Ok(mut p) => {
                for d in p.sample().unwrap() {
                    assert!(d.utilisation_pct <= 100);
                    assert!(d.vram_used_bytes <= d.vram_total_bytes);
                }
            }
            Err(e) => assert!(matches!(e, TelemetryError::NvmlUnavailable(_))),
        }
    }
}
