//! The generated kubelet DRA plugin API in the two versions kubelet speaks:
//! `v1` (Kubernetes ≥ 1.34) and `v1beta1` (1.32, 1.33). Their messages are
//! field for field the same; the driver serves both from one implementation.
#![allow(missing_docs, clippy::all)]

/// `v1.DRAPlugin`: what kubelet 1.34 and later call first.
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/dra_v1/v1.rs"));
}

/// `v1beta1.DRAPlugin`: what kubelet 1.32 and 1.33 call.
pub mod v1beta1 {
    include!(concat!(env!("OUT_DIR"), "/dra_v1beta1/v1beta1.rs"));
}
