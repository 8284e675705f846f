//! A node over an emulated engine (`pair-sim live`): the GPU it
//! reports is the engine's modelled one, read as NVML would be read on a
//! real machine. Every telemetry interval the engine is asked how long it
//! has been busy on its own clock (`GET /_emulator/stats`); the share of the
//! window it was busy is the GPU's utilisation, which the node's sampler
//! turns into PAIR's pressure like any other reading.

use std::time::Duration;

use pair_core::GpuDevice;
use pair_engines::EngineUrl;
use pair_telemetry::GpuFeed;
use serde::Deserialize;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

/// The part of the emulator's stats this reads.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
pub struct BusyReading {
    pub clock_us: u64,
    pub busy_us: u64,
    pub memory_used_bytes: u64,
}

/// Utilisation, percent, over the window between two readings; `None` when
/// the clock did not move or went back (the engine restarted).
pub fn utilisation_pct(earlier: BusyReading, later: BusyReading) -> Option<u8> {
    let window = later.clock_us.checked_sub(earlier.clock_us)?;
    let busy = later.busy_us.checked_sub(earlier.busy_us)?;
    if window == 0 {
        return None;
    }
    let pct = (busy.min(window) as f64 * 100.0 / window as f64).round();
    Some(pct as u8)
}

/// Feeds `feed` from `engine` every `interval` until `shutdown`: `device`
/// with the utilisation of the last window and the engine's weights as used
/// memory. A failed or first reading leaves the GPU without a reading, so
/// pressure is unknown rather than idle.
pub async fn feed_gpu(
    engine: EngineUrl,
    device: GpuDevice,
    interval: Duration,
    feed: GpuFeed,
    shutdown: CancellationToken,
) {
    let url = engine.join("/_emulator/stats");
    let http = match reqwest::Client::builder()
        .timeout(interval.max(Duration::from_millis(100)))
        .build()
    {
        Ok(c) => c,
        Err(error) => {
            tracing::warn!(%error, "emulated GPU: no HTTP client; pressure stays unknown");
            return;
        }
    };
    let mut tick = tokio::time::interval(interval.max(Duration::from_millis(10)));
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut last: Option<BusyReading> = None;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let reading = match http.get(&url).send().await {
            Ok(resp) if resp.status().is_success() => resp.json::<BusyReading>().await.ok(),
            _ => None,
        };
        match (last, reading) {
            (Some(earlier), Some(now)) => match utilisation_pct(earlier, now) {
                Some(pct) => feed.set(GpuDevice {
                    utilisation_pct: pct,
                    vram_used_bytes: now.memory_used_bytes.min(device.vram_total_bytes),
                    ..device.clone()
                }),
                None => feed.fail(),
            },
            _ => feed.fail(),
        }
        last = reading;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(clock_us: u64, busy_us: u64) -> BusyReading {
        BusyReading {
            clock_us,
            busy_us,
            memory_used_bytes: 0,
        }
    }

    #[test]
    fn utilisation_is_the_busy_share_of_the_window() {
        assert_eq!(utilisation_pct(r(1_000, 0), r(2_000, 500)), Some(50));
        assert_eq!(utilisation_pct(r(0, 0), r(3_000, 3_000)), Some(100));
        assert_eq!(utilisation_pct(r(0, 0), r(3_000, 0)), Some(0));
        // More busy than elapsed cannot be: capped.
        assert_eq!(utilisation_pct(r(0, 0), r(1_000, 2_000)), Some(100));
        // No window, or an engine that restarted: no reading.
        assert_eq!(utilisation_pct(r(5, 1), r(5, 1)), None);
        assert_eq!(utilisation_pct(r(9_000, 10), r(10, 0)), None);
    }
}
