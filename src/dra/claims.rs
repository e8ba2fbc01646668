//! What Prepare answers for one ResourceClaim: its allocation results that
//! are this driver's and this node's pool, each as the device's existing
//! CDI device ID. Pure: the claim as read, the pool as published.

use super::devices::Pool;
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde::{Deserialize, Serialize};

/// One prepared device of a claim: what kubelet's `Device` message carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedDevice {
    /// The claim's requests this device was allocated for.
    pub request_names: Vec<String>,
    /// The pool (this node's name).
    pub pool_name: String,
    /// The device's name in the pool.
    pub device_name: String,
    /// The CDI devices the runtime injects for it.
    pub cdi_device_ids: Vec<String>,
}

/// A claim as prepared: its devices and the RDMA devices they are
/// (`NCCL_IB_HCA`), in allocation order.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Prepared {
    /// The claim's namespace, to check a later call names the same claim.
    pub namespace: String,
    /// The claim's name.
    pub name: String,
    /// The devices, in the order of the allocation results.
    pub devices: Vec<PreparedDevice>,
    /// Their RDMA devices, each once.
    pub rdma_devices: Vec<String>,
}

/// Why one claim cannot be prepared; the message names the claim.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    /// The claim read has another UID: it was deleted and made again.
    #[error("ResourceClaim {namespace}/{name}: its UID is {found}, kubelet asked for {asked} (the claim was replaced)")]
    UidMismatch {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// The UID kubelet named.
        asked: String,
        /// The UID the server has.
        found: String,
    },
    /// The claim has no allocation.
    #[error("ResourceClaim {namespace}/{name} is not allocated")]
    NotAllocated {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// An allocated device is no longer in the published specs.
    #[error("ResourceClaim {namespace}/{name}: device {device} of pool {pool} is no longer published (its CDI spec no longer lists it)")]
    Gone {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// The pool.
        pool: String,
        /// The device.
        device: String,
    },
}

/// The devices of `claim` that `driver`'s pool `pool_name` holds, as
/// `pool` publishes them now.
pub fn prepare(
    claim: &ResourceClaim,
    asked_uid: &str,
    driver: &str,
    pool_name: &str,
    pool: &Pool,
) -> Result<Prepared, ClaimError> {
    let namespace = claim.metadata.namespace.clone().unwrap_or_default();
    let name = claim.metadata.name.clone().unwrap_or_default();
    let found = claim.metadata.uid.clone().unwrap_or_default();
    if found != asked_uid {
        return Err(ClaimError::UidMismatch {
            namespace,
            name,
            asked: asked_uid.to_string(),
            found,
        });
    }
    let Some(allocation) = claim.status.as_ref().and_then(|s| s.allocation.as_ref()) else {
        return Err(ClaimError::NotAllocated { namespace, name });
    };
    let results = allocation
        .devices
        .as_ref()
        .and_then(|d| d.results.as_ref())
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut out = Prepared {
        namespace: namespace.clone(),
        name: name.clone(),
        ..Prepared::default()
    };
    for r in results {
        if r.driver != driver || r.pool != pool_name {
            continue;
        }
        let Some(device) = pool.device(&r.device) else {
            return Err(ClaimError::Gone {
                namespace,
                name,
                pool: r.pool.clone(),
                device: r.device.clone(),
            });
        };
        out.devices.push(PreparedDevice {
            request_names: vec![r.request.clone()],
            pool_name: r.pool.clone(),
            device_name: r.device.clone(),
            cdi_device_ids: vec![device.cdi_id.clone()],
        });
        if !out.rdma_devices.contains(&device.rdma_device) {
            out.rdma_devices.push(device.rdma_device.clone());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdi::Family;
    use crate::dra::devices::DraDevice;
    use crate::record::LinkState;
    use k8s_openapi::api::resource::v1::{
        AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult,
        ResourceClaimStatus,
    };

    fn pool() -> Pool {
        Pool {
            devices: vec![DraDevice {
                name: "pci-0000-3b-00-0".into(),
                family: Family::Whole,
                cdi_id: "gpustack.ai/rdma=mlx5_0".into(),
                rdma_device: "mlx5_0".into(),
                link: LinkState::Ok,
                attributes: Default::default(),
            }],
            refused: vec![],
        }
    }

    fn claim(results: &[(&str, &str, &str)]) -> ResourceClaim {
        let mut c = ResourceClaim::default();
        c.metadata.namespace = Some("team".into());
        c.metadata.name = Some("job-nic".into());
        c.metadata.uid = Some("uid-1".into());
        c.status = Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(
                        results
                            .iter()
                            .map(|(driver, pool, device)| DeviceRequestAllocationResult {
                                driver: driver.to_string(),
                                pool: pool.to_string(),
                                device: device.to_string(),
                                request: "nic".into(),
                                ..Default::default()
                            })
                            .collect(),
                    ),
                    config: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        c
    }

    #[test]
    fn only_this_drivers_results_in_this_nodes_pool_are_prepared() {
        let c = claim(&[
            ("gpu.nvidia.com", "node-a", "gpu-0"),
            ("rdma.gpustack.ai", "node-a", "pci-0000-3b-00-0"),
            ("rdma.gpustack.ai", "node-b", "pci-0000-3b-00-0"),
        ]);
        let p = prepare(&c, "uid-1", "rdma.gpustack.ai", "node-a", &pool()).unwrap();
        assert_eq!(p.devices.len(), 1);
        assert_eq!(p.devices[0].cdi_device_ids, ["gpustack.ai/rdma=mlx5_0"]);
        assert_eq!(p.devices[0].request_names, ["nic"]);
        assert_eq!(p.rdma_devices, ["mlx5_0"]);
    }

    #[test]
    fn a_replaced_claim_an_unallocated_one_and_a_gone_device_are_refused_naming_the_claim() {
        let c = claim(&[("rdma.gpustack.ai", "node-a", "pci-0000-3b-00-0")]);
        let e = prepare(&c, "uid-0", "rdma.gpustack.ai", "node-a", &pool()).unwrap_err();
        assert!(e.to_string().contains("team/job-nic"), "{e}");
        let mut unallocated = c.clone();
        unallocated.status = None;
        let e = prepare(&unallocated, "uid-1", "rdma.gpustack.ai", "node-a", &pool()).unwrap_err();
        assert!(matches!(e, ClaimError::NotAllocated { .. }));
        let gone = claim(&[("rdma.gpustack.ai", "node-a", "pci-0000-af-00-0")]);
        let e = prepare(&gone, "uid-1", "rdma.gpustack.ai", "node-a", &pool()).unwrap_err();
        assert!(e.to_string().contains("pci-0000-af-00-0"), "{e}");
    }
}
