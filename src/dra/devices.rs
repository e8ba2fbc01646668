//! The pool's devices: each CDI device of the published specs becomes one
//! DRA device with a stable DNS-label name, the attributes a claim selects
//! on, and the CDI device ID that Prepare hands back. A pure function of
//! the specs and the rail record, so the same files always make the same
//! pool (and the driver writes nothing when they did not change).

use super::attributes as attr;
use crate::cdi::{Device, EndpointAnnotations, Family, Spec};
use crate::rails::RailRecord;
use crate::record::LinkState;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The most attributes (and capacities) the API server takes per device.
pub const MAX_ATTRIBUTES: usize = 32;

/// The longest string attribute value the API server takes.
pub const MAX_STRING: usize = 64;

/// The specs the driver serves from: each family's file and what it says.
pub type Published = BTreeMap<Family, (PathBuf, Spec)>;

/// One attribute value, as `resource.k8s.io/v1` types them.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Attribute {
    /// `bool`.
    Bool(bool),
    /// `int` (64-bit).
    Int(i64),
    /// `string`, at most [`MAX_STRING`] characters.
    String(String),
}

/// One device of the pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraDevice {
    /// The device name in the pool: a DNS label derived from the PCI
    /// address, so it survives reboots that renumber `mlx5_N`.
    pub name: String,
    /// The family (whole interface or VF) whose spec it came from.
    pub family: Family,
    /// The fully qualified CDI device ID, `gpustack.ai/rdma=mlx5_0`.
    pub cdi_id: String,
    /// The RDMA device (`mlx5_0`), the claim's `NCCL_IB_HCA` entry.
    pub rdma_device: String,
    /// The link verdict, also the `linkState` attribute.
    pub link: LinkState,
    /// The ports' states the verdict rests on (`1=DOWN/Disabled`), when
    /// the spec says: a `Failed` device's taint value and health message.
    pub ports: Option<String>,
    /// The index the rail record gives the NIC's one rail (`railIndex`),
    /// NCCL's third `NCCL_IB_HCA` field; `None` without one.
    pub rail_index: Option<u32>,
    /// Attribute name → value. Standard attributes carry their domain
    /// (`resource.kubernetes.io/pcieRoot`); the driver's own are bare
    /// (`linkState`), which the API reads as in the driver's domain.
    pub attributes: BTreeMap<String, Attribute>,
}

/// The devices of the pool, sorted by name, and the CDI devices left out
/// with the reason (naming the spec file and the device).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pool {
    /// The devices to publish.
    pub devices: Vec<DraDevice>,
    /// Why each CDI device that is not published was left out.
    pub refused: Vec<String>,
}

impl Pool {
    /// The device of this name, if the pool has it.
    pub fn device(&self, name: &str) -> Option<&DraDevice> {
        self.devices
            .binary_search_by(|d| d.name.as_str().cmp(name))
            .ok()
            .map(|i| &self.devices[i])
    }
}

/// The pool the published specs and the rail record (when there is one)
/// describe.
pub fn pool(specs: &Published, rails: Option<&RailRecord>) -> Pool {
    let mut pool = Pool::default();
    let mut by_name: BTreeMap<String, DraDevice> = BTreeMap::new();
    for (family, (path, spec)) in specs {
        for device in &spec.devices {
            let annotations = match device.endpoint(&spec.kind, path) {
                Ok(a) => a,
                Err(e) => {
                    pool.refused.push(e.to_string());
                    continue;
                }
            };
            let made = of_device(*family, &spec.kind, device, &annotations, rails);
            if let Some(other) = by_name.get(&made.name) {
                pool.refused.push(format!(
                    "{}: CDI device {}: its DRA device name {} is already taken by {}",
                    path.display(),
                    made.cdi_id,
                    made.name,
                    other.cdi_id
                ));
                continue;
            }
            by_name.insert(made.name.clone(), made);
        }
    }
    pool.devices = by_name.into_values().collect();
    pool
}

/// The DRA device name of an endpoint: `pci-DDDD-BB-DD-F` from its PCI
/// address, else `rdma-` and the RDMA device name made a DNS label (a
/// software device such as `rxe0` has no PCI address).
pub fn device_name(pci_address: Option<&str>, rdma_device: &str) -> String {
    match pci_address {
        Some(pci) => format!("pci-{}", label(pci)),
        None => format!("rdma-{}", label(rdma_device)),
    }
}

/// `s` lower-cased with every character outside `[a-z0-9]` made `-`, runs
/// of `-` kept (so distinct inputs of one shape stay distinct), cut to fit
/// a 63-character label with its prefix and never ending in `-`.
fn label(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '-'
            }
        })
        .take(58)
        .collect();
    while out.ends_with('-') {
        out.pop();
    }
    if out.is_empty() {
        out.push('0');
    }
    out
}

fn of_device(
    family: Family,
    kind: &str,
    device: &Device,
    a: &EndpointAnnotations,
    rails: Option<&RailRecord>,
) -> DraDevice {
    let mut attributes = BTreeMap::new();
    let mut put = |name: &str, value: Attribute| {
        if let Attribute::String(s) = &value {
            if s.chars().count() > MAX_STRING {
                return;
            }
        }
        attributes.insert(name.to_string(), value);
    };
    if let Some(root) = &a.pcie_root {
        put(attr::PCIE_ROOT, Attribute::String(root.clone()));
    }
    if let Some(pci) = &a.pci_address {
        put(attr::PCI_BUS_ID, Attribute::String(pci.clone()));
    }
    if let Some(numa) = a.numa {
        // Both names: the standard one pairs with other drivers' devices,
        // the driver's own is what claims written before it select on.
        put(attr::NUMA_NODE, Attribute::Int(i64::from(numa)));
        put(attr::OWN_NUMA_NODE, Attribute::Int(i64::from(numa)));
    }
    put(attr::RDMA_DEVICE, Attribute::String(a.rdma_device.clone()));
    if !a.interfaces.is_empty() {
        put(
            attr::IF_NAME,
            Attribute::String(
                a.interfaces
                    .join(&crate::cdi::INTERFACE_SEPARATOR.to_string()),
            ),
        );
    }
    put(
        attr::LINK_STATE,
        Attribute::String(a.link.as_str().to_string()),
    );
    if let Some(layer) = &a.link_layer {
        put(attr::LINK_LAYER, Attribute::String(layer.clone()));
    }
    put(attr::VIRTUAL_FUNCTION, Attribute::Bool(a.parent.is_some()));
    if let Some(parent) = &a.parent {
        put(attr::PARENT_PCI_BUS_ID, Attribute::String(parent.clone()));
    }
    let rail = rail_of(rails, a);
    // Only a NIC on exactly one rail has one index to tell.
    let rail_index = rail
        .as_ref()
        .and_then(|r| rails?.rail_index.get(r).copied());
    if let Some(rail) = rail {
        put(attr::RAIL, Attribute::String(rail));
    }
    DraDevice {
        name: device_name(a.pci_address.as_deref(), &a.rdma_device),
        family,
        cdi_id: format!("{kind}={}", device.name),
        rdma_device: a.rdma_device.clone(),
        link: a.link,
        ports: a.ports.clone(),
        rail_index,
        attributes,
    }
}

/// The rail the rail record puts this endpoint's NIC on (a VF's, its PF's),
/// when it names exactly one.
fn rail_of(rails: Option<&RailRecord>, a: &EndpointAnnotations) -> Option<String> {
    let nic = a.parent.as_ref().or(a.pci_address.as_ref())?;
    match rails?.nics.get(nic)?.as_slice() {
        [one] => Some(one.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_dns_labels_from_the_pci_address_not_the_rdma_numbering() {
        assert_eq!(
            device_name(Some("0000:3b:00.0"), "mlx5_7"),
            "pci-0000-3b-00-0"
        );
        assert_eq!(
            device_name(Some("10000:e1:00.1"), "mlx5_0"),
            "pci-10000-e1-00-1"
        );
        assert_eq!(device_name(None, "rxe_0"), "rdma-rxe-0");
        assert_eq!(device_name(None, "_"), "rdma-0");
        let long = device_name(None, &"x".repeat(200));
        assert!(long.len() <= 63, "{long}");
    }

    #[test]
    fn a_vf_with_every_fact_carries_only_the_listed_names_numa_under_both() {
        let a = EndpointAnnotations {
            rdma_device: "mlx5_3".into(),
            pci_address: Some("0000:04:00.2".into()),
            pcie_root: Some("pci0000:00".into()),
            numa: Some(1),
            link: LinkState::Ok,
            link_layer: Some("Ethernet".into()),
            interfaces: vec!["ens1f0v1".into()],
            parent: Some("0000:04:00.0".into()),
            ports: None,
        };
        let device = Device {
            name: "mlx5_3".into(),
            annotations: BTreeMap::new(),
            container_edits: Default::default(),
        };
        let rails = RailRecord {
            version: String::new(),
            node_uid: String::new(),
            rail_source: "interface-name".into(),
            nics: BTreeMap::from([("0000:04:00.0".to_string(), vec!["rail0".to_string()])]),
            rail_index: BTreeMap::new(),
            gpus: Vec::new(),
        };
        let d = of_device(
            Family::Partitioned,
            "gpustack.ai/rdma-vf",
            &device,
            &a,
            Some(&rails),
        );
        let names: Vec<&str> = d.attributes.keys().map(String::as_str).collect();
        let mut listed: Vec<&str> = attr::STANDARD.iter().chain(&attr::OWN).copied().collect();
        listed.sort();
        assert_eq!(names, listed, "every listed name, and no other");
        assert_eq!(d.attributes[attr::NUMA_NODE], Attribute::Int(1));
        assert_eq!(d.attributes[attr::OWN_NUMA_NODE], Attribute::Int(1));
        assert!(d.attributes.len() <= MAX_ATTRIBUTES);
    }
}
