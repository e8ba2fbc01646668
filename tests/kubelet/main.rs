//! The device plugin as kubelet and the container runtimes use it: the real
//! binary against a kubelet stand-in, real containerd and podman; and the
//! registration socket as kubelet's plugin watcher dials it. One test
//! binary, so the crate is linked once for all of them.

// A folder target's own `mod support;` would look inside this folder.
#[path = "../support/mod.rs"]
mod support;

mod authority;
mod containerd;
mod dra;
mod dra_faults;
mod dra_health;
mod dra_lifecycle;
mod dra_nccl;
mod dra_shares;
mod plugin;
mod podman;
mod registration;
mod wire;
