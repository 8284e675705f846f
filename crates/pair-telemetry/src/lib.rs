//! GPU and host telemetry: NVML probe (optional), host CPU/RAM, EWMA pressure bands with hysteresis.
