//! The request path: local faces, routing, failover, peer relay over mTLS, jobs, metrics.
