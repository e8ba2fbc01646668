//! What every kubelet plugin needs besides its own gRPC service: sockets in
//! a kubelet folder that are replaced when stale and removed when stopped,
//! servers that hang up stuck connections, a folder watch with a poll
//! fallback, noticing that kubelet restarted, the shutdown signals, the
//! `/healthz` `/readyz` `/metrics` server, log de-duplication, and the one
//! reading of the CDI specs (untrusted files, re-read only when changed).
//!
//! The device plugin ([`crate::plugin`]) composes these; a second plugin
//! (the DRA driver) composes the same ones instead of copying them.
pub mod conn;
pub mod probes;
pub mod quiet;
pub mod restart;
pub mod servers;
pub mod signals;
pub mod socket;
pub mod specs;
pub mod watch;
