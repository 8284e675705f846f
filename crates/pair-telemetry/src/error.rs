//! The one error type of pair-telemetry.

/// What can go wrong while reading hardware counters.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// NVML could not be loaded or initialised (no driver, no library).
    #[cfg(feature = "nvml")]
    #[error("NVML is not available")]
    NvmlUnavailable(#[source] nvml_wrapper::error::NvmlError),
    /// NVML answered but one query failed.
    #[cfg(feature = "nvml")]
    #[error("NVML query {what} failed on device {index}")]
    NvmlQuery {
        what: &'static str,
        index: u32,
        #[source]
        source: nvml_wrapper::error::NvmlError,
    },
    /// The host statistics could not be read.
    #[error("host statistics unavailable")]
    Host(#[source] sysinfo::Error),
    /// A fed probe has no current reading (its feeder has not delivered
    /// one yet, or the last one failed).
    #[error("no current reading from the fed GPU probe")]
    NoReading,
    /// A scripted failure of a fake probe (tests only use it).
    #[error("fake probe failure (scripted)")]
    Scripted,
}
