//! Network interfaces, starting at `class/net`, with SR-IOV VFs nested under
//! their physical function.

use super::{device_topology, numa_of};
use crate::discover::rdma;
use crate::record::{Interface, LinkState, LinkVerdict};
use crate::sysfs::{basename, join, parse_hex, SysError, SysRoot};
use tracing::warn;

/// Enumerates `class/net`. Only a failure to list the folder itself is an
/// error (a failed enumeration); a bad entry is logged and skipped.
pub fn interfaces(root: &SysRoot) -> Result<Vec<Interface>, SysError> {
    let mut out = Vec::new();
    for name in root.list("class/net")? {
        match interface(root, &name) {
            Ok(Some(iface)) => out.push(iface),
            Ok(None) => {}
            Err(e) => warn!("skipping interface {name}: {e}"),
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// One top-level interface; `None` for a VF (its PF lists it).
fn interface(root: &SysRoot, name: &str) -> Result<Option<Interface>, SysError> {
    let netdir = root.resolve(&format!("class/net/{name}"))?;
    let device = match root.resolve(&join(&netdir, "device")) {
        Ok(d) => Some(d),
        Err(e) if e.is_not_found() => None,
        Err(e) => return Err(e),
    };
    if let Some(dev) = &device {
        if root.exists(&join(dev, "physfn")) {
            return Ok(None);
        }
    }
    let mut iface = build(root, Some(name.to_string()), Some(&netdir), device.as_deref());
    if let Some(dev) = &device {
        iface.virtual_functions = virtual_functions(root, dev, &iface);
    }
    Ok(Some(iface))
}

/// The bus a device sits on, from its `subsystem` link.
fn bus_of(root: &SysRoot, device: &str) -> String {
    root.resolve(&join(device, "subsystem"))
        .map(|s| basename(&s).to_string())
        .unwrap_or_else(|_| "unknown".to_string())
}

/// Builds an interface from its net folder (if it has a netdev) and its device
/// folder (if it has a device). Unreadable optional attributes are left empty.
fn build(root: &SysRoot, name: Option<String>, netdir: Option<&str>, device: Option<&str>) -> Interface {
    let is_virtual = netdir.is_some_and(|n| n.starts_with("devices/virtual/")) || device.is_none();
    let bus = match device {
        Some(dev) => bus_of(root, dev),
        None => "virtual".to_string(),
    };
    let mut iface = Interface {
        name,
        bus: bus.clone(),
        is_virtual,
        ..Default::default()
    };
    if let Some(net) = netdir {
        iface.mtu = root.read_trimmed(&join(net, "mtu")).ok().and_then(|v| v.parse().ok());
        // `unknown` is what drivers without carrier reporting (loopback, some
        // virtual NICs) say; then the administrative IFF_UP flag decides.
        let oper = root.read_trimmed(&join(net, "operstate")).unwrap_or_default();
        let admin_up = root
            .read_trimmed(&join(net, "flags"))
            .ok()
            .and_then(|f| parse_hex(&f))
            .is_some_and(|f| f & 0x1 != 0);
        iface.up = oper == "up" || (oper == "unknown" && admin_up);
    }
    let Some(dev) = device else { return iface };
    iface.numa = numa_of(root, dev);
    iface.cpu_affinity = root.read_trimmed(&join(dev, "local_cpulist")).ok().filter(|s| !s.is_empty());
    if bus == "pci" {
        iface.pci_bus_id = Some(basename(dev).to_string());
        iface.topology = device_topology(dev);
    }
    let total_vfs: u32 = read_u32(root, &join(dev, "sriov_totalvfs"));
    iface.physical_function = total_vfs > 0;
    iface.virtual_functions_configured = read_u32(root, &join(dev, "sriov_numvfs"));
    match rdma::bound_device(root, dev) {
        Ok(Some(ibdev)) => {
            iface.link = Some(rdma::link_verdict(root, dev, &ibdev));
            iface.rdma = true;
            iface.rdma_device = Some(ibdev);
        }
        Ok(None) => {}
        Err(e) => {
            // The RDMA tree exists but could not be read: no device to name,
            // and an Unverified verdict so the node is not judged by it.
            iface.link = Some(LinkVerdict {
                state: LinkState::Unverified,
                reason: Some(format!("RDMA tree unreadable: {e}")),
                ports: vec![],
                first_seen: None,
            });
        }
    }
    iface
}

fn read_u32(root: &SysRoot, rel: &str) -> u32 {
    root.read_trimmed(rel).ok().and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// The PF's VFs, from its `virtfnN` links, sorted by PCI address. A VF shares
/// its PF's upstream bridges; its NUMA node is its own.
fn virtual_functions(root: &SysRoot, pf_dev: &str, pf: &Interface) -> Vec<Interface> {
    let Ok(entries) = root.list(pf_dev) else { return vec![] };
    let mut vfs = Vec::new();
    for entry in entries.iter().filter(|e| e.starts_with("virtfn")) {
        let vf_dev = match root.resolve(&join(pf_dev, entry)) {
            Ok(d) => d,
            Err(e) => {
                warn!("skipping VF {entry} of {}: {e}", pf.pci_bus_id.as_deref().unwrap_or("?"));
                continue;
            }
        };
        let netdev = root
            .list(&join(&vf_dev, "net"))
            .ok()
            .and_then(|n| n.into_iter().next());
        let netdir = netdev.as_ref().map(|n| join(&vf_dev, &format!("net/{n}")));
        let mut vf = build(root, netdev, netdir.as_deref(), Some(&vf_dev));
        vf.is_virtual = false;
        vf.parent = pf.pci_bus_id.clone();
        vf.topology = pf.topology.clone();
        vfs.push(vf);
    }
    vfs.sort_by(|a, b| a.pci_bus_id.cmp(&b.pci_bus_id));
    vfs
}
