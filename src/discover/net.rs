//! Network interfaces, starting at `class/net`, with SR-IOV VFs nested under
//! their physical function.

use super::keep::{attribute_in, note, parsed_in, parsed_proving, Unreadable};
use super::{device_topology, node_number, numa_node};
use crate::discover::rdma;
use crate::record::{Fact, Interface, LinkState, LinkVerdict};
use crate::sysfs::{basename, join, parse_hex, with_joined, SysError, SysRoot};
use tracing::warn;

/// What the `class/net` walk found: the interfaces, and its VFs known as
/// such from both sides (see [`Scan::vf_parents`]).
#[derive(Debug, Default)]
pub struct Scan {
    /// Every interface, VFs nested under their PF.
    pub interfaces: Vec<Interface>,
    /// VF PCI address → its PF's, for each VF that its PF lists as a
    /// `virtfnN` and whose own netdev's device has a `physfn` link: the
    /// kernel gives such a function its PF's vendor ID, which spares the
    /// accelerator scan from reading it again.
    pub vf_parents: VfParents,
}

/// VF PCI address → PF PCI address (see [`Scan::vf_parents`]), hashed as
/// paths are: one insert per VF and one look per PCI function.
pub type VfParents = std::collections::HashMap<String, String, crate::sysfs::BuildPathHash>;

/// The `local_cpulist` read this pass for a PCI function on each NUMA node,
/// by the node its `numa_node` printed (`-1` included).
///
/// The kernel prints a PCI function's `local_cpulist` from that number
/// alone: the CPUs of the node, or every online CPU for `-1` (`numa_node`
/// exists only in kernels built with NUMA, which print it so). One read per
/// node therefore answers for every function on it; on a large node that is
/// one read in place of hundreds. An unreadable list is not remembered, so
/// the next function on the node reads its own; and a function answered
/// from the node is not asked, so its own file failing (a device removed
/// during the pass) goes unnoticed, as its other facts would had it gone a
/// moment later.
type NodeCpus = std::collections::HashMap<i64, String>;

/// Enumerates `class/net`. Only a failure to list the folder itself is an
/// error (a failed enumeration). An entry that cannot be read becomes a
/// placeholder marked unreadable, which the previous record fills in: a NIC
/// is never dropped from the record because its folder could not be read.
pub fn interfaces(root: &SysRoot) -> Result<Scan, SysError> {
    // Every entry's folders first: a VF's netdev is one of these entries, so
    // its PF learns the VF's interface name from this walk instead of
    // listing each VF's `net` folder again.
    let names = root.list("class/net")?;
    // About five folders resolved for each interface (its net folder, its
    // device, its RDMA device's): room for them at once, where growing the
    // table hashed every path again at each doubling.
    root.expect_resolutions(names.len() * 5);
    let located: Vec<(String, Result<Located, SysError>)> = names
        .into_iter()
        .map(|name| {
            let at = locate(root, &name);
            (name, at)
        })
        .collect();
    let mut vf_netdevs = VfNetdevs::default();
    for (name, at) in &located {
        if let Ok(Located {
            netdir,
            device: Some(dev),
            is_vf: true,
        }) = at
        {
            // Names come sorted, so the first kept is the one a listing of
            // the VF's `net` folder would give first.
            vf_netdevs
                .entry(dev.as_str())
                .or_insert((name.as_str(), netdir.as_str()));
        }
    }
    // Room for the entries kept here, not for the VFs' netdevs, which are
    // nested under their PF: at 10,000 VFs that was 5.7 MB of empty slots
    // held for the whole pass.
    let kept = located
        .iter()
        .filter(|(_, at)| !matches!(at, Ok(Located { is_vf: true, .. })))
        .count();
    let mut out = Vec::with_capacity(kept);
    let mut walk = Walk {
        root,
        vf_netdevs,
        vf_parents: VfParents::default(),
        node_cpus: NodeCpus::default(),
        bound: rdma::BoundIndex::read(root),
    };
    for (name, at) in &located {
        match at {
            Ok(Located { is_vf: true, .. }) => {}
            Ok(at) => out.push(walk.interface(name, at)),
            Err(e) => {
                warn!("interface {name} unreadable: {e}");
                let mut iface = Interface {
                    name: Some(name.clone()),
                    bus: "unknown".into(),
                    ..Default::default()
                };
                note(&mut iface, Fact::Interface, e.to_string());
                out.push(iface);
            }
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Scan {
        interfaces: out,
        vf_parents: walk.vf_parents,
    })
}

/// The walk over `class/net` entries, with what it learns on the way that
/// later entries reuse.
struct Walk<'a> {
    root: &'a SysRoot,
    /// Each VF's netdev as `class/net` named it, so its PF need not list
    /// the VF's `net` folder.
    vf_netdevs: VfNetdevs<'a>,
    /// What the scan reports (see [`Scan::vf_parents`]), filled as PFs are built.
    vf_parents: VfParents,
    /// One `local_cpulist` per NUMA node (see [`NodeCpus`]).
    node_cpus: NodeCpus,
    /// Which RDMA device each device folder has bound, from one listing.
    bound: rdma::BoundIndex,
}

/// Where one `class/net` entry lives: its canonical net folder, its device
/// folder (none for a virtual interface), and whether that device is a VF.
struct Located {
    netdir: String,
    device: Option<String>,
    is_vf: bool,
}

/// VF device folder → (interface name, canonical net folder), from `class/net`.
type VfNetdevs<'a> =
    std::collections::HashMap<&'a str, (&'a str, &'a str), crate::sysfs::BuildPathHash>;

/// Resolves one `class/net` entry's folders.
fn locate(root: &SysRoot, name: &str) -> Result<Located, SysError> {
    // Joined on the stack: each path is only handed to the resolver.
    let netdir = with_joined("class/net", name, |rel| root.resolve(rel))?;
    let device = match with_joined(&netdir, "device", |rel| root.resolve(rel)) {
        Ok(d) => Some(d),
        Err(e) if e.is_not_found() => None,
        Err(e) => return Err(e),
    };
    // A VF is listed by its PF, not on its own.
    let is_vf = device
        .as_ref()
        .is_some_and(|dev| with_joined(dev, "physfn", |rel| root.exists(rel)));
    Ok(Located {
        netdir,
        device,
        is_vf,
    })
}

impl Walk<'_> {
    /// One top-level interface (a VF is built by its PF).
    fn interface(&mut self, name: &str, at: &Located) -> Interface {
        let device = at.device.as_deref();
        let mut iface = self.build(
            Some(name.to_string()),
            Some(&at.netdir),
            device,
            Function::Top,
        );
        if let Some(dev) = device.filter(|_| may_have_vfs(&iface)) {
            match self.virtual_functions(dev, &iface) {
                Ok(vfs) => iface.virtual_functions = vfs,
                Err(e) => note(&mut iface, Fact::VirtualFunctions, e.to_string()),
            }
        }
        iface
    }

    /// A device's `local_cpulist`; for a PCI function on NUMA node `node`,
    /// the list already read for that node, else read and kept for it.
    fn cpu_list(&mut self, dev: &str, node: Option<i64>) -> Result<Option<String>, Unreadable> {
        if let Some(known) = node.and_then(|n| self.node_cpus.get(&n)) {
            return Ok(Some(known.clone()));
        }
        let list = read_cpu_list(self.root, dev)?;
        if let (Some(n), Some(list)) = (node, &list) {
            self.node_cpus.insert(n, list.clone());
        }
        Ok(list)
    }

    /// Builds an interface from its net folder (if it has a netdev) and its device
    /// folder (if it has a device). An attribute the kernel does not have is an
    /// answer (absent, or 0 VFs); one that is there and cannot be read is noted
    /// as unreadable, for [`keep::keep_previous`] to fill in. `function` says
    /// whether it is a VF (see [`Function`]).
    fn build(
        &mut self,
        name: Option<String>,
        netdir: Option<&str>,
        device: Option<&str>,
        function: Function,
    ) -> Interface {
        let root = self.root;
        let is_virtual =
            netdir.is_some_and(|n| n.starts_with("devices/virtual/")) || device.is_none();
        let (bus, bus_unreadable) = match device.map(|dev| {
            if function == Function::Virtual {
                Ok(Some("pci".to_string()))
            } else {
                bus_of(root, dev)
            }
        }) {
            None => ("virtual".to_string(), None),
            Some(Ok(bus)) => (bus.unwrap_or_else(|| "unknown".to_string()), None),
            // A device folder named by a PCI address is on the PCI bus whatever
            // its unreadable link says; the bus itself is kept from before.
            Some(Err(e))
                if device.is_some_and(|d| crate::pci::normalize(basename(d)).is_some()) =>
            {
                ("pci".to_string(), Some(e.to_string()))
            }
            Some(Err(e)) => ("unknown".to_string(), Some(e.to_string())),
        };
        let mut iface = Interface {
            name,
            bus: bus.clone(),
            is_virtual,
            ..Default::default()
        };
        if let Some(why) = bus_unreadable {
            note(&mut iface, Fact::Bus, why);
        }
        if let Some(net) = netdir {
            // The first read in the net folder: it proves the folder where
            // the tree presumed it (the target of a `class/net` link).
            match parsed_proving(root, net, "mtu") {
                Ok(v) => iface.mtu = v,
                Err(why) => note(&mut iface, Fact::Mtu, why),
            }
            // `unknown` is what drivers without carrier reporting (loopback, some
            // virtual NICs) say; then the administrative IFF_UP flag decides.
            match attribute_in(root, net, "operstate") {
                Ok(Some(oper)) if !OPERSTATES.contains(&oper.as_str()) => {
                    note(
                        &mut iface,
                        Fact::Up,
                        format!("{net}/operstate: {oper:?} is not an RFC 2863 operational state"),
                    );
                }
                Ok(oper) => {
                    let oper = oper.unwrap_or_default();
                    if oper == "unknown" {
                        match attribute_in(root, net, "flags") {
                            Ok(flags) => {
                                iface.up = flags
                                    .and_then(|f| parse_hex(&f))
                                    .is_some_and(|f| f & 0x1 != 0)
                            }
                            Err(why) => note(&mut iface, Fact::Up, why),
                        }
                    } else {
                        iface.up = oper == "up";
                    }
                }
                Err(why) => note(&mut iface, Fact::Up, why),
            }
        }
        let Some(dev) = device else { return iface };
        let node = match numa_node(root, dev) {
            Ok(n) => {
                iface.numa = n.and_then(node_number);
                n
            }
            Err(why) => {
                note(&mut iface, Fact::Numa, why);
                None
            }
        };
        // A PCI function's CPUs follow from its node (see [`NodeCpus`]).
        let node = node.filter(|_| bus == "pci");
        match self.cpu_list(dev, node) {
            Ok(v) => iface.cpu_affinity = v.filter(|s| !s.is_empty()),
            Err(why) => note(&mut iface, Fact::CpuAffinity, why),
        }
        if bus == "pci" {
            iface.pci_bus_id = Some(basename(dev).to_string());
            if function == Function::Top {
                iface.topology = device_topology(dev).map(std::sync::Arc::new);
            }
        }
        // A device without the SR-IOV attributes is not a PF: that absence is the
        // kernel's answer. An unreadable one is not, and must not move a PF with
        // VFs into the whole-interface families.
        if function == Function::Top {
            match parsed_in::<u32>(root, dev, "sriov_totalvfs") {
                Ok(total) => iface.physical_function = total.unwrap_or(0) > 0,
                Err(why) => note(&mut iface, Fact::PhysicalFunction, why),
            }
            match parsed_in::<u32>(root, dev, "sriov_numvfs") {
                Ok(n) => iface.virtual_functions_configured = n.unwrap_or(0),
                Err(why) => note(&mut iface, Fact::VirtualFunctionsConfigured, why),
            }
        }
        match self.bound.bound_device(root, dev) {
            Ok(Some(ibdev)) => {
                iface.link = Some(rdma::link_verdict(root, dev, &ibdev));
                iface.rdma = true;
                iface.rdma_device = Some(ibdev);
            }
            Ok(None) => {}
            Err(e) => {
                // The RDMA tree exists but could not be read: the device name is
                // kept from the previous pass (or unknown), and the verdict is
                // Unverified so the node is not judged by it.
                iface.link = Some(LinkVerdict {
                    state: LinkState::Unverified,
                    reason: Some(format!("RDMA tree unreadable: {e}")),
                    ports: vec![],
                    first_seen: None,
                });
                note(&mut iface, Fact::RdmaDevice, e.to_string());
            }
        }
        iface
    }

    /// The PF's VFs, from its `virtfnN` links, sorted by PCI address. A VF shares
    /// its PF's upstream bridges; its NUMA node is its own. A PF folder that
    /// cannot be listed is an error (its VFs are unreadable, not absent).
    fn virtual_functions(
        &mut self,
        pf_dev: &str,
        pf: &Interface,
    ) -> Result<Vec<Interface>, SysError> {
        if let Some(links) = vf_links_counted(self.root, pf_dev, pf) {
            if let Some(vfs) = self.vfs_linked(pf_dev, pf, &links, true) {
                return Ok(vfs);
            }
        }
        let links = vf_links_listed(self.root, pf_dev)?;
        Ok(self
            .vfs_linked(pf_dev, pf, &links, false)
            .expect("only a counted link is refused"))
    }

    /// The VFs behind the PF's `links`. `counted` says the names came from
    /// the count of enabled VFs, not from a listing: then a link that is
    /// not there means the count and the links disagree, and `None` sends
    /// the caller to the folder's own listing.
    fn vfs_linked(
        &mut self,
        pf_dev: &str,
        pf: &Interface,
        links: &[String],
        counted: bool,
    ) -> Option<Vec<Interface>> {
        let root = self.root;
        // Sized once: an interface is large, and growing a PF's list of tens
        // of VFs moved every one of them several times.
        let mut vfs = Vec::with_capacity(links.len());
        for entry in links {
            let vf_dev = match with_joined(pf_dev, entry, |rel| root.resolve(rel)) {
                Ok(d) => d,
                Err(e) if counted && e.is_not_found() => return None,
                Err(e) => {
                    // The link still names the VF's PCI address: a placeholder
                    // under that address lets the previous record fill it in, so
                    // its partitioned token is not withdrawn.
                    let addr = root
                        .link_text(&join(pf_dev, entry))
                        .ok()
                        .and_then(|t| crate::pci::normalize(basename(&t)));
                    warn!(
                        "VF {entry} of {} unreadable: {e}",
                        pf.pci_bus_id.as_deref().unwrap_or("?")
                    );
                    if let Some(addr) = addr {
                        let mut vf = Interface {
                            bus: "pci".into(),
                            pci_bus_id: Some(addr),
                            parent: pf.pci_bus_id.clone(),
                            topology: pf.topology.clone(),
                            ..Default::default()
                        };
                        note(&mut vf, Fact::Interface, e.to_string());
                        vfs.push(vf);
                    }
                    continue;
                }
            };
            // The netdev `class/net` named for this VF; a VF it did not name
            // (its netdev moved to a pod's namespace, or its entry unreadable)
            // is asked directly.
            let (netdev, netdir) = match self.vf_netdevs.get(vf_dev.as_str()) {
                Some((name, dir)) => {
                    // Known as a VF from both sides: this PF's link, and its
                    // netdev's device's `physfn`.
                    if let Some(pf_addr) = &pf.pci_bus_id {
                        self.vf_parents
                            .insert(basename(&vf_dev).to_string(), pf_addr.clone());
                    }
                    (Some(name.to_string()), Some(dir.to_string()))
                }
                None => {
                    let netdev = root
                        .list(&join(&vf_dev, "net"))
                        .ok()
                        .and_then(|n| n.into_iter().next());
                    let netdir = netdev.as_ref().map(|n| join(&vf_dev, &format!("net/{n}")));
                    (netdev, netdir)
                }
            };
            let mut vf = self.build(netdev, netdir.as_deref(), Some(&vf_dev), Function::Virtual);
            vf.is_virtual = false;
            vf.parent = pf.pci_bus_id.clone();
            vf.topology = pf.topology.clone();
            vfs.push(vf);
        }
        Some(by_address(vfs))
    }
}

/// A PF's `virtfnN` link names from its count of enabled VFs, without
/// listing its folder (hundreds of entries on a NIC with many VFs): the
/// PCI core names the links of the N VFs it enabled `virtfn0` to
/// `virtfn{N-1}`, so `virtfnN` must be absent, which one call checks.
/// `None` when the count was not read or the check fails: the caller
/// lists the folder.
fn vf_links_counted(root: &SysRoot, pf_dev: &str, pf: &Interface) -> Option<Vec<String>> {
    let counted = pf
        .unreadable
        .iter()
        .all(|u| u.fact != Fact::VirtualFunctionsConfigured);
    // SR-IOV's TotalVFs is a 16-bit field: a count past it is no PCI
    // core's, and names are not made for it (a hostile `sriov_numvfs` of
    // 4294967295 would have asked for as many).
    let n = pf.virtual_functions_configured;
    if !counted || n == 0 || n > u32::from(u16::MAX) {
        return None;
    }
    match root.has_entry(&join(pf_dev, &format!("virtfn{n}"))) {
        Ok(false) => Some((0..n).map(|i| format!("virtfn{i}")).collect()),
        _ => None,
    }
}

/// A PF's `virtfnN` link names from its folder's listing.
fn vf_links_listed(root: &SysRoot, pf_dev: &str) -> Result<Vec<String>, SysError> {
    let mut entries = root.list(pf_dev)?;
    entries.retain(|e| e.starts_with("virtfn"));
    Ok(entries)
}

/// Whether a function's folder can hold `virtfnN` links, from the SR-IOV
/// attributes already read: the PCI core makes those links only for the VFs
/// it enabled, so a function the kernel shows no SR-IOV capability for (no
/// `sriov_totalvfs`, or 0) or no enabled VF (`sriov_numvfs` 0) has none, and
/// its folder (tens of entries on a real NIC) is not listed. An attribute
/// that could not be read answers nothing: the folder is listed.
fn may_have_vfs(iface: &Interface) -> bool {
    let unread = |fact| iface.unreadable.iter().any(|u| u.fact == fact);
    let capable = iface.physical_function || unread(Fact::PhysicalFunction);
    let enabled =
        iface.virtual_functions_configured > 0 || unread(Fact::VirtualFunctionsConfigured);
    capable && enabled
}

/// What kind of function [`Walk::build`] reads; a VF is read with less.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Function {
    /// An interface of its own (a PF, a plain NIC, a virtual interface):
    /// its topology is walked and its SR-IOV attributes read.
    Top,
    /// A VF: it shares its PF's topology, which the caller sets, and has no
    /// SR-IOV attributes (the kernel shows them on PFs only), so neither is
    /// looked for. Its bus is PCI without asking: only the PCI core makes
    /// the `virtfnN` links a VF is found by.
    Virtual,
}

/// The bus a device sits on, from its `subsystem` link: `Ok(None)` when the
/// device has no such link, an error when it is there and cannot be read.
fn bus_of(root: &SysRoot, device: &str) -> Result<Option<String>, SysError> {
    match root.resolve(&join(device, "subsystem")) {
        Ok(s) => Ok(Some(basename(&s).to_string())),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

/// The operational states the kernel prints in `operstate` (RFC 2863); any
/// other text is not an answer.
const OPERSTATES: [&str; 7] = [
    "unknown",
    "notpresent",
    "down",
    "lowerlayerdown",
    "testing",
    "dormant",
    "up",
];

/// A device's `local_cpulist`, which must read as the kernel prints a CPU
/// list (`0-23,48-71`, or nothing): other text is unreadable, not an
/// answer, and so is never taken for its NUMA node's list either.
fn read_cpu_list(root: &SysRoot, dev: &str) -> Result<Option<String>, Unreadable> {
    match attribute_in(root, dev, "local_cpulist")? {
        Some(v) if !is_cpu_list(&v) => Err(Unreadable::NotACpuList {
            path: join(dev, "local_cpulist"),
            text: v,
        }),
        v => Ok(v),
    }
}

/// True for a CPU list as the kernel prints one (`%*pbl`): comma-separated
/// CPU numbers and `first-last` ranges, or nothing at all.
fn is_cpu_list(s: &str) -> bool {
    let number = |n: &str| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit());
    s.is_empty()
        || s.split(',').all(|item| match item.split_once('-') {
            Some((first, last)) => number(first) && number(last),
            None => number(item),
        })
}

/// `vfs` in PCI-address order, equal addresses in the order given (as a
/// stable sort leaves them). The order is found on indices and each
/// interface is moved into place once: a stable sort of the interfaces
/// themselves (large structs) moved each several times through a scratch
/// copy, a visible part of a pass on a node of many VFs.
fn by_address(vfs: Vec<Interface>) -> Vec<Interface> {
    let mut order: Vec<usize> = (0..vfs.len()).collect();
    order.sort_by(|&a, &b| vfs[a].pci_bus_id.cmp(&vfs[b].pci_bus_id));
    let mut slots: Vec<Option<Interface>> = vfs.into_iter().map(Some).collect();
    order
        .into_iter()
        .map(|i| slots[i].take().expect("each index once"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vfs_come_in_address_order_and_equal_addresses_keep_theirs() {
        let vf = |addr: Option<&str>, name: &str| Interface {
            pci_bus_id: addr.map(str::to_string),
            name: Some(name.to_string()),
            ..Default::default()
        };
        // As `virtfnN` names list them: 0, 1, 10, 2 …; a placeholder without
        // an address; two links to one VF.
        let given = vec![
            vf(Some("0000:04:00.2"), "a"),
            vf(Some("0000:04:00.3"), "b"),
            vf(Some("0000:04:01.4"), "c"),
            vf(None, "d"),
            vf(Some("0000:04:00.4"), "e"),
            vf(Some("0000:04:00.3"), "f"),
        ];
        let names: Vec<_> = by_address(given)
            .into_iter()
            .map(|v| v.name.unwrap())
            .collect();
        assert_eq!(names, ["d", "a", "b", "f", "e", "c"]);
    }

    #[test]
    fn a_cpu_list_is_what_the_kernel_prints_and_nothing_else() {
        for ok in ["", "0", "0-95", "0-23,48-71", "3,5,7-9"] {
            assert!(is_cpu_list(ok), "{ok:?}");
        }
        for bad in [
            "\u{fffd}garbage",
            "0-",
            "-3",
            "0,,1",
            "0-3-5",
            "1 2",
            ",",
            "0x1f",
            "ff,ffffffff",
        ] {
            assert!(!is_cpu_list(bad), "{bad:?}");
        }
    }
}
