//! The async shell: samples the probes on an interval and publishes the
//! latest [`Telemetry`] through a `tokio::sync::watch` channel.

use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use crate::gpu::GpuProbe;
use crate::host::HostProbe;
use crate::pressure::{PressureConfig, PressureTracker, Telemetry, compute_sample};

/// How the sampler runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplerConfig {
    /// Time between samples (PAIR: 1 s).
    pub interval: Duration,
    pub pressure: PressureConfig,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(1),
            pressure: PressureConfig::default(),
        }
    }
}

/// Takes one sample from both probes and folds it into `tracker`: the pure
/// step of the sampler, apart from the probes themselves.
pub fn sample_once(
    tracker: &mut PressureTracker,
    gpu: &mut dyn GpuProbe,
    host: &mut dyn HostProbe,
    now_ms: u64,
) -> Telemetry {
    let gpus = match gpu.sample() {
        Ok(g) => Some(g),
        Err(err) => {
            tracing::debug!(error = %err, probe = gpu.kind(), "GPU sample failed");
            None
        }
    };
    let host = match host.sample() {
        Ok(h) => Some(h),
        Err(err) => {
            tracing::debug!(error = %err, "host sample failed");
            None
        }
    };
    let (compute, sample) = compute_sample(gpus.as_deref(), host.as_ref());
    let pressure = tracker.observe(now_ms, sample);
    Telemetry {
        taken_at_ms: now_ms,
        host,
        gpus: gpus.unwrap_or_default(),
        compute,
        utilisation_ewma_pct: tracker.ewma_pct().map(|v| v as f32),
        pressure,
    }
}

/// A running sampler task and the channel it publishes on.
#[derive(Debug)]
pub struct Sampler {
    rx: watch::Receiver<Telemetry>,
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

impl Sampler {
    /// Starts sampling at once and then every `config.interval`, until
    /// `cancel` fires or [`Sampler::shutdown`] is called.
    pub fn spawn(
        config: SamplerConfig,
        mut gpu: Box<dyn GpuProbe>,
        mut host: Box<dyn HostProbe>,
        cancel: CancellationToken,
    ) -> Sampler {
        let (tx, rx) = watch::channel(Telemetry::default());
        let cancel = cancel.child_token();
        let token = cancel.clone();
        let task = tokio::spawn(async move {
            let mut tracker = PressureTracker::new(config.pressure);
            let mut tick = tokio::time::interval(config.interval.max(Duration::from_millis(10)));
            tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = token.cancelled() => break,
                    _ = tick.tick() => {}
                }
                let t = sample_once(&mut tracker, gpu.as_mut(), host.as_mut(), epoch_ms());
                tx.send_replace(t);
            }
        });
        Sampler { rx, cancel, task }
    }

    /// [`Sampler::spawn`] with this machine's probes: NVML when available
    /// (else no GPU, logged once) and sysinfo for the host.
    pub fn spawn_default(
        config: SamplerConfig,
        cancel: CancellationToken,
    ) -> Result<Sampler, crate::TelemetryError> {
        let host = crate::host::SysinfoHost::new()?;
        Ok(Sampler::spawn(
            config,
            crate::gpu::default_gpu_probe(),
            Box::new(host),
            cancel,
        ))
    }

    /// A receiver of the latest telemetry (default value until the first
    /// sample, which counts as unknown pressure).
    pub fn subscribe(&self) -> watch::Receiver<Telemetry> {
        self.rx.clone()
    }

    /// Stops the task and waits for it.
    pub async fn shutdown(self) {
        self.cancel.cancel();
        if let Err(err) = self.task.await {
            tracing::warn!(error = %err, "telemetry sampler task ended abnormally");
        }
    }
}

/// Milliseconds since the Unix epoch (the shell's clock).
pub(crate) fn epoch_ms() -> u64 {
    pair_core::unix_ms(SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::{FakeHostProbe, HostStats};
    use crate::{ComputeSource, FakeGpuProbe, NoGpu};
    use pair_core::Pressure;

    fn host(cpu: f32) -> FakeHostProbe {
        FakeHostProbe::new(HostStats {
            cpu_pct: cpu,
            cpu_count: 8,
            mem_used_bytes: 4,
            mem_total_bytes: 16,
        })
    }

    #[test]
    fn sample_once_follows_the_gpu_script() {
        let mut tr = PressureTracker::default();
        let mut gpu = FakeGpuProbe::single("g", 1000)
            .then_all([90, 90, 90])
            .then_fail();
        let mut h = host(5.0);
        let t = sample_once(&mut tr, &mut gpu, &mut h, 1_000);
        assert_eq!(t.pressure, Pressure::MAX);
        assert_eq!(t.compute, ComputeSource::Gpu);
        assert_eq!(t.gpus.len(), 1);
        assert_eq!(t.host.unwrap().cpu_count, 8);
        sample_once(&mut tr, &mut gpu, &mut h, 2_000);
        sample_once(&mut tr, &mut gpu, &mut h, 3_000);
        let failed = sample_once(&mut tr, &mut gpu, &mut h, 4_000);
        assert_eq!(failed.pressure, Pressure::UNKNOWN);
        assert!(failed.gpus.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn sampler_publishes_every_interval_and_stops() {
        let cancel = CancellationToken::new();
        let s = Sampler::spawn(
            SamplerConfig::default(),
            Box::new(NoGpu),
            Box::new(host(10.0).then_cpu([10.0, 50.0, 50.0, 50.0, 50.0])),
            cancel.clone(),
        );
        let mut rx = s.subscribe();
        let mut seen = Vec::new();
        for _ in 0..5 {
            rx.changed().await.unwrap();
            let t = rx.borrow_and_update().clone();
            assert_eq!(t.compute, ComputeSource::Cpu);
            seen.push(t.pressure.band());
        }
        // 10 % then 50 % smoothed: 10, 24, 33.1, 39.0, 42.9 -> band 1 on the 5th.
        assert_eq!(seen, vec![0, 0, 0, 0, 1]);
        s.shutdown().await;
        assert!(rx.changed().await.is_err(), "sender dropped after shutdown");
    }

    #[tokio::test]
    async fn default_sampler_reads_this_machine() {
        let s = Sampler::spawn_default(SamplerConfig::default(), CancellationToken::new()).unwrap();
        let mut rx = s.subscribe();
        rx.changed().await.unwrap();
        let t = rx.borrow().clone();
        assert!(t.taken_at_ms > 0);
        assert!(t.host.unwrap().mem_total_bytes > 0);
        // Without NVIDIA hardware the CPU drives pressure; with it, the GPU.
        assert_eq!(t.compute == ComputeSource::Gpu, !t.gpus.is_empty());
        assert!(t.pressure_at(t.taken_at_ms).band() <= 3);
        s.shutdown().await;
    }

    #[tokio::test(start_paused = true)]
    async fn parent_cancellation_stops_the_sampler() {
        let cancel = CancellationToken::new();
        let s = Sampler::spawn(
            SamplerConfig::default(),
            Box::new(NoGpu),
            Box::new(host(1.0)),
            cancel.clone(),
        );
        let mut rx = s.subscribe();
        rx.changed().await.unwrap();
        cancel.cancel();
        while rx.changed().await.is_ok() {}
        s.shutdown().await;
    }
}
