//! The GPU-to-NIC rail record: for every GPU and every network rail, the
//! closest NICs. Node-local; a cluster-wide publisher can patch each record
//! into a shared ConfigMap keyed by node name.
//!
//! Rails come from a rail source (`host-lldp`: interfaces with an LLDP
//! neighbour; `interface-name`: every port of the node record, for
//! InfiniBand fabrics where LLDP does not run), named by a regular
//! expression; GPU-to-NIC path classes come from `nvidia-smi topo -m` where
//! it is present, and from the node record's PCIe walk otherwise (and always
//! for non-NVIDIA accelerators).
//!
//! [`build`] is a pure function of the node record, the [`Inputs`] the node
//! read for it ([`crate::discover::rail_inputs`]) and the [`Options`]: it
//! reads nothing itself, so a capture replays to the same record.

pub mod answers;
pub mod config;
pub mod lldp;
pub mod nvsmi;
pub mod select;
pub mod topo;

use crate::pci::{self, Distance};
use crate::record::{Interface, LinkState, NodeRecord};
use answers::{DeviceLink, Output};
use regex::Regex;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

pub use answers::{Inputs, RailAnswers};
pub use select::{GpuPaths, RailNic, SelectError};

/// The record format's version; bumped on any incompatible change.
pub const RAIL_RECORD_FORMAT: &str = "rails.nodefabric.gpustack.ai/v1";

/// The rail source that reads LLDP neighbours (the seed's, and the default).
pub const HOST_LLDP: &str = "host-lldp";

/// The rail source that takes every port whose name matches, neighbour or
/// not: InfiniBand ports have no LLDP neighbour.
pub const INTERFACE_NAME: &str = "interface-name";

/// The rail sources, as `--rail-source` and `railSource.name` spell them.
pub const RAIL_SOURCES: [&str; 2] = [HOST_LLDP, INTERFACE_NAME];

/// The rail record `nodefabric rails` prints and `publish --rails-file` writes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RailRecord {
    /// The record format version (`rails.nodefabric.gpustack.ai/v1`, [`RAIL_RECORD_FORMAT`]).
    // The CRD's description keeps the words clusters already applied.
    #[schemars(
        description = "The record format version (`rails.nodefabric.gpustack.ai/v1`, [`RECORD_VERSION`])."
    )]
    pub version: String,
    /// The Node object's UID, so a cluster publisher can tell a replaced node
    /// with a reused name; empty when not given.
    #[serde(rename = "nodeUID")]
    pub node_uid: String,
    /// The rail source's name: `host-lldp` or `interface-name`.
    pub rail_source: String,
    /// NIC PCI address → the rails it is on.
    pub nics: BTreeMap<String, Vec<String>>,
    /// Rail ID → its integer index, the number that ends the ID (`rail3` →
    /// 3), for NCCL's `name:port:rail`; absent when the IDs give none
    /// (records written before it have none either).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "rail_index_schema")]
    pub rail_index: BTreeMap<String, u32>,
    /// Every GPU with its preferred NICs per rail, sorted by PCI address;
    /// empty when no rail was found.
    pub gpus: Vec<GpuRails>,
}

/// `railIndex` in the CRD: integers as Kubernetes formats them (`int32`;
/// schemars would say `uint32`, a format the API server does not list). No
/// `minimum`: the CRD type holds it as a float, which the YAML round trip
/// of deploy/ does not keep; the values are never negative by type.
fn rail_index_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "additionalProperties": {"type": "integer", "format": "int32"}
    })
}

/// One GPU's preferred NICs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuRails {
    /// The GPU's PCI address, normalised.
    pub pci_bus_id: String,
    /// `GPU-…` where nvidia-smi gave it; absent from the sysfs view.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// Which source gave the path classes.
    pub source: GpuSource,
    /// Rail ID → the NICs tied at the closest class.
    pub rails: BTreeMap<String, RailChoice>,
}

/// The NICs chosen for one GPU on one rail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RailChoice {
    /// The closest class found.
    pub path_class: Distance,
    /// Every NIC at that class, sorted by PCI address; the down ones only
    /// when no up NIC is at that class.
    pub nics: Vec<String>,
    /// Those of `nics` on the GPU's NUMA node(s), when `nics` spans NUMA
    /// nodes and only some are local (Grace trays, where every path is SYS).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub numa_local: Vec<String>,
    /// The rail's NICs at the closest class whose RDMA link is down (no port
    /// `ACTIVE`/`LinkUp`), sorted; they are in `nics` only when no up NIC ties.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub down: Vec<String>,
}

/// Where a GPU's path classes came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum GpuSource {
    /// `nvidia-smi topo -m`.
    NvidiaSmi,
    /// The node record's PCIe walk.
    Sysfs,
}

impl std::fmt::Display for GpuSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            GpuSource::NvidiaSmi => "nvidia-smi topo -m",
            GpuSource::Sysfs => "sysfs PCIe walk",
        })
    }
}

/// Which rail source finds the rail ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortSource {
    /// `host-lldp`: interfaces with an LLDP neighbour.
    HostLldp,
    /// `interface-name`: every port of the node record whose netdev or RDMA
    /// device name matches, no neighbour needed.
    InterfaceName,
}

impl PortSource {
    /// The source's name as the record and `--rail-source` spell it.
    pub fn name(self) -> &'static str {
        match self {
            PortSource::HostLldp => HOST_LLDP,
            PortSource::InterfaceName => INTERFACE_NAME,
        }
    }
}

/// How rail ports are picked and named: everything a rail pass needs
/// besides the node record and what was read.
#[derive(Debug, Clone)]
pub struct Options {
    /// The rail source.
    pub source: PortSource,
    /// Rail ports (interface names; with `interface-name` also RDMA device
    /// names); capture groups feed the template.
    pub interface_regex: Regex,
    /// The rail ID template, `$1`-style (`rail$1`).
    pub rail_id: String,
    /// The Node object's UID, if known.
    pub node_uid: String,
}

/// Why no rail record could be built; each names the input, rail or GPU at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RailError {
    /// The LLDP answer names no interfaces (unreadable, not JSON, not a neighbour table).
    #[error(transparent)]
    Lldp(#[from] lldp::LldpError),
    /// The `host-lldp` source, and no LLDP answer was read.
    #[error("no LLDP neighbour table was read (a capture taken without one?)")]
    NoLldp,
    /// A rail port's name expands the rail template to nothing.
    #[error("interface {name}: rail template {template:?} expands to an empty rail ID")]
    EmptyRailId {
        /// The port's name.
        name: String,
        /// The template.
        template: String,
    },
    /// A `host-lldp` rail port whose `device` link is no PCI function.
    #[error("rail {rail}: interface {interface} has no PCI device: {why}")]
    InterfaceWithoutPci {
        /// The rail.
        rail: String,
        /// The interface.
        interface: String,
        /// Why the link does not lead to one.
        why: String,
    },
    /// An `interface-name` rail port the record knows on a bus without PCI addresses.
    #[error("rail {rail}: port {port} has no PCI device (bus {bus})")]
    PortWithoutPci {
        /// The rail.
        rail: String,
        /// The port's name.
        port: String,
        /// Its bus.
        bus: String,
    },
    /// An nvidia-smi answer is unreadable; its reason word for word.
    #[error("{0}")]
    NvidiaUnreadable(String),
    /// An nvidia-smi `--query-gpu` answer does not parse.
    #[error(transparent)]
    NvidiaParse(#[from] nvsmi::ParseError),
    /// An nvidia-smi `topo -m` answer does not parse.
    #[error(transparent)]
    TopoParse(#[from] nvsmi::ParseError<topo::TopoFault>),
    /// A GPU of `--query-gpu` that `topo -m` does not list.
    #[error("GPU{index} ({pci_bus_id}) is in --query-gpu but has no row in topo -m")]
    NoTopoRow {
        /// nvidia-smi's index.
        index: u32,
        /// The GPU's PCI address.
        pci_bus_id: String,
    },
    /// No selection could be made.
    #[error(transparent)]
    Select(#[from] SelectError),
}

/// Builds the rail record for a node from what was read for it.
pub fn build(
    record: &NodeRecord,
    inputs: &Inputs,
    opts: &Options,
) -> Result<RailRecord, RailError> {
    let nic_rails = match opts.source {
        PortSource::HostLldp => {
            let answer = inputs.answers.lldp.as_ref().ok_or(RailError::NoLldp)?;
            let ifaces = lldp::neighbours(answer)?;
            nic_rails(
                record,
                &ifaces,
                &inputs.netdev_pci,
                &opts.interface_regex,
                &opts.rail_id,
            )?
        }
        PortSource::InterfaceName => named_rails(record, &opts.interface_regex, &opts.rail_id)?,
    };
    let mut out = RailRecord {
        version: RAIL_RECORD_FORMAT.into(),
        node_uid: opts.node_uid.clone(),
        rail_source: opts.source.name().into(),
        nics: nic_rails
            .iter()
            .map(|(k, v)| (k.clone(), v.rails.iter().cloned().collect()))
            .collect(),
        rail_index: rail_indices(nic_rails.values().flat_map(|n| &n.rails)),
        gpus: Vec::new(),
    };
    if nic_rails.is_empty() {
        return Ok(out); // an empty rail result is a valid, empty record
    }
    let gpus = gpu_paths(record, &nic_rails, inputs)?;
    out.gpus = select::select(&nic_rails, &gpus)?;
    Ok(out)
}

/// The largest rail index given: NCCL reads the field with `atoi` into a C `int`.
pub const MAX_RAIL_INDEX: u32 = i32::MAX as u32;

/// Each rail's integer index: the decimal number that ends its rail ID
/// (`rail0` → 0, `rail12` → 12, `r07` → 7). The ID comes from the port's
/// name through the cluster's one `--rail-id` template, so the same rail
/// gets the same index on every node, even a node where another rail is
/// missing (a position among the node's own rails would shift there). Every
/// rail gets one or none does: none when an ID does not end in digits, when
/// the number is over [`MAX_RAIL_INDEX`], or when two IDs end in the same
/// number (`rail1`, `rail01`), since NCCL would then take two rails for one.
pub fn rail_indices<'a>(rails: impl IntoIterator<Item = &'a String>) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    let mut taken = BTreeSet::new();
    for rail in rails {
        if out.contains_key(rail) {
            continue;
        }
        let digits = rail.len() - rail.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        let index = rail[rail.len() - digits..]
            .parse::<u32>()
            .ok()
            .filter(|i| *i <= MAX_RAIL_INDEX);
        match index {
            Some(i) if taken.insert(i) => out.insert(rail.clone(), i),
            _ => return BTreeMap::new(),
        };
    }
    out
}

/// NIC PCI address → its rails, NUMA node and link, for every interface
/// with a neighbour (`ifaces`) matching `re` (the `host-lldp` source).
fn nic_rails(
    record: &NodeRecord,
    ifaces: &BTreeSet<String>,
    netdev_pci: &BTreeMap<String, DeviceLink>,
    re: &Regex,
    template: &str,
) -> Result<BTreeMap<String, RailNic>, RailError> {
    // The record's view of each port (NUMA node, link), by netdev name.
    let endpoints = record.endpoints();
    let by_name: BTreeMap<&str, (&Interface, Option<&Interface>)> = endpoints
        .iter()
        .filter_map(|&(i, p)| Some((i.name.as_deref()?, (i, p))))
        .collect();
    let mut out: BTreeMap<String, RailNic> = BTreeMap::new();
    for iface in ifaces {
        let Some(rail) = rail_id(re, template, iface)? else {
            continue;
        };
        let pci = match netdev_pci.get(iface) {
            Some(DeviceLink::Pci(pci)) => pci.clone(),
            Some(DeviceLink::Unresolved(why)) => {
                return Err(RailError::InterfaceWithoutPci {
                    rail,
                    interface: iface.clone(),
                    why: why.clone(),
                })
            }
            None => {
                return Err(RailError::InterfaceWithoutPci {
                    rail,
                    interface: iface.clone(),
                    why: format!("class/net/{iface}/device was not read"),
                })
            }
        };
        add_port(&mut out, pci, rail, by_name.get(iface.as_str()).copied());
    }
    Ok(out)
}

/// The same map for every top-level port of the record whose netdev name,
/// else RDMA device name, matches `re` (the `interface-name` source).
fn named_rails(
    record: &NodeRecord,
    re: &Regex,
    template: &str,
) -> Result<BTreeMap<String, RailNic>, RailError> {
    let mut out: BTreeMap<String, RailNic> = BTreeMap::new();
    for iface in &record.spec.interfaces {
        let mut rail = None;
        for name in [&iface.name, &iface.rdma_device].into_iter().flatten() {
            if let Some(r) = rail_id(re, template, name)? {
                rail = Some((name, r));
                break;
            }
        }
        let Some((name, rail)) = rail else { continue };
        let Some(pci) = iface.pci_bus_id.clone() else {
            return Err(RailError::PortWithoutPci {
                rail,
                port: name.clone(),
                bus: iface.bus.clone(),
            });
        };
        add_port(&mut out, pci, rail, Some((iface, None)));
    }
    Ok(out)
}

/// The rail ID `template` expands to for `name`, `None` when `re` does not match.
fn rail_id(re: &Regex, template: &str, name: &str) -> Result<Option<String>, RailError> {
    let Some(caps) = re.captures(name) else {
        return Ok(None);
    };
    let mut rail = String::new();
    caps.expand(template, &mut rail);
    if rail.is_empty() {
        return Err(RailError::EmptyRailId {
            name: name.to_string(),
            template: template.to_string(),
        });
    }
    Ok(Some(rail))
}

/// Records one rail port. Its NUMA node and link state come from the node
/// record; a port the record lacks, or whose link is unverified, counts as up
/// (an unreadable port is never an answer of "down").
fn add_port(
    out: &mut BTreeMap<String, RailNic>,
    pci: String,
    rail: String,
    port: Option<(&Interface, Option<&Interface>)>,
) {
    let nic = out.entry(pci).or_default();
    nic.rails.insert(rail);
    if let Some((iface, parent)) = port {
        nic.numa = iface.effective_numa(parent);
        nic.down |= iface
            .link
            .as_ref()
            .is_some_and(|l| l.state == LinkState::Failed);
    }
}

/// Every GPU's paths to NICs, from nvidia-smi where it answered and the PCIe walk otherwise.
fn gpu_paths(
    record: &NodeRecord,
    nic_rails: &BTreeMap<String, RailNic>,
    inputs: &Inputs,
) -> Result<Vec<GpuPaths>, RailError> {
    let smi = nvidia_smi_view(record, inputs)?;
    let covered: BTreeSet<String> = smi.iter().map(|g| g.pci_bus_id.clone()).collect();
    let mut out = smi;
    // Each rail NIC placed on the bus once, each accelerator once below.
    let endpoints = record.endpoints();
    let nic_coords: BTreeMap<&str, pci::Placed> = endpoints
        .iter()
        .filter_map(|(ep, parent)| {
            ep.pci_bus_id
                .as_deref()
                .filter(|a| nic_rails.contains_key(*a))
                .map(|a| (a, pci::Placed::new(ep.coordinates(*parent))))
        })
        .collect();
    for acc in record.accelerators() {
        if covered.contains(&acc.pci_bus_id) {
            continue;
        }
        let placed = pci::Placed::new(acc.coordinates());
        let mut paths = BTreeMap::new();
        for nic in nic_rails.keys() {
            let class = nic_coords
                .get(nic.as_str())
                .map_or(Distance::Unk, |c| pci::between(&placed, c));
            paths.insert(nic.clone(), class.as_str().to_string());
        }
        let numa = acc.numa.map(topo::NodeList::single);
        out.push(GpuPaths {
            pci_bus_id: acc.pci_bus_id.clone(),
            uuid: None,
            source: GpuSource::Sysfs,
            paths,
            numa,
        });
    }
    Ok(out)
}

/// The GPUs nvidia-smi reports, with paths keyed by NIC PCI address; empty
/// when nvidia-smi was not asked or is not installed.
fn nvidia_smi_view(record: &NodeRecord, inputs: &Inputs) -> Result<Vec<GpuPaths>, RailError> {
    let Some(nvidia) = &inputs.answers.nvidia else {
        return Ok(Vec::new());
    };
    let query = match &nvidia.query.output {
        Output::Printed(text) => text,
        Output::NotInstalled => return Ok(Vec::new()),
        Output::Failed(why) => return Err(RailError::NvidiaUnreadable(why.clone())),
    };
    // A tool gone between its two runs prints nothing: refused below as no header.
    let (topo, topo_origin) = match &nvidia.topo {
        Some(a) => match &a.output {
            Output::Printed(text) => (text.as_str(), a.origin.name()),
            Output::NotInstalled => ("", a.origin.name()),
            Output::Failed(why) => return Err(RailError::NvidiaUnreadable(why.clone())),
        },
        None => ("", "topo -m"),
    };
    let ids = nvsmi::parse_query(query, nvidia.query.origin.name())?;
    let topo = topo::parse_topo(topo, topo_origin)?;
    let mut out = Vec::new();
    for id in ids {
        let row = topo
            .gpu_to_nic
            .get(&id.index)
            .ok_or_else(|| RailError::NoTopoRow {
                index: id.index,
                pci_bus_id: id.pci_bus_id.clone(),
            })?;
        let mut paths = BTreeMap::new();
        for (nic, class) in row {
            // A NIC alias that does not resolve is on no discovered rail either: ignored.
            if let Some(DeviceLink::Pci(pci)) = inputs.rdma_pci.get(nic) {
                paths.insert(pci.clone(), class.clone());
            }
        }
        // topo -m's NUMA Affinity, else the kernel's numa_node for the GPU.
        let numa = topo.gpu_numa.get(&id.index).cloned().or_else(|| {
            let acc = record
                .accelerators()
                .find(|a| a.pci_bus_id == id.pci_bus_id)?;
            acc.numa.map(topo::NodeList::single)
        });
        out.push(GpuPaths {
            pci_bus_id: id.pci_bus_id,
            uuid: Some(id.uuid),
            source: GpuSource::NvidiaSmi,
            paths,
            numa,
        });
    }
    Ok(out)
}

/// The most a saved nvidia-smi or lldpctl output may hold: a 64-GPU, 64-NIC
/// matrix is under 64 KiB, so anything near this is not one.
pub const MAX_SAVED_OUTPUT: u64 = 4 << 20;

/// The record as published: JSON with every object's keys sorted, and a trailing newline.
pub fn to_bytes(record: &RailRecord) -> Vec<u8> {
    // serde_json's Value keeps keys in a BTreeMap, so a round trip sorts them.
    let value = serde_json::to_value(record).expect("record serialises");
    let mut s = serde_json::to_string_pretty(&value).expect("value serialises");
    s.push('\n');
    s.into_bytes()
}

#[cfg(test)]
mod tests {
    //! [`build`] from hand-made inputs: no tree, no tool, no file.
    use super::answers::{Answer, NvidiaAnswers, Origin, Output};
    use super::*;
    use serde_json::json;

    /// GPU 0000:12:00.0 behind switch 0000:11:00.0 with rail NIC eth_r0_p0
    /// (mlx5_0, 0000:13:00.0); eth_r1_p0 (mlx5_1, 0000:23:00.0) behind
    /// another root port on the same NUMA node.
    fn record() -> NodeRecord {
        let nic = |name: &str, rdma: &str, pci: &str, switches: [&str; 3]| {
            json!({"name": name, "bus": "pci", "pciBusId": pci, "numa": 0, "up": true,
                   "virtual": false, "rdma": true, "rdmaDevice": rdma, "physicalFunction": false,
                   "virtualFunctionsConfigured": 0, "topology": {"pciSwitches": switches}})
        };
        serde_json::from_value(json!({"version": 1, "spec": {
            "interfaces": [
                nic("eth_r0_p0", "mlx5_0", "0000:13:00.0", ["0000:11:00.0", "0000:10:00.0", "0000:00:01.0"]),
                nic("eth_r1_p0", "mlx5_1", "0000:23:00.0", ["0000:21:00.0", "0000:20:00.0", "0000:00:02.0"]),
            ],
            "groups": [{"manufacturer": "nvidia", "accelerators": [{
                "id": "0", "manufacturer": "nvidia", "pciId": "10de:2330",
                "pciBusId": "0000:12:00.0", "numa": 0,
                "topology": {"pciSwitches": ["0000:11:00.0", "0000:10:00.0", "0000:00:01.0"]}}]}]
        }}))
        .unwrap()
    }

    fn options(source: PortSource, re: &str) -> Options {
        Options {
            source,
            interface_regex: Regex::new(re).unwrap(),
            rail_id: "rail$1".into(),
            node_uid: "uid-1".into(),
        }
    }

    /// LLDP neighbours eth_r0_p0, eth_r1_p0 and eno1, and their device links.
    fn lldp_inputs() -> Inputs {
        let table =
            json!({"lldp": {"interface": [{"eth_r0_p0": {}}, {"eth_r1_p0": {}}, {"eno1": {}}]}});
        let mut inputs = Inputs::default();
        inputs.answers.lldp = Some(Answer::printed(
            Origin::Command("lldpctl".into()),
            table.to_string(),
        ));
        for (name, pci) in [
            ("eth_r0_p0", "0000:13:00.0"),
            ("eth_r1_p0", "0000:23:00.0"),
            ("eno1", "0000:00:1f.6"),
        ] {
            inputs
                .netdev_pci
                .insert(name.into(), DeviceLink::Pci(pci.into()));
        }
        inputs
    }

    const RAILS: &str = "^eth_r([0-9]+)_p[0-9]+$";

    #[test]
    fn host_lldp_rails_with_the_pcie_walk_from_answers_alone() {
        let r = build(
            &record(),
            &lldp_inputs(),
            &options(PortSource::HostLldp, RAILS),
        )
        .unwrap();
        assert_eq!(r.rail_source, "host-lldp");
        assert_eq!(r.node_uid, "uid-1");
        assert_eq!(
            r.nics.keys().collect::<Vec<_>>(),
            ["0000:13:00.0", "0000:23:00.0"]
        );
        let gpu = &r.gpus[0];
        assert_eq!((gpu.source, gpu.uuid.as_deref()), (GpuSource::Sysfs, None));
        assert_eq!(gpu.rails["rail0"].path_class, Distance::Pix);
        assert_eq!(gpu.rails["rail0"].nics, ["0000:13:00.0"]);
    }

    #[test]
    fn nvidia_answers_give_the_classes_and_an_unresolved_nic_is_on_no_rail() {
        let topo = "\tGPU0\tNIC0\tNIC1\tNIC2\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n\
                    GPU0\t X \tPXB\tNODE\tPIX\t0-19\t0\t\tN/A\n\
                    NIC0\tPXB\t X \tNODE\tPIX\t\t\t\t\n\
                    NIC1\tNODE\tNODE\t X \tNODE\t\t\t\t\n\
                    NIC2\tPIX\tPIX\tNODE\t X \t\t\t\t\n\
                    \nNIC Legend:\n\n  NIC0: mlx5_0\n  NIC1: mlx5_1\n  NIC2: mlx5_9\n";
        let mut inputs = lldp_inputs();
        inputs.answers.nvidia = Some(NvidiaAnswers {
            query: Answer::printed(
                Origin::File("q.csv".into()),
                "0, GPU-00000000-1111-2222-3333-444444444444, 00000000:12:00.0\n",
            ),
            topo: Some(Answer::printed(Origin::File("t.txt".into()), topo)),
        });
        for (nic, link) in [
            ("mlx5_0", DeviceLink::Pci("0000:13:00.0".into())),
            ("mlx5_1", DeviceLink::Pci("0000:23:00.0".into())),
            ("mlx5_9", DeviceLink::Unresolved("gone".into())),
        ] {
            inputs.rdma_pci.insert(nic.into(), link);
        }
        let r = build(&record(), &inputs, &options(PortSource::HostLldp, RAILS)).unwrap();
        let gpu = &r.gpus[0];
        assert_eq!(gpu.source, GpuSource::NvidiaSmi);
        assert_eq!(
            gpu.uuid.as_deref(),
            Some("GPU-00000000-1111-2222-3333-444444444444")
        );
        // The matrix's PXB, not the walk's PIX; mlx5_9's PIX reaches no rail NIC.
        assert_eq!(gpu.rails["rail0"].path_class, Distance::Pxb);
        assert_eq!(gpu.rails["rail1"].path_class, Distance::Node);

        // A topo -m that failed fails the record, in the tool's words.
        inputs.answers.nvidia.as_mut().unwrap().topo = Some(Answer::failed(
            Origin::Command("nvidia-smi topo -m".into()),
            "nvidia-smi topo -m exited with exit status: 9: no",
        ));
        let err = build(&record(), &inputs, &options(PortSource::HostLldp, RAILS)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "nvidia-smi topo -m exited with exit status: 9: no"
        );
        // nvidia-smi not installed: the walk for every GPU.
        inputs.answers.nvidia.as_mut().unwrap().query.output = Output::NotInstalled;
        let r = build(&record(), &inputs, &options(PortSource::HostLldp, RAILS)).unwrap();
        assert_eq!(r.gpus[0].source, GpuSource::Sysfs);
    }

    #[test]
    fn each_lldp_failure_is_named_and_no_rails_asks_no_gpu_answer() {
        let opts = options(PortSource::HostLldp, RAILS);
        let mut inputs = lldp_inputs();
        inputs.answers.lldp.as_mut().unwrap().output = Output::NotInstalled;
        let err = build(&record(), &inputs, &opts).unwrap_err();
        assert!(
            err.to_string().contains("running lldpctl: not found"),
            "{err}"
        );
        inputs.answers.lldp = Some(Answer::printed(Origin::File("/x/l.json".into()), "{"));
        let err = build(&record(), &inputs, &opts).unwrap_err();
        assert!(
            err.to_string().starts_with("/x/l.json is not JSON: "),
            "{err}"
        );
        inputs.answers.lldp = None;
        assert_eq!(
            build(&record(), &inputs, &opts).unwrap_err(),
            RailError::NoLldp
        );
        // A rail port whose device link did not resolve is named with its reason.
        let mut inputs = lldp_inputs();
        inputs.netdev_pci.insert(
            "eth_r1_p0".into(),
            DeviceLink::Unresolved("resolving class/net/eth_r1_p0/device: gone".into()),
        );
        assert_eq!(
            build(&record(), &inputs, &opts).unwrap_err().to_string(),
            "rail rail1: interface eth_r1_p0 has no PCI device: resolving class/net/eth_r1_p0/device: gone"
        );
        // No rail port matches: an empty record, whatever nvidia-smi said.
        let mut inputs = lldp_inputs();
        inputs.answers.nvidia = Some(NvidiaAnswers {
            query: Answer::failed(Origin::Command("nvidia-smi --query-gpu".into()), "broken"),
            topo: None,
        });
        let r = build(&record(), &inputs, &options(PortSource::HostLldp, "^ib")).unwrap();
        assert!(r.nics.is_empty() && r.gpus.is_empty());
    }

    #[test]
    fn a_node_missing_a_rail_does_not_shift_the_other_rails_indices() {
        // Node B lost rail1 (no LLDP neighbour on that cable): its rail2
        // must keep the index node A gives rail2, not take position 1.
        let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let a = rail_indices(&ids(&["rail0", "rail1", "rail2", "rail10"]));
        let b = rail_indices(&ids(&["rail2", "rail0", "rail2"]));
        assert_eq!(a["rail2"], 2);
        assert_eq!(a["rail10"], 10);
        assert_eq!(
            b,
            BTreeMap::from([("rail0".into(), 0), ("rail2".into(), 2)])
        );
        assert_eq!(rail_indices(&ids(&["r07"]))["r07"], 7);
    }

    #[test]
    fn rail_ids_that_give_no_distinct_number_give_no_index_at_all() {
        let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        // One rail without a number, two rails with one number, a number
        // past a C int: none is told rather than a partial or wrong one.
        for rails in [
            &["rail0", "spine"][..],
            &["rail1", "rail01"],
            &["rail0", "rail2147483648"],
            &["rail0", "rail99999999999999999999"],
        ] {
            assert!(rail_indices(&ids(rails)).is_empty(), "{rails:?}");
        }
        assert_eq!(
            rail_indices(&ids(&["rail2147483647"]))["rail2147483647"],
            MAX_RAIL_INDEX
        );
    }

    #[test]
    fn a_record_written_before_rail_indices_reads_and_keeps_its_bytes() {
        // What a publisher of the previous release wrote: no railIndex.
        let old = json!({
            "gpus": [], "nics": {"0000:13:00.0": ["rail0"]}, "nodeUID": "",
            "railSource": "host-lldp", "version": RAIL_RECORD_FORMAT
        });
        let bytes = format!("{}\n", serde_json::to_string_pretty(&old).unwrap());
        let r: RailRecord = serde_json::from_str(&bytes).unwrap();
        assert!(r.rail_index.is_empty());
        assert_eq!(String::from_utf8(to_bytes(&r)).unwrap(), bytes);
        // A built record carries the index beside its rails.
        let built = build(
            &record(),
            &lldp_inputs(),
            &options(PortSource::HostLldp, RAILS),
        )
        .unwrap();
        assert_eq!(
            built.rail_index,
            BTreeMap::from([("rail0".into(), 0), ("rail1".into(), 1)])
        );
        let value = serde_json::to_value(&built).unwrap();
        assert_eq!(value["railIndex"], json!({"rail0": 0, "rail1": 1}));
    }

    #[test]
    fn interface_name_needs_no_lldp_answer() {
        let r = build(
            &record(),
            &Inputs::default(),
            &options(PortSource::InterfaceName, "^mlx5_([0-9]+)$"),
        )
        .unwrap();
        assert_eq!(r.rail_source, "interface-name");
        assert_eq!(r.nics["0000:23:00.0"], ["rail1"]);
        assert_eq!(r.gpus[0].rails["rail0"].nics, ["0000:13:00.0"]);
    }
}
