//! What the test binaries share: fixture builders and stand-ins for the
//! host, kubelet and the API server. Each binary declares this module once;
//! the benches still take single files of it with `#[path]`.

// Each test binary uses a different part.
#![allow(dead_code)]

pub mod apiserver;
pub mod apiserver_rbac;
pub mod archive;
pub mod cluster;
pub mod dra;
pub mod fixtures;
pub mod grpcgo;
pub mod host;
pub mod kubelet;
pub mod mount;
pub mod os;
pub mod plugin;
pub mod published;
pub mod snapshots;
pub mod wait;
