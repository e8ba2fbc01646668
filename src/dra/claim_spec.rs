//! The one thing Prepare creates per claim: a small CDI spec of its own
//! whose only device sets `NCCL_IB_HCA` (to every NIC of the container
//! holding the claim, [`super::nccl`]), the
//! parity the device plugin gives through Allocate's environment. Its ID is
//! returned once among the claim's CDI device IDs; everything else a
//! container gets comes from the publisher's specs.

use crate::cdi::{self, ContainerEdits, Device, Spec};
use crate::publish::{self, PublishError};
use std::collections::BTreeMap;
use std::path::Path;

/// The CDI kind of per-claim specs.
pub const KIND: &str = "gpustack.ai/rdma-claim";

/// The file prefix of per-claim specs; the rest is the claim UID.
pub const FILE_PREFIX: &str = "nodefabric-claim-";

/// The spec file of the claim with this UID.
pub fn file_name(claim_uid: &str) -> String {
    format!("{FILE_PREFIX}{claim_uid}.json")
}

/// The CDI device ID of the claim's spec.
pub fn cdi_id(claim_uid: &str) -> String {
    format!("{KIND}={claim_uid}")
}

/// The claim's spec: one device named after the claim UID, setting
/// `NCCL_IB_HCA` to `value`.
pub fn spec(claim_uid: &str, value: &str) -> Spec {
    Spec {
        cdi_version: cdi::CDI_VERSION.to_string(),
        kind: KIND.to_string(),
        devices: vec![Device {
            name: claim_uid.to_string(),
            annotations: BTreeMap::new(),
            container_edits: ContainerEdits {
                env: vec![format!("NCCL_IB_HCA={value}")],
                device_nodes: Vec::new(),
            },
        }],
        container_edits: ContainerEdits::default(),
    }
}

/// Writes the claim's spec atomically; unchanged bytes are not rewritten.
/// True when the file was missing or differed.
pub fn write(cdi_dir: &Path, claim_uid: &str, value: &str) -> Result<bool, PublishError> {
    let bytes = cdi::to_bytes(&spec(claim_uid, value));
    publish::write_if_changed(cdi_dir, &file_name(claim_uid), &bytes)
}

/// Removes the claim's spec; one already gone is no error.
pub fn remove(cdi_dir: &Path, claim_uid: &str) -> std::io::Result<()> {
    publish::remove_if_present(&cdi_dir.join(file_name(claim_uid))).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_claim_spec_names_the_claim_and_sets_only_nccl_ib_hca() {
        let s = spec("0b6c-uid", "=mlx5_0,mlx5_3");
        assert_eq!(s.devices.len(), 1);
        assert_eq!(
            s.devices[0].container_edits.env,
            ["NCCL_IB_HCA==mlx5_0,mlx5_3"]
        );
        assert!(s.devices[0].container_edits.device_nodes.is_empty());
        assert_eq!(cdi_id("0b6c-uid"), "gpustack.ai/rdma-claim=0b6c-uid");
        assert!(crate::names::is_cdi_device_name("0b6c-uid"));
    }
}
