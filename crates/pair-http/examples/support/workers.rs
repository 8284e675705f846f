//! Thread per core for the benchmark floors: worker runtimes that an
//! acceptor deals client connections to (shared by `floor_forwarder` and
//! `raw_forwarder` through `#[path]`; not an example of its own).

/// `n` current-thread runtimes, each on its own thread, parked until work
/// is spawned onto them through the returned handles.
pub(crate) fn spawn(n: usize) -> std::io::Result<Vec<tokio::runtime::Handle>> {
    (0..n)
        .map(|_| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let handle = rt.handle().clone();
            std::thread::spawn(move || rt.block_on(std::future::pending::<()>()));
            Ok(handle)
        })
        .collect()
}
