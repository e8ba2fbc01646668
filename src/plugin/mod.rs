//! The device plugin: serves exclusive, shared and partitioned RDMA tokens
//! to kubelet, read from the CDI specs `nodefabric` writes. What any kubelet
//! plugin needs (sockets, watch, restarts, probes, signals, the reading of
//! the CDI specs) is in [`crate::kubelet`]; this module is the device-plugin
//! service itself.
pub mod allocate;
pub mod api;
pub mod catalog;
pub mod cli;
pub mod metrics;
pub mod server;
pub mod service;
