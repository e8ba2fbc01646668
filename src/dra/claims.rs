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
    /// The allocation's share of a shared device (the result's `shareID`),
    /// echoed to kubelet; absent for an exclusive device, and then not
    /// written, so a checkpoint without shares keeps its bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
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
    /// The driver whose allocation results these are: the stale-claim
    /// sweep checks the claim is still allocated by it (empty in a v1
    /// checkpoint until upgraded).
    #[serde(default)]
    pub driver: String,
    /// The devices, in the order of the allocation results.
    pub devices: Vec<PreparedDevice>,
    /// Their RDMA devices, each once.
    pub rdma_devices: Vec<String>,
    /// What the claim's spec sets `NCCL_IB_HCA` to, as `name:port` (or
    /// `name:port:rail`) entries:
    /// every NIC of the container(s) holding it ([`super::nccl`]). Empty in
    /// claims prepared by releases before it (and not written then, so
    /// their checkpoint keeps its bytes): their spec keeps naming
    /// [`Prepared::rdma_devices`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nccl_ib_hca: Vec<String>,
}

impl Prepared {
    /// The claim spec's `NCCL_IB_HCA` value; `None` when the claim has no
    /// RDMA device (no spec then).
    pub fn nccl_value(&self) -> Option<String> {
        if self.rdma_devices.is_empty() {
            return None;
        }
        Some(if self.nccl_ib_hca.is_empty() {
            // `=` asks NCCL for exactly these devices, not a prefix match.
            format!("={}", self.rdma_devices.join(","))
        } else {
            super::nccl::value(&self.nccl_ib_hca)
        })
    }
}

/// The most allocation results one claim may hold (`resource.k8s.io/v1`
/// `AllocationResultsMaxSize`): more is no claim the API server made.
pub const MAX_RESULTS: usize = 32;

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
    /// A result of this driver names another node's pool: kubelet asked
    /// the wrong node, and an empty success would start the pod without
    /// its NIC.
    #[error("ResourceClaim {namespace}/{name}: allocation result {index} names device {device} of pool {pool}, which is not this node's pool")]
    OtherPool {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// The result's position in the allocation.
        index: usize,
        /// The pool it names.
        pool: String,
        /// The device it names.
        device: String,
    },
    /// No result is this driver's: kubelet calls a driver only for claims
    /// it has devices in, so an empty answer would hide a mistake.
    #[error("ResourceClaim {namespace}/{name} has no device of driver {driver} allocated")]
    NoResultOfDriver {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// This driver.
        driver: String,
    },
    /// One device allocated twice in one claim: an exclusive NIC is one
    /// device, however many requests name it (two shares of one shared
    /// device, told apart by their share IDs, are two allocations).
    #[error("ResourceClaim {namespace}/{name}: device {device} is allocated twice (requests {first} and {second})")]
    DeviceTwice {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// The device.
        device: String,
        /// The first request naming it.
        first: String,
        /// The second.
        second: String,
    },
    /// More results than the API allows.
    #[error("ResourceClaim {namespace}/{name} holds {count} allocation results; the API allows at most {MAX_RESULTS}")]
    TooManyResults {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// How many.
        count: usize,
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
    if results.len() > MAX_RESULTS {
        return Err(ClaimError::TooManyResults {
            namespace,
            name,
            count: results.len(),
        });
    }
    let mut out = Prepared {
        namespace: namespace.clone(),
        name: name.clone(),
        driver: driver.to_string(),
        ..Prepared::default()
    };
    for (index, r) in results.iter().enumerate() {
        if r.driver != driver {
            continue;
        }
        if r.pool != pool_name {
            return Err(ClaimError::OtherPool {
                namespace,
                name,
                index,
                pool: r.pool.clone(),
                device: r.device.clone(),
            });
        }
        let twice = |d: &&PreparedDevice| {
            d.device_name == r.device
                && (d.share_id.is_none() || r.share_id.is_none() || d.share_id == r.share_id)
        };
        if let Some(first) = out.devices.iter().find(twice) {
            return Err(ClaimError::DeviceTwice {
                namespace,
                name,
                device: r.device.clone(),
                first: first.request_names.join(","),
                second: r.request.clone(),
            });
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
            share_id: r.share_id.clone(),
        });
        if !out.rdma_devices.contains(&device.rdma_device) {
            out.rdma_devices.push(device.rdma_device.clone());
        }
    }
    if out.devices.is_empty() {
        return Err(ClaimError::NoResultOfDriver {
            namespace,
            name,
            driver: driver.to_string(),
        });
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
                ports: None,
                rail_index: None,
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
    fn only_this_drivers_results_are_prepared() {
        let c = claim(&[
            ("gpu.nvidia.com", "node-a", "gpu-0"),
            ("rdma.gpustack.ai", "node-a", "pci-0000-3b-00-0"),
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

    #[test]
    fn a_result_of_this_driver_in_another_nodes_pool_is_an_error_not_an_empty_success() {
        let c = claim(&[
            ("rdma.gpustack.ai", "node-a", "pci-0000-3b-00-0"),
            ("rdma.gpustack.ai", "node-b", "pci-0000-3b-00-0"),
        ]);
        let e = prepare(&c, "uid-1", "rdma.gpustack.ai", "node-a", &pool()).unwrap_err();
        assert!(matches!(e, ClaimError::OtherPool { index: 1, .. }), "{e}");
        let e = e.to_string();
        assert!(e.contains("team/job-nic") && e.contains("node-b"), "{e}");
        let only_other = claim(&[("rdma.gpustack.ai", "node-b", "pci-0000-3b-00-0")]);
        assert!(prepare(&only_other, "uid-1", "rdma.gpustack.ai", "node-a", &pool()).is_err());
    }

    #[test]
    fn a_claim_with_no_result_of_this_driver_is_an_error_naming_it() {
        let c = claim(&[("gpu.nvidia.com", "node-a", "gpu-0")]);
        let e = prepare(&c, "uid-1", "rdma.gpustack.ai", "node-a", &pool()).unwrap_err();
        assert!(matches!(e, ClaimError::NoResultOfDriver { .. }), "{e}");
        assert!(e.to_string().contains("team/job-nic"), "{e}");
    }

    #[test]
    fn a_device_named_twice_is_refused_rather_than_handed_out_twice() {
        let c = claim(&[
            ("rdma.gpustack.ai", "node-a", "pci-0000-3b-00-0"),
            ("rdma.gpustack.ai", "node-a", "pci-0000-3b-00-0"),
        ]);
        let e = prepare(&c, "uid-1", "rdma.gpustack.ai", "node-a", &pool()).unwrap_err();
        assert!(matches!(e, ClaimError::DeviceTwice { .. }), "{e}");
        assert!(e.to_string().contains("pci-0000-3b-00-0"), "{e}");
    }

    #[test]
    fn two_shares_of_one_device_in_one_claim_are_two_allocations_but_a_share_beside_it_whole_is_not(
    ) {
        let mut c = claim(&[
            ("rdma.gpustack.ai", "node-a", "pci-0000-3b-00-0"),
            ("rdma.gpustack.ai", "node-a", "pci-0000-3b-00-0"),
        ]);
        fn results(c: &mut ResourceClaim) -> &mut Vec<DeviceRequestAllocationResult> {
            let status = c.status.as_mut().unwrap();
            let devices = status.allocation.as_mut().unwrap().devices.as_mut();
            devices.unwrap().results.as_mut().unwrap()
        }
        results(&mut c)[0].share_id = Some("s-1".into());
        results(&mut c)[1].share_id = Some("s-2".into());
        let p = prepare(&c, "uid-1", "rdma.gpustack.ai", "node-a", &pool()).unwrap();
        let shares: Vec<_> = p.devices.iter().map(|d| d.share_id.as_deref()).collect();
        assert_eq!(shares, [Some("s-1"), Some("s-2")]);
        assert_eq!(p.rdma_devices, ["mlx5_0"]);
        results(&mut c)[1].share_id = None;
        let e = prepare(&c, "uid-1", "rdma.gpustack.ai", "node-a", &pool()).unwrap_err();
        assert!(matches!(e, ClaimError::DeviceTwice { .. }), "{e}");
    }

    #[test]
    fn more_results_than_the_api_allows_are_refused() {
        let many: Vec<(&str, &str, &str)> = (0..MAX_RESULTS + 1)
            .map(|_| ("gpu.nvidia.com", "node-a", "gpu-0"))
            .collect();
        let e = prepare(
            &claim(&many),
            "uid-1",
            "rdma.gpustack.ai",
            "node-a",
            &pool(),
        )
        .unwrap_err();
        assert!(
            matches!(e, ClaimError::TooManyResults { count: 33, .. }),
            "{e}"
        );
    }
}
