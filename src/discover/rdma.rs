//! RDMA devices bound to a network device, and the link verdict of each.
//!
//! The check reads the RDMA subsystem's own port attributes, so it applies to
//! every RDMA device whatever its manufacturer.

use crate::record::{CharDevice, LinkState, LinkVerdict, PortReading};
use crate::sysfs::{join, with_joined, BuildPathHash, SysError, SysRoot};
use std::collections::HashMap;

/// The RDMA device bound to a device: the first entry of `<device>/infiniband/`.
/// `Ok(None)` when the device has no such folder (nothing bound); an error when
/// the folder exists and cannot be read.
pub fn bound_device(root: &SysRoot, device: &str) -> Result<Option<String>, SysError> {
    match root.list(&join(device, "infiniband")) {
        Ok(names) => Ok(names.into_iter().next()),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

/// Which RDMA device each device folder has bound, from one listing of
/// `class/infiniband` and one link per RDMA device, instead of a listing of
/// `<device>/infiniband/` for every network device: on a node of hundreds of
/// VFs that listing was a tenth of a pass's system calls.
///
/// The kernel lists every RDMA device there, so the class folder answers
/// for all. Where it cannot be listed or one of its links cannot be
/// followed (a damaged tree, a capture made before the index), the index is
/// not used and each device's own folder is listed, as before, so that an
/// unreadable folder is still reported as unreadable and never taken for
/// "no RDMA device".
#[derive(Debug, Default)]
pub struct BoundIndex {
    /// Device folder → the first (by name) RDMA device under it; `None`
    /// when the index could not be read whole.
    by_device: Option<HashMap<String, String, BuildPathHash>>,
}

impl BoundIndex {
    /// Reads `class/infiniband` and each entry's link.
    pub fn read(root: &SysRoot) -> BoundIndex {
        BoundIndex {
            by_device: Self::read_whole(root),
        }
    }

    fn read_whole(root: &SysRoot) -> Option<HashMap<String, String, BuildPathHash>> {
        let names = root.list("class/infiniband").ok()?;
        // Keyed by device path: the path hash, not SipHash (one look per
        // network device of the node).
        let mut by_device = HashMap::with_capacity_and_hasher(names.len(), BuildPathHash);
        for name in names {
            let canonical = with_joined("class/infiniband", &name, |rel| root.resolve(rel)).ok()?;
            // `<device>/infiniband/<name>`: anything else is not the kernel's layout.
            let device = canonical
                .strip_suffix(name.as_str())?
                .strip_suffix("/infiniband/")?;
            // Listed in name order, so the first kept is the first by name,
            // as a listing of the device's own folder would give it.
            by_device.entry(device.to_string()).or_insert(name);
        }
        Some(by_device)
    }

    /// The RDMA device bound to `device`, as [`bound_device`] answers it.
    pub fn bound_device(&self, root: &SysRoot, device: &str) -> Result<Option<String>, SysError> {
        match &self.by_device {
            Some(index) => Ok(index.get(device).cloned()),
            None => bound_device(root, device),
        }
    }
}

/// The enum name of a port attribute: `4: ACTIVE` → `ACTIVE`. The kernel
/// prints `<number>: <NAME>`; a value without the number is taken whole.
fn enum_name(value: &str) -> &str {
    value.split_once(':').map_or(value, |(_, n)| n).trim()
}

/// Reads every port of `ibdev` (at `<device>/infiniband/<ibdev>`) and decides.
///
/// `OK` needs a port whose state is exactly `ACTIVE` and physical state exactly
/// `LinkUp` (whole names: `ACTIVE_DEFER` is not `ACTIVE`). `Failed` needs every
/// port read and none carrying the link. Anything else is `Unverified`, because
/// an unreadable file is never an answer of "no".
pub fn link_verdict(root: &SysRoot, device: &str, ibdev: &str) -> LinkVerdict {
    let ibdir = [device, "infiniband", ibdev].join("/");
    let ports_dir = || join(&ibdir, "ports");
    let unverified = |reason: String, ports: Vec<PortReading>| LinkVerdict {
        state: LinkState::Unverified,
        reason: Some(reason),
        ports,
        first_seen: None,
    };
    let readings = match numbered_ports(root, &ibdir) {
        Some(readings) => readings,
        None => match root.list(&ports_dir()) {
            Ok(p) if p.is_empty() => {
                return unverified(format!("{}: no ports", ports_dir()), vec![])
            }
            // Exactly one reading per port: grown from empty, one port took
            // room for four (3.8 MB at 10,000 endpoints).
            Ok(p) => p
                .into_iter()
                .map(|port| read_port(root, &ibdir, port))
                .collect(),
            Err(e) => return unverified(format!("cannot list ports: {e}"), vec![]),
        },
    };
    let up = readings.iter().any(|r| {
        matches!((&r.state, &r.phys_state), (Ok(s), Ok(p)) if enum_name(s) == "ACTIVE" && enum_name(p) == "LinkUp")
    });
    let unreadable: Vec<String> = readings
        .iter()
        .flat_map(|r| [&r.state, &r.phys_state])
        .filter_map(|r| r.as_ref().err().map(ToString::to_string))
        .collect();
    let ports = readings.into_iter().map(Port::into_reading).collect();
    if up {
        LinkVerdict {
            state: LinkState::Ok,
            reason: None,
            ports,
            first_seen: None,
        }
    } else if !unreadable.is_empty() {
        unverified(
            format!(
                "no port carries the link, and some could not be read: {}",
                unreadable.join("; ")
            ),
            ports,
        )
    } else {
        LinkVerdict {
            state: LinkState::Failed,
            reason: Some("no port is ACTIVE with physical state LinkUp".into()),
            ports,
            first_seen: None,
        }
    }
}

/// One port's attributes as read, errors kept for the verdict's reason.
struct Port {
    name: String,
    state: Result<String, SysError>,
    phys_state: Result<String, SysError>,
    link_layer: Option<String>,
}

impl Port {
    /// The port as the record keeps it.
    fn into_reading(self) -> PortReading {
        PortReading {
            port: self.name,
            state: self.state.ok(),
            phys_state: self.phys_state.ok(),
            // For the DRA `linkLayer` attribute only: not part of the verdict.
            link_layer: self.link_layer,
        }
    }
}

/// Reads port `name` of the RDMA device folder `ibdir`.
fn read_port(root: &SysRoot, ibdir: &str, name: String) -> Port {
    let dir = [ibdir, "ports", &name].join("/");
    Port {
        // Read as beneath `ibdir`, the target of its `class/infiniband`
        // link, which this read proves where discovery presumed it.
        state: root.read_trimmed_proving(ibdir, &["ports", &name, "state"].join("/")),
        phys_state: root.read_trimmed_in(&dir, "phys_state"),
        link_layer: root.read_trimmed_in(&dir, "link_layer").ok(),
        name,
    }
}

/// The most ports [`numbered_ports`] takes from a link count: a port number
/// is a byte on the wire (an InfiniBand switch numbers up to 254, and a
/// switch is listed anyway, its first port being 0).
const MAX_COUNTED_PORTS: u64 = 255;

/// The ports of the RDMA device folder `ibdir` found without listing its
/// `ports`: the kernel numbers a channel adapter's ports 1 to N with no
/// gap (its port folders are made for each port from the first to the
/// last), and N is the count of folders `ports` holds, which its link
/// count gives in one call where a listing costs four (asked only in a
/// folder the pass resolved: `ibdir` is the target of its
/// `class/infiniband` link; see [`SysRoot::folders_in`]).
/// `None` when port 1 has no `state` (a switch numbers its one port 0, a
/// damaged tree may lack it), the count says nothing, or a port it counts
/// has no `state`: the caller lists the folder, which names any fault.
/// Sorted as a listing sorts them, so either way gives the same record.
fn numbered_ports(root: &SysRoot, ibdir: &str) -> Option<Vec<Port>> {
    let missing = |port: &Port| port.state.as_ref().is_err_and(SysError::is_not_found);
    let first = read_port(root, ibdir, "1".to_string());
    if missing(&first) {
        return None;
    }
    // A channel adapter has a few ports; a count past what any has (a
    // crafted file system can claim any link count) is listed instead of
    // trusted with room for every port it claims.
    let count = root.folders_in(&join(ibdir, "ports"))?;
    if count == 0 || count > MAX_COUNTED_PORTS {
        return None;
    }
    let mut ports = Vec::with_capacity(count as usize);
    ports.push(first);
    for n in 2..=count {
        let port = read_port(root, ibdir, n.to_string());
        if missing(&port) {
            return None;
        }
        ports.push(port);
    }
    ports.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    Some(ports)
}

/// Parses a sysfs `dev` attribute (`231:0`).
fn parse_dev(value: &str) -> Option<(u32, u32)> {
    let (a, b) = value.trim().split_once(':')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// The verbs character devices by RDMA device name, read once per pass from
/// `class/infiniband_verbs/*/{ibdev,dev}`.
#[derive(Debug, Default)]
pub struct VerbsIndex {
    by_ibdev: HashMap<String, CharDevice, BuildPathHash>,
    checked: Vec<String>,
    /// Some entry (or the class folder) could not be read, so a device
    /// missing from the index may be there: its absence is no answer.
    unreadable: bool,
}

impl VerbsIndex {
    /// Reads the index; a missing class folder gives an empty index.
    pub fn read(root: &SysRoot) -> VerbsIndex {
        let mut index = VerbsIndex::default();
        let entries = match root.list("class/infiniband_verbs") {
            Ok(e) => e,
            Err(e) => {
                index.unreadable = !e.is_not_found();
                index.checked.push(format!("class/infiniband_verbs ({e})"));
                return index;
            }
        };
        for uverbs in entries.into_iter().filter(|e| e.starts_with("uverbs")) {
            let base = join("class/infiniband_verbs", &uverbs);
            let ibdev = root.read_trimmed_in(&base, "ibdev");
            let dev = root.read_trimmed_in(&base, "dev");
            match (ibdev, dev.as_ref().ok().and_then(|d| parse_dev(d))) {
                (Ok(ibdev), Some((major, minor))) => {
                    index.checked.push(format!("{base}/ibdev = {ibdev}"));
                    index.by_ibdev.insert(
                        ibdev,
                        CharDevice {
                            path: join("/dev/infiniband", &uverbs),
                            major,
                            minor,
                        },
                    );
                }
                (ibdev, _) => {
                    index.unreadable = true;
                    index.checked.push(format!(
                        "{base} (ibdev: {}, dev: {})",
                        ibdev.unwrap_or_else(|e| e.to_string()),
                        dev.map_or_else(|e| e.to_string(), |v| format!("{v:?} is not major:minor")),
                    ))
                }
            }
        }
        if index.checked.is_empty() {
            index.checked.push("class/infiniband_verbs (empty)".into());
        }
        index
    }

    /// True when some verbs entry could not be read.
    pub fn has_unreadable(&self) -> bool {
        self.unreadable
    }

    /// The verbs device of `ibdev`, or a diagnostic naming every place checked.
    pub fn lookup(&self, ibdev: &str) -> Result<CharDevice, NoVerbsDevice> {
        self.by_ibdev
            .get(ibdev)
            .cloned()
            .ok_or_else(|| NoVerbsDevice {
                rdma_device: ibdev.to_string(),
                checked: self.checked.clone(),
            })
    }
}

/// An RDMA device with no verbs character device; the text is the
/// endpoint's `verbsError`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no verbs device for RDMA device {rdma_device}; checked: {}", .checked.join(", "))]
pub struct NoVerbsDevice {
    /// The RDMA device looked up.
    pub rdma_device: String,
    /// Every place checked, each with what it held.
    pub checked: Vec<String>,
}

/// The connection-manager device from `class/misc/rdma_cm/dev`, if the host has one.
pub fn rdma_cm(root: &SysRoot) -> Option<CharDevice> {
    let dev = root.read_trimmed("class/misc/rdma_cm/dev").ok()?;
    let (major, minor) = parse_dev(&dev)?;
    Some(CharDevice {
        path: "/dev/infiniband/rdma_cm".into(),
        major,
        minor,
    })
}

#[cfg(test)]
mod tests {
    use super::enum_name;

    #[test]
    fn enum_names_are_whole() {
        assert_eq!(enum_name("4: ACTIVE"), "ACTIVE");
        assert_eq!(enum_name("4: ACTIVE_DEFER"), "ACTIVE_DEFER");
        assert_eq!(enum_name("5: LinkUp"), "LinkUp");
        assert_eq!(enum_name("LinkUp"), "LinkUp");
    }
}
