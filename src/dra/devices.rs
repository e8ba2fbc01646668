//! The pool's devices: each CDI device of the published specs becomes one
//! DRA device with a stable DNS-label name, the attributes a claim selects
//! on, and the CDI device ID that Prepare hands back. A pure function of
//! the specs and the rail record, so the same files always make the same
//! pool (and the driver writes nothing when they did not change).

use crate::cdi::{Device, EndpointAnnotations, Family, Spec};
use crate::rails::RailRecord;
use crate::record::LinkState;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Kubernetes' own attribute domain: `resource.kubernetes.io/pcieRoot` is
/// what lets a claim match a GPU of another driver with the NIC beside it.
pub const STANDARD_DOMAIN: &str = "resource.kubernetes.io";

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
        put(
            &format!("{STANDARD_DOMAIN}/pcieRoot"),
            Attribute::String(root.clone()),
        );
    }
    if let Some(pci) = &a.pci_address {
        put(
            &format!("{STANDARD_DOMAIN}/pciBusID"),
            Attribute::String(pci.clone()),
        );
    }
    if let Some(numa) = a.numa {
        put("numaNode", Attribute::Int(i64::from(numa)));
    }
    put("rdmaDevice", Attribute::String(a.rdma_device.clone()));
    if !a.interfaces.is_empty() {
        put(
            "ifName",
            Attribute::String(
                a.interfaces
                    .join(&crate::cdi::INTERFACE_SEPARATOR.to_string()),
            ),
        );
    }
    put("linkState", Attribute::String(a.link.as_str().to_string()));
    if let Some(layer) = &a.link_layer {
        put("linkLayer", Attribute::String(layer.clone()));
    }
    put("virtualFunction", Attribute::Bool(a.parent.is_some()));
    if let Some(parent) = &a.parent {
        put("parentPciBusID", Attribute::String(parent.clone()));
    }
    if let Some(rail) = rail_of(rails, a) {
        put("rail", Attribute::String(rail));
    }
    DraDevice {
        name: device_name(a.pci_address.as_deref(), &a.rdma_device),
        family,
        cdi_id: format!("{kind}={}", device.name),
        rdma_device: a.rdma_device.clone(),
        link: a.link,
        ports: a.ports.clone(),
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
}
