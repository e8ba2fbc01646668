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

pub mod config;
pub mod lldp;
pub mod nvsmi;
pub mod select;
pub mod topo;

use crate::pci::{self, Distance};
use crate::record::{Interface, LinkState, NodeRecord};
use crate::sysfs::{self, SysRoot};
use anyhow::{bail, Context, Result};
use regex::Regex;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

pub use select::{GpuPaths, RailNic, SelectError};

/// The record format's version; bumped on any incompatible change.
pub const RECORD_VERSION: &str = "rails.nodefabric.gpustack.ai/v1";

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
    /// The record format version (`rails.nodefabric.gpustack.ai/v1`, [`RECORD_VERSION`]).
    pub version: String,
    /// The Node object's UID, so a cluster publisher can tell a replaced node
    /// with a reused name; empty when not given.
    #[serde(rename = "nodeUID")]
    pub node_uid: String,
    /// The rail source's name: `host-lldp` or `interface-name`.
    pub rail_source: String,
    /// NIC PCI address → the rails it is on.
    pub nics: BTreeMap<String, Vec<String>>,
    /// Every GPU with its preferred NICs per rail, sorted by PCI address;
    /// empty when no rail was found.
    pub gpus: Vec<GpuRails>,
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

/// Where the LLDP neighbour table comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LldpInput {
    /// Run `lldpctl -f json`, against this socket when given.
    Lldpctl(Option<PathBuf>),
    /// A saved `lldpctl -f json` output.
    File(PathBuf),
}

/// Where NVIDIA path classes come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NvidiaInput {
    /// Run this `nvidia-smi` (or the one on PATH); its absence means sysfs.
    Command(Option<PathBuf>),
    /// Saved `--query-gpu=index,uuid,pci.bus_id --format=csv,noheader` and `topo -m` outputs.
    Files {
        /// The query CSV.
        query: PathBuf,
        /// The matrix.
        topo: PathBuf,
    },
    /// Ignore nvidia-smi; use the PCIe walk for every GPU.
    Sysfs,
}

/// Which rail source finds the rail ports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RailInput {
    /// `host-lldp`: interfaces with an LLDP neighbour, from this input.
    HostLldp(LldpInput),
    /// `interface-name`: every port of the node record whose netdev or RDMA
    /// device name matches, no neighbour needed.
    InterfaceName,
}

impl RailInput {
    /// The source's name as the record spells it.
    pub fn name(&self) -> &'static str {
        match self {
            RailInput::HostLldp(_) => HOST_LLDP,
            RailInput::InterfaceName => INTERFACE_NAME,
        }
    }
}

/// Everything a rail pass needs besides the node record.
#[derive(Debug, Clone)]
pub struct Options {
    /// The rail source.
    pub source: RailInput,
    /// Rail ports (interface names; with `interface-name` also RDMA device
    /// names); capture groups feed the template.
    pub interface_regex: Regex,
    /// The rail ID template, `$1`-style (`rail$1`).
    pub rail_id: String,
    /// The NVIDIA input.
    pub nvidia: NvidiaInput,
    /// The Node object's UID, if known.
    pub node_uid: String,
    /// How long `nvidia-smi` and `lldpctl` may run before they are killed.
    pub timeout: std::time::Duration,
}

/// Builds the rail record for a node.
pub fn build(root: &SysRoot, record: &NodeRecord, opts: &Options) -> Result<RailRecord> {
    let nic_rails = match &opts.source {
        RailInput::HostLldp(input) => {
            let lldp_json = match input {
                LldpInput::Lldpctl(socket) => lldp::run_lldpctl(socket.as_deref(), opts.timeout)?,
                LldpInput::File(path) => lldp::parse_json(&read_text(path, opts.timeout)?, path)?,
            };
            let ifaces =
                lldp::interfaces(&lldp_json).context("reading the LLDP neighbour table")?;
            nic_rails(root, record, &ifaces, &opts.interface_regex, &opts.rail_id)?
        }
        RailInput::InterfaceName => named_rails(record, &opts.interface_regex, &opts.rail_id)?,
    };
    let mut out = RailRecord {
        version: RECORD_VERSION.into(),
        node_uid: opts.node_uid.clone(),
        rail_source: opts.source.name().into(),
        nics: nic_rails
            .iter()
            .map(|(k, v)| (k.clone(), v.rails.iter().cloned().collect()))
            .collect(),
        gpus: Vec::new(),
    };
    if nic_rails.is_empty() {
        return Ok(out); // an empty rail result is a valid, empty record
    }
    let gpus = gpu_paths(root, record, &nic_rails, &opts.nvidia, opts.timeout)?;
    out.gpus = select::select(&nic_rails, &gpus)?;
    Ok(out)
}

/// NIC PCI address → its rails, NUMA node and link, for every interface
/// with a neighbour (`ifaces`) matching `re` (the `host-lldp` source).
pub fn nic_rails(
    root: &SysRoot,
    record: &NodeRecord,
    ifaces: &BTreeSet<String>,
    re: &Regex,
    template: &str,
) -> Result<BTreeMap<String, RailNic>> {
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
        let pci = device_pci(root, &format!("class/net/{iface}/device"))
            .with_context(|| format!("rail {rail}: interface {iface} has no PCI device"))?;
        add_port(&mut out, pci, rail, by_name.get(iface.as_str()).copied());
    }
    Ok(out)
}

/// The same map for every top-level port of the record whose netdev name,
/// else RDMA device name, matches `re` (the `interface-name` source).
pub fn named_rails(
    record: &NodeRecord,
    re: &Regex,
    template: &str,
) -> Result<BTreeMap<String, RailNic>> {
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
            bail!(
                "rail {rail}: port {name} has no PCI device (bus {})",
                iface.bus
            );
        };
        add_port(&mut out, pci, rail, Some((iface, None)));
    }
    Ok(out)
}

/// The rail ID `template` expands to for `name`, `None` when `re` does not match.
fn rail_id(re: &Regex, template: &str, name: &str) -> Result<Option<String>> {
    let Some(caps) = re.captures(name) else {
        return Ok(None);
    };
    let mut rail = String::new();
    caps.expand(template, &mut rail);
    if rail.is_empty() {
        bail!("interface {name}: rail template {template:?} expands to an empty rail ID");
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

/// The normalised PCI address a sysfs `device` link points at.
fn device_pci(root: &SysRoot, link: &str) -> Result<String> {
    let target = root
        .resolve(link)
        .with_context(|| format!("resolving {link}"))?;
    let name = sysfs::basename(&target);
    pci::normalize(name).with_context(|| format!("{link} points at {target}, not a PCI device"))
}

/// Every GPU's paths to NICs, from nvidia-smi where present and the PCIe walk otherwise.
fn gpu_paths(
    root: &SysRoot,
    record: &NodeRecord,
    nic_rails: &BTreeMap<String, RailNic>,
    input: &NvidiaInput,
    timeout: std::time::Duration,
) -> Result<Vec<GpuPaths>> {
    let smi = nvidia_smi_view(root, record, input, timeout)?;
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
/// when nvidia-smi is not used or not installed.
fn nvidia_smi_view(
    root: &SysRoot,
    record: &NodeRecord,
    input: &NvidiaInput,
    timeout: std::time::Duration,
) -> Result<Vec<GpuPaths>> {
    let (query, topo, origins) = match input {
        NvidiaInput::Sysfs => return Ok(Vec::new()),
        NvidiaInput::Files { query, topo } => (
            read_text(query, timeout)?,
            read_text(topo, timeout)?,
            (query.display().to_string(), topo.display().to_string()),
        ),
        NvidiaInput::Command(bin) => {
            let has_nvidia = record
                .accelerators()
                .any(|a| a.manufacturer == crate::record::Vendor::Nvidia);
            if bin.is_none() && !has_nvidia {
                return Ok(Vec::new());
            }
            let bin = bin.clone().unwrap_or_else(|| PathBuf::from("nvidia-smi"));
            let Some(query) = run_nvidia_smi(
                &bin,
                &["--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader"],
                timeout,
            )?
            else {
                tracing::info!(
                    "{} not found: GPU paths come from the PCIe walk",
                    bin.display()
                );
                return Ok(Vec::new());
            };
            let topo = run_nvidia_smi(&bin, &["topo", "-m"], timeout)?.unwrap_or_default();
            let name = bin.display();
            (
                query,
                topo,
                (format!("{name} --query-gpu"), format!("{name} topo -m")),
            )
        }
    };
    let ids = nvsmi::parse_query(&query, &origins.0)?;
    let topo = topo::parse_topo(&topo, &origins.1)?;
    let mut out = Vec::new();
    for id in ids {
        let row = topo.gpu_to_nic.get(&id.index).with_context(|| {
            format!(
                "GPU{} ({}) is in --query-gpu but has no row in topo -m",
                id.index, id.pci_bus_id
            )
        })?;
        let mut paths = BTreeMap::new();
        for (nic, class) in row {
            // A NIC alias that does not resolve is on no discovered rail either: ignored.
            if let Ok(pci) = device_pci(root, &format!("class/infiniband/{nic}/device")) {
                paths.insert(pci, class.clone());
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

/// The most a saved nvidia-smi output may hold: a 64-GPU, 64-NIC matrix is
/// under 64 KiB, so anything near this is not one.
pub const MAX_SAVED_OUTPUT: u64 = 4 << 20;

/// Reads a saved nvidia-smi or lldpctl output (a file, or a pipe such as a
/// shell's `<(…)` written to its end within `wait`), refusing one over
/// [`MAX_SAVED_OUTPUT`] or not UTF-8, naming the path.
fn read_text(path: &std::path::Path, wait: std::time::Duration) -> Result<String> {
    Ok(crate::input::read_text(
        path,
        MAX_SAVED_OUTPUT,
        "a saved tool output",
        crate::input::Pipes::Wait(wait),
    )?)
}

/// Runs nvidia-smi with the pass's tool timeout; `Ok(None)` when the binary
/// does not exist.
fn run_nvidia_smi(
    bin: &std::path::Path,
    args: &[&str],
    timeout: std::time::Duration,
) -> Result<Option<String>> {
    crate::tool::output_if_installed(bin, args, timeout).map_err(anyhow::Error::msg)
}

/// The record as published: JSON with every object's keys sorted, and a trailing newline.
pub fn to_bytes(record: &RailRecord) -> Vec<u8> {
    // serde_json's Value keeps keys in a BTreeMap, so a round trip sorts them.
    let value = serde_json::to_value(record).expect("record serialises");
    let mut s = serde_json::to_string_pretty(&value).expect("value serialises");
    s.push('\n');
    s.into_bytes()
}
