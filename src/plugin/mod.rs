//! The device plugin: serves exclusive, shared and partitioned RDMA tokens
//! to kubelet, read from the CDI specs `nodefabric` writes.
pub mod allocate;
pub mod api;
pub mod catalog;
pub mod service;
pub mod server;
pub mod uds;
pub mod cli;
