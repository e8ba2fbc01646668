//! The DRA driver (`nodefabric-dra`): the RDMA endpoints the publisher
//! describes in its CDI specs, offered as `resource.k8s.io/v1` devices, so
//! one ResourceClaim can ask for a GPU and the NIC on its PCIe root.
//!
//! Like the device plugin it reads the published CDI specs (and the rail
//! record) and nothing of the host. Its parts, host-free first:
//!
//! - [`devices`]: the published specs and rails → the pool's devices, with
//!   their names, attributes and CDI device IDs (pure).
//! - [`api`]: kubelet's DRA gRPC API, `v1` and `v1beta1`.
//!
//! The kubelet side (sockets, registration, the spec watch) is the shared
//! runtime in [`crate::kubelet`].
pub mod api;
pub mod devices;

/// The driver's default name: the DRA driver name, the registration name
/// and the domain of its device attributes.
pub const DEFAULT_DRIVER: &str = "rdma.gpustack.ai";
