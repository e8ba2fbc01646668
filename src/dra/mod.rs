//! The DRA driver (`nodefabric-dra`): the RDMA endpoints the publisher
//! describes in its CDI specs, offered as `resource.k8s.io/v1` devices, so
//! one ResourceClaim can ask for a GPU and the NIC on its PCIe root.
//!
//! Like the device plugin it reads the published CDI specs (and the rail
//! record) and nothing of the host. Its parts, host-free first:
//!
//! - [`devices`]: the published specs and rails → the pool's devices, with
//!   their names, attributes and CDI device IDs (pure).
//! - [`attributes`]: every attribute name the pool publishes, in one place.
//! - [`slices`]: the pool as ResourceSlices (pure).
//! - [`claims`]: what Prepare answers for one claim (pure).
//! - [`claim_spec`]: the one small CDI spec a claim gets (`NCCL_IB_HCA`).
//! - [`nccl`]: that value: every NIC of the container holding the claim.
//! - [`checkpoint`]: the prepared claims, kept across restarts.
//! - [`lock`]: one driver per state folder, across processes.
//! - [`shares`]: whole NICs shared through consumable capacity (`--shares`).
//! - [`selfcheck`]: dials the driver's own sockets for `/healthz`.
//! - [`slice_sync`]: the API side of the slices: no write when nothing changed.
//! - [`service`]: Prepare and Unprepare, in `v1` and `v1beta1`.
//! - [`registration`]: what kubelet's plugin watcher asks.
//! - [`rails_file`]: the rail record, for the `rail` attribute.
//! - [`metrics`]: probes and metrics.
//! - [`server`]: the loop that composes them; [`cli`]: the command line.
//! - [`api`]: kubelet's DRA gRPC API, `v1` and `v1beta1`.
//!
//! The kubelet side (sockets, the authority front, the spec watch) is the
//! shared runtime in [`crate::kubelet`].
pub mod api;
pub mod attributes;
pub mod checkpoint;
pub mod claim_spec;
pub mod claims;
pub mod cli;
pub mod devices;
pub mod health;
pub mod lock;
pub mod metrics;
pub mod nccl;
pub mod preparer;
pub mod rails_file;
pub mod registration;
pub mod selfcheck;
pub mod server;
pub mod service;
pub mod shares;
pub mod slice_sync;
pub mod slices;
pub mod taints;

/// The driver's default name: the DRA driver name, the registration name
/// and the domain of its device attributes.
pub const DEFAULT_DRIVER: &str = "rdma.gpustack.ai";
