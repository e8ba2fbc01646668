//! Reading what a rail record is built from: the LLDP neighbour table and
//! nvidia-smi's answers (run on the node, saved files, or a replayed
//! capture's), and the sysfs `device` links those answers name, read
//! through the pass's own tree (the recording one, for `capture`, so the
//! archive holds them). Nothing here fails: each answer is kept as it was
//! read, a failure with its words, for [`crate::rails::build`] to judge.

use crate::pci;
use crate::rails::answers::{Answer, DeviceLink, Inputs, NvidiaAnswers, Origin, Output};
use crate::rails::{lldp, topo, RailAnswers, MAX_SAVED_OUTPUT};
use crate::record::NodeRecord;
use crate::sysfs::{self, SysRoot};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where the LLDP neighbour table comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LldpSource {
    /// Run `lldpctl -f json`, against this socket when given.
    Lldpctl(Option<PathBuf>),
    /// A saved `lldpctl -f json` output.
    File(PathBuf),
    /// A replayed capture's answer (`None`: the capture holds none).
    Replay(Option<Answer>),
}

/// Where nvidia-smi's answers come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NvidiaSource {
    /// Run this `nvidia-smi` (or the one on PATH, only where the record has
    /// an NVIDIA GPU); its absence means the PCIe walk.
    Command(Option<PathBuf>),
    /// Saved `--query-gpu=index,uuid,pci.bus_id --format=csv,noheader` and `topo -m` outputs.
    Files {
        /// The query CSV.
        query: PathBuf,
        /// The matrix.
        topo: PathBuf,
    },
    /// Not asked: the PCIe walk for every GPU.
    Sysfs,
    /// A replayed capture's answers (`None`: the captured pass did not ask).
    Replay(Option<NvidiaAnswers>),
    /// Answers gathered before the read by another asker (the GPU
    /// Operator's pod on this node, `gpuSource`), taken as they are: a
    /// failed one fails the rail build as a failed local run does.
    Answered(NvidiaAnswers),
}

/// The rail inputs one pass reads.
#[derive(Debug, Clone)]
pub struct Sources {
    /// The LLDP table; `None` when the rail source does not use it (`interface-name`).
    pub lldp: Option<LldpSource>,
    /// nvidia-smi's answers.
    pub nvidia: NvidiaSource,
    /// How long a tool may run, or a piped saved output take to be written whole.
    pub timeout: Duration,
}

/// Reads every rail input `sources` names, and the `device` link of every
/// interface and RDMA device the answers name, from `root`.
pub fn read(root: &SysRoot, record: &NodeRecord, sources: &Sources) -> Inputs {
    let answers = RailAnswers {
        lldp: sources
            .lldp
            .as_ref()
            .and_then(|s| lldp_answer(s, sources.timeout)),
        nvidia: nvidia_answers(record, &sources.nvidia, sources.timeout),
    };
    let mut inputs = Inputs::default();
    if let Some(ifaces) = answers.lldp.as_ref().and_then(|a| lldp::neighbours(a).ok()) {
        for iface in ifaces {
            let link = device_link(root, "class/net", &iface);
            inputs.netdev_pci.insert(iface, link);
        }
    }
    let topo_text = answers
        .nvidia
        .as_ref()
        .and_then(|n| n.topo.as_ref()?.text());
    if let Some(matrix) = topo_text.and_then(|t| topo::parse_topo(t, "").ok()) {
        for nic in matrix.gpu_to_nic.values().flat_map(|row| row.keys()) {
            if !inputs.rdma_pci.contains_key(nic) {
                let link = device_link(root, "class/infiniband", nic);
                inputs.rdma_pci.insert(nic.clone(), link);
            }
        }
    }
    inputs.answers = answers;
    inputs
}

/// The LLDP answer from its source.
fn lldp_answer(source: &LldpSource, timeout: Duration) -> Option<Answer> {
    Some(match source {
        LldpSource::Replay(answer) => return answer.clone(),
        LldpSource::File(path) => saved(path, timeout),
        LldpSource::Lldpctl(socket) => {
            let socket_arg = socket.as_ref().map(|s| s.to_string_lossy().into_owned());
            let mut args = Vec::new();
            if let Some(s) = &socket_arg {
                args.extend(["-u", s.as_str()]);
            }
            args.extend(["-f", "json"]);
            run(Path::new("lldpctl"), &args, "lldpctl".into(), timeout)
        }
    })
}

/// nvidia-smi's answers from their source; `None` where it is not asked.
fn nvidia_answers(
    record: &NodeRecord,
    source: &NvidiaSource,
    timeout: Duration,
) -> Option<NvidiaAnswers> {
    match source {
        NvidiaSource::Sysfs => None,
        NvidiaSource::Replay(answers) => answers.clone(),
        NvidiaSource::Answered(answers) => Some(answers.clone()),
        NvidiaSource::Files { query, topo } => {
            let query = saved(query, timeout);
            // The matrix is read only for a query that was: its failure is the answer.
            let topo = query.text().is_some().then(|| saved(topo, timeout));
            Some(NvidiaAnswers { query, topo })
        }
        NvidiaSource::Command(bin) => {
            let has_nvidia = record
                .accelerators()
                .any(|a| a.manufacturer == crate::record::Vendor::Nvidia);
            if bin.is_none() && !has_nvidia {
                return None;
            }
            let bin = bin.clone().unwrap_or_else(|| PathBuf::from("nvidia-smi"));
            let name = bin.display();
            let query = run(
                &bin,
                &["--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader"],
                format!("{name} --query-gpu"),
                timeout,
            );
            if query.output == Output::NotInstalled {
                tracing::info!("{name} not found: GPU paths come from the PCIe walk");
            }
            let topo = query
                .text()
                .is_some()
                .then(|| run(&bin, &["topo", "-m"], format!("{name} topo -m"), timeout));
            Some(NvidiaAnswers { query, topo })
        }
    }
}

/// Runs a tool within `timeout`: its output, its absence, or why it gave nothing.
fn run(bin: &Path, args: &[&str], origin: String, timeout: Duration) -> Answer {
    let output = match crate::tool::output_if_installed(bin, args, timeout) {
        Ok(Some(text)) => Output::Printed(text),
        Ok(None) => Output::NotInstalled,
        Err(why) => Output::Failed(why.to_string()),
    };
    Answer {
        origin: Origin::Command(origin),
        output,
    }
}

/// Reads a saved tool output (a file, or a pipe such as a shell's `<(…)`
/// written to its end within `wait`), refusing one over [`MAX_SAVED_OUTPUT`]
/// or not UTF-8, naming the path.
fn saved(path: &Path, wait: Duration) -> Answer {
    let origin = Origin::File(path.display().to_string());
    match crate::input::read_text(
        path,
        MAX_SAVED_OUTPUT,
        "a saved tool output",
        crate::input::Pipes::Wait(wait),
    ) {
        Ok(text) => Answer::printed(origin, text),
        Err(e) => Answer::failed(origin, e.to_string()),
    }
}

/// Where `class/NAME/device` leads. A name from a tool's answer (or a
/// stranger's capture) that is no device name is not looked up at all.
fn device_link(root: &SysRoot, class: &str, name: &str) -> DeviceLink {
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
        return DeviceLink::Unresolved(format!("{name:?} is not a device name"));
    }
    // The name as the tool prints it; the sysfs reader takes a path's text,
    // in which a backslash is written twice (see [`crate::escape`]).
    let link = format!("{class}/{}/device", crate::escape::escape(name.as_bytes()));
    match root.resolve(&link) {
        Err(e) => DeviceLink::Unresolved(format!("resolving {link}: {e}")),
        Ok(target) => match pci::normalize(sysfs::basename(&target)) {
            Some(address) => DeviceLink::Pci(address),
            None => DeviceLink::Unresolved(format!("{link} points at {target}, not a PCI device")),
        },
    }
}
