//! What every kubelet plugin needs besides its own gRPC service: sockets in
//! a kubelet folder that are replaced when stale and removed when stopped,
//! servers that hang up stuck connections, a folder watch with a poll
//! fallback, noticing that kubelet restarted, a doubling backoff for
//! retries, the shutdown signals, the `/healthz` `/readyz` `/metrics`
//! server, log de-duplication, the one reading of the CDI specs (untrusted
//! files, re-read only when changed), and
//! the registration socket's side of kubelet's plugin watcher (its API, and a
//! front that lets tonic answer the authority kubelet dials it with).
//!
//! Both plugins, the device plugin ([`crate::plugin`]) and the DRA driver
//! ([`crate::dra`]), run the one loop in [`plugin_loop`] that composes these,
//! and fill it in with what they serve, register and reload.
pub mod args;
pub mod authority;
pub mod backoff;
pub mod chain;
pub mod command;
pub mod conn;
pub mod plugin_loop;
pub mod probes;
pub mod quiet;
pub mod registration_api;
pub mod restart;
pub mod servers;
pub mod signals;
pub mod socket;
pub mod specs;
pub mod watch;
