//! The crate's one error type.

use std::io;

/// Everything that can go wrong in pair-emulator.
#[derive(Debug, thiserror::Error)]
pub enum EmulatorError {
    #[error(
        "no hardware profile named {name:?} (shipped: rtx4090, rtx3060, laptop, m3-max, cpu, cpu-smollm2-135m)"
    )]
    UnknownProfile { name: String },
    #[error("bad batch scaling table: {reason}")]
    BadScaling { reason: &'static str },
    #[error("the engine has no model at index {index}")]
    NoSuchModelIndex { index: usize },
    #[error("model {model:?} does not fit in memory next to the loaded ones")]
    OutOfMemory { model: String },
    #[error("the queue is full ({max} requests wait for a slot)")]
    QueueFull { max: u32 },
    #[error("bad emulator configuration: {reason}")]
    BadConfig { reason: String },
    #[error("emulated engine socket error")]
    Io(
        #[from]
        #[source]
        io::Error,
    ),
}
