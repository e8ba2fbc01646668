//! The device plugin: serves exclusive, shared and partitioned RDMA tokens
//! to kubelet, read from the CDI specs `nodefabric` writes.
pub mod allocate;
pub mod api;
pub mod catalog;
pub mod cli;
pub mod conn;
pub mod http;
pub mod loader;
pub mod metrics;
pub mod quiet;
pub mod server;
pub mod service;
pub mod specfile;
pub mod uds;
pub mod watcher;
