//! CDI specs from the node record: which endpoints each family holds and
//! the device that hands each one over.

use super::{ContainerEdits, Device, DeviceNode, EndpointAnnotations, Family, Spec, CDI_VERSION};
use crate::record::{Interface, LinkState, NodeRecord};

/// Why a family's spec cannot be generated.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{kind}: {reasons}", reasons = joined(.reasons))]
pub struct CdiError {
    /// The family's kind.
    pub kind: &'static str,
    /// One diagnostic per endpoint that could not be resolved.
    pub reasons: Vec<Unresolved>,
}

/// Why one endpoint has no CDI device, so a caller can tell a name it must
/// skip from a verbs device that may yet appear.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unresolved {
    /// The RDMA device's name would not survive a `kind=name` reference.
    #[error("RDMA device name {0:?} is not a valid CDI device name")]
    BadName(String),
    /// No verbs character device to hand over; the reason is the record's
    /// `verbsError` as discovery wrote it.
    #[error("{reason}")]
    NoVerbs {
        /// The RDMA device.
        rdma_device: String,
        /// Why, as the record says.
        reason: String,
    },
    /// Two endpoints share an RDMA device but would inject different nodes.
    #[error("RDMA device {0} is bound to endpoints that inject different device nodes")]
    ConflictingNodes(String),
}

/// The endpoints' reasons as one line.
fn joined(reasons: &[Unresolved]) -> String {
    let texts: Vec<String> = reasons.iter().map(ToString::to_string).collect();
    texts.join("; ")
}

/// An endpoint of a family: the interface and, for a VF, its PF.
type Endpoint<'a> = (&'a Interface, Option<&'a Interface>);

/// The endpoints of a family, read off the record (never chosen): a PF with
/// VFs configured serves only through its VFs. Endpoints without a bound
/// RDMA device name have nothing to hand over and are in no family.
pub fn endpoints(record: &NodeRecord, family: Family) -> Vec<Endpoint<'_>> {
    let mut out = Vec::new();
    for iface in &record.spec.interfaces {
        let partitioned = iface.physical_function && iface.virtual_functions_configured > 0;
        match (family, partitioned) {
            (Family::Whole, false) => out.push((iface, None)),
            (Family::Partitioned, true) => {
                out.extend(iface.virtual_functions.iter().map(|vf| (vf, Some(iface))))
            }
            _ => {}
        }
    }
    out.retain(|(ep, _)| ep.rdma_device.is_some());
    out
}

/// An endpoint's device before its annotations are written: the typed
/// value, so merging works on names rather than on annotation text.
struct Draft {
    endpoint: EndpointAnnotations,
    edits: ContainerEdits,
}

fn draft(ep: &Interface, parent: Option<&Interface>) -> Result<Draft, Unresolved> {
    let ibdev = ep
        .rdma_device
        .as_deref()
        .expect("endpoints() keeps bound ones");
    if !crate::names::is_cdi_device_name(ibdev) {
        return Err(Unresolved::BadName(ibdev.to_string()));
    }
    let verbs = ep.verbs.as_ref().ok_or_else(|| Unresolved::NoVerbs {
        rdma_device: ibdev.to_string(),
        reason: ep
            .verbs_error
            .clone()
            .unwrap_or_else(|| format!("no verbs device for {ibdev}")),
    })?;
    let endpoint = EndpointAnnotations {
        rdma_device: ibdev.to_string(),
        pci_address: ep.pci_bus_id.clone(),
        pcie_root: ep.topology.as_ref().and_then(|t| t.pcie_root.clone()),
        numa: ep.effective_numa(parent),
        link: ep.link.as_ref().map_or(LinkState::Unverified, |l| l.state),
        link_layer: ep
            .link
            .as_ref()
            .and_then(|l| l.link_layer())
            .filter(|l| crate::cdi::annotations::is_link_layer(l))
            .map(str::to_string),
        interfaces: ep.name.iter().cloned().collect(),
        parent: parent.and_then(|p| p.pci_bus_id.clone()),
        ports: ep
            .link
            .as_ref()
            .and_then(|l| crate::cdi::annotations::ports_summary(&l.ports)),
    };
    Ok(Draft {
        endpoint,
        edits: ContainerEdits {
            env: vec![],
            device_nodes: vec![verbs.into()],
        },
    })
}

/// The spec of one family: `Ok(None)` when it has no endpoints (its file is
/// removed), an error naming every endpoint that cannot be resolved.
pub fn spec(record: &NodeRecord, family: Family) -> Result<Option<Spec>, CdiError> {
    let eps = endpoints(record, family);
    if eps.is_empty() {
        return Ok(None);
    }
    let mut drafts = Vec::new();
    let mut reasons = Vec::new();
    for (ep, parent) in eps {
        match draft(ep, parent) {
            Ok(d) => drafts.push(d),
            Err(why) => reasons.push(why),
        }
    }
    drafts.sort_by(|a, b| {
        (&a.endpoint.rdma_device, &a.endpoint.interfaces)
            .cmp(&(&b.endpoint.rdma_device, &b.endpoint.interfaces))
    });
    let devices = merge_shared_rdma_devices(drafts, &mut reasons)
        .into_iter()
        .map(|d| Device {
            name: d.endpoint.rdma_device.clone(),
            annotations: d.endpoint.to_map(),
            container_edits: d.edits,
        })
        .collect();
    if !reasons.is_empty() {
        return Err(CdiError {
            kind: family.kind(),
            reasons,
        });
    }
    let container_edits = ContainerEdits {
        env: vec![],
        device_nodes: record.spec.rdma_cm.iter().map(DeviceNode::from).collect(),
    };
    Ok(Some(Spec {
        cdi_version: CDI_VERSION.into(),
        kind: family.kind().into(),
        devices,
        container_edits,
    }))
}

/// One CDI device per RDMA device: two netdevs on one RDMA device (both
/// ports of a dual-port HCA on one PCI function, an IPoIB child interface)
/// would otherwise give two devices of one name, and CDI loaders reject a
/// spec with a duplicate name whole. The devices are merged when they inject
/// the same thing; their interface names are listed together, sorted.
/// Devices that share a name but differ in what they inject cannot be one
/// device and are refused, naming the RDMA device. `drafts` is sorted by name.
fn merge_shared_rdma_devices(drafts: Vec<Draft>, reasons: &mut Vec<Unresolved>) -> Vec<Draft> {
    let mut out: Vec<Draft> = Vec::with_capacity(drafts.len());
    for d in drafts {
        match out.last_mut() {
            Some(prev) if prev.endpoint.rdma_device == d.endpoint.rdma_device => {
                if prev.edits != d.edits {
                    reasons.push(Unresolved::ConflictingNodes(d.endpoint.rdma_device.clone()));
                    continue;
                }
                prev.endpoint.interfaces.extend(d.endpoint.interfaces);
            }
            _ => out.push(d),
        }
    }
    out
}
