//! How often a node reports to its peers, and how fresh a report must be
//! for its node to stay routable.

use std::time::Duration;

#[derive(Clone, Copy, Debug)]
pub struct GossipConfig {
    /// How often reports are pushed and the snapshot rebuilt.
    pub interval: Duration,
    /// A report older than this makes its node suspect (ranked last).
    pub suspect_after: Duration,
    /// A report older than this takes its node out of routing.
    pub dead_after: Duration,
    /// Our cluster port, told to peers with each report.
    pub cluster_port: u16,
}

impl Default for GossipConfig {
    fn default() -> Self {
        // Killed or hung nodes leave the routing set within ~3 s: 1.6 s
        // without a report (3 missed 500 ms reports) makes a node suspect;
        // 2.5 s removes it.
        Self {
            interval: Duration::from_millis(500),
            suspect_after: Duration::from_millis(1_600),
            dead_after: Duration::from_millis(2_500),
            cluster_port: 0,
        }
    }
}
