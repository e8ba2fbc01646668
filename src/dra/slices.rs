//! The pool as `resource.k8s.io/v1` ResourceSlices: a pure function of the
//! pool, the node and the generation, so the publisher can tell "nothing
//! changed" by comparing what it would write with what the server holds.

use super::devices::{Attribute, Pool};
use super::shares::Shares;
use super::taints::{TaintRule, DEVICES_PER_SLICE};
use k8s_openapi::api::resource::v1::{
    Device, DeviceAttribute, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use std::collections::BTreeMap;

/// The most devices the API server takes in one slice.
pub const MAX_DEVICES_PER_SLICE: usize = 128;

/// The Node the slices belong to: they name it, and go with it (owner
/// reference), so a deleted Node takes its slices along.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// The Node's name, also the pool's name.
    pub name: String,
    /// The Node's UID, for the owner reference.
    pub uid: String,
}

/// The prefix of the slices' generated names: `<node>-<driver>-`, the
/// driver's dots made dashes, cut so the server's 5-character suffix fits
/// the 253-character name limit.
pub fn name_prefix(node: &str, driver: &str) -> String {
    let mut prefix = format!("{node}-{}", driver.replace('.', "-"));
    prefix.truncate(253 - 5 - 1);
    prefix.push('-');
    prefix
}

/// The slices of one generation of the pool: devices in name order, at most
/// [`DEVICES_PER_SLICE`] a slice (the limit for slices whose devices carry
/// taints, so a taint appearing changes one slice in place rather than the
/// cut of the pool); an empty pool is one empty slice, so the scheduler sees
/// the pool (and that it has nothing) rather than none. Whole NICs are
/// shareable as `shares` says.
pub fn desired(
    pool: &Pool,
    rule: &TaintRule,
    shares: Shares,
    owner: &Owner,
    generation: i64,
) -> Vec<ResourceSlice> {
    let driver = rule.driver.as_str();
    let devices = devices(pool, rule, shares);
    let chunks: Vec<Vec<Device>> = if devices.is_empty() {
        vec![Vec::new()]
    } else {
        devices
            .chunks(DEVICES_PER_SLICE)
            .map(<[Device]>::to_vec)
            .collect()
    };
    let count = chunks.len() as i64;
    chunks
        .into_iter()
        .map(|devices| ResourceSlice {
            metadata: ObjectMeta {
                generate_name: Some(name_prefix(&owner.name, driver)),
                owner_references: Some(vec![owner_reference(owner)]),
                ..ObjectMeta::default()
            },
            spec: ResourceSliceSpec {
                driver: driver.to_string(),
                node_name: Some(owner.name.clone()),
                pool: ResourcePool {
                    name: owner.name.clone(),
                    generation,
                    resource_slice_count: count,
                },
                devices: Some(devices),
                ..ResourceSliceSpec::default()
            },
        })
        .collect()
}

/// The owner reference to the Node.
pub fn owner_reference(owner: &Owner) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: owner.name.clone(),
        uid: owner.uid.clone(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

/// The pool's devices as the API types them, in name order (the pool's),
/// tainted by `rule`, whole NICs shareable as `shares` says.
pub fn devices(pool: &Pool, rule: &TaintRule, shares: Shares) -> Vec<Device> {
    pool.devices
        .iter()
        .map(|d| {
            let mut device = device(d, rule);
            shares.apply(&mut device, d.family);
            device
        })
        .collect()
}

/// One pool device as the API types it.
fn device(d: &super::devices::DraDevice, rule: &TaintRule) -> Device {
    let attributes: BTreeMap<String, DeviceAttribute> = d
        .attributes
        .iter()
        .map(|(name, value)| (name.clone(), attribute(value)))
        .collect();
    Device {
        name: d.name.clone(),
        attributes: Some(attributes),
        taints: rule.taints(d),
        ..Device::default()
    }
}

fn attribute(value: &Attribute) -> DeviceAttribute {
    match value {
        Attribute::Bool(b) => DeviceAttribute {
            bool: Some(*b),
            ..DeviceAttribute::default()
        },
        Attribute::Int(i) => DeviceAttribute {
            int: Some(*i),
            ..DeviceAttribute::default()
        },
        Attribute::String(s) => DeviceAttribute {
            string: Some(s.clone()),
            ..DeviceAttribute::default()
        },
    }
}

/// The devices a set of slices of one generation publishes, in slice order:
/// what "the same pool" means when comparing with the server. `None` when
/// the slices are not one complete generation (some missing, several
/// generations, a count that disagrees).
pub fn published_devices(slices: &[ResourceSlice]) -> Option<Vec<Device>> {
    let first = slices.first()?;
    let generation = first.spec.pool.generation;
    let count = first.spec.pool.resource_slice_count;
    if count != slices.len() as i64
        || slices.iter().any(|s| {
            s.spec.pool.generation != generation || s.spec.pool.resource_slice_count != count
        })
    {
        return None;
    }
    Some(devices_of(slices))
}

/// The devices of slices, sorted by name: the form [`devices`] gives, so
/// the two compare.
pub fn devices_of(slices: &[ResourceSlice]) -> Vec<Device> {
    let mut devices: Vec<Device> = slices
        .iter()
        .flat_map(|s| s.spec.devices.clone().unwrap_or_default())
        .collect();
    devices.sort_by(|a, b| a.name.cmp(&b.name));
    devices
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdi::Family;
    use crate::dra::devices::DraDevice;
    use crate::record::LinkState;

    fn pool_of(n: usize) -> Pool {
        Pool {
            devices: (0..n)
                .map(|i| DraDevice {
                    name: format!("pci-0000-{:02x}-00-0", i),
                    family: Family::Whole,
                    cdi_id: format!("gpustack.ai/rdma=mlx5_{i}"),
                    rdma_device: format!("mlx5_{i}"),
                    link: if i == 0 {
                        LinkState::Failed
                    } else {
                        LinkState::Ok
                    },
                    ports: (i == 0).then(|| "1=DOWN/Disabled".to_string()),
                    rail_index: None,
                    attributes: BTreeMap::from([(
                        crate::dra::attributes::RDMA_DEVICE.to_string(),
                        Attribute::String(format!("mlx5_{i}")),
                    )]),
                })
                .collect(),
            refused: Vec::new(),
        }
    }

    fn rule(driver: &str) -> TaintRule {
        TaintRule {
            driver: driver.into(),
            effect: Default::default(),
        }
    }

    fn owner() -> Owner {
        Owner {
            name: "node-a".into(),
            uid: "u-1".into(),
        }
    }

    #[test]
    fn a_pool_of_129_devices_is_three_slices_of_one_generation_each_fit_for_taints() {
        let slices = desired(
            &pool_of(129),
            &rule("rdma.gpustack.ai"),
            Shares::EXCLUSIVE,
            &owner(),
            7,
        );
        assert_eq!(slices.len(), 3);
        assert_eq!(slices[0].spec.devices.as_ref().unwrap().len(), 64);
        assert_eq!(slices[2].spec.devices.as_ref().unwrap().len(), 1);
        let first = &slices[0].spec.devices.as_ref().unwrap()[0];
        let taint = &first.taints.as_ref().unwrap()[0];
        assert_eq!(taint.key, "rdma.gpustack.ai/link-failed");
        assert_eq!(taint.value.as_deref(), Some("1-DOWN-Disabled"));
        assert_eq!(taint.effect, "NoSchedule");
        assert!(slices[0].spec.devices.as_ref().unwrap()[1].taints.is_none());
        for s in &slices {
            assert_eq!(s.spec.pool.generation, 7);
            assert_eq!(s.spec.pool.resource_slice_count, 3);
            assert_eq!(s.spec.pool.name, "node-a");
            assert_eq!(s.spec.node_name.as_deref(), Some("node-a"));
            assert_eq!(
                s.metadata.generate_name.as_deref(),
                Some("node-a-rdma-gpustack-ai-")
            );
            let owner = &s.metadata.owner_references.as_ref().unwrap()[0];
            assert_eq!((owner.kind.as_str(), owner.uid.as_str()), ("Node", "u-1"));
        }
        assert_eq!(published_devices(&slices).unwrap().len(), 129);
    }

    #[test]
    fn an_empty_pool_is_one_empty_slice() {
        let slices = desired(
            &pool_of(0),
            &rule("d.example"),
            Shares::EXCLUSIVE,
            &owner(),
            1,
        );
        assert_eq!(slices.len(), 1);
        assert_eq!(slices[0].spec.pool.resource_slice_count, 1);
        assert_eq!(published_devices(&slices), Some(Vec::new()));
    }

    #[test]
    fn slices_of_two_generations_or_a_missing_one_are_not_a_pool() {
        let mut slices = desired(
            &pool_of(200),
            &rule("d.example"),
            Shares::EXCLUSIVE,
            &owner(),
            1,
        );
        slices.pop();
        assert_eq!(published_devices(&slices), None);
        let mut two = desired(
            &pool_of(200),
            &rule("d.example"),
            Shares::EXCLUSIVE,
            &owner(),
            1,
        );
        two[1].spec.pool.generation = 2;
        assert_eq!(published_devices(&two), None);
        assert_eq!(published_devices(&[]), None);
    }

    #[test]
    fn the_name_prefix_fits_a_generated_name() {
        let long = "n".repeat(300);
        assert_eq!(name_prefix(&long, "d.example").len(), 253 - 5);
    }
}
