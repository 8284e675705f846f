//! mDNS advertise and browse, TXT record codec, peer table with liveness, static peers.
