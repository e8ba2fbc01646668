//! The generated kubelet DRA plugin API in the two versions kubelet speaks:
//! `v1` (Kubernetes ≥ 1.34) and `v1beta1` (1.32, 1.33), from upstream's own
//! files (proto/NOTICE). Their gRPC services are named by upstream's
//! `package` lines, `k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin` and
//! `k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin`: the paths kubelet calls.
//! The messages are field for field the same except v1's `share_id`; the
//! driver serves both from one implementation.
#![allow(missing_docs, clippy::all)]

/// `k8s.io.kubelet.pkg.apis.dra.v1`: what kubelet 1.34 and later call first.
pub mod v1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}

/// `k8s.io.kubelet.pkg.apis.dra.v1beta1`: what kubelet 1.32 and 1.33 call.
pub mod v1beta1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
}

/// `v1alpha1.DRAResourceHealth`: the device-health stream kubelet opens
/// when a driver lists it among its supported versions (1.34 and later,
/// gate `ResourceHealthStatus`).
pub mod health_v1alpha1 {
    tonic::include_proto!("v1alpha1");
}
