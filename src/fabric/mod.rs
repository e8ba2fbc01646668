//! Scale-up fabric per accelerator (NVLink, XGMI, Ascend UB): reading it
//! from the host and the vendor tools. The `fabric.*` labels derived from
//! it are a pure function of the record, in [`crate::labels`].
//!
//! What each manufacturer establishes differs: NVIDIA once the fabric manager
//! registered the GPU; AMD from the XGMI hive id in sysfs; Ascend from the
//! driver's super-pod answer (read from a JSON file); Cambricon reports no
//! domain identity at all, so none is recorded.

pub mod answers;
pub mod ascend;
pub mod nvidia;
pub mod nvml;

use crate::publish::Previous;
use crate::record::{Fabric, NodeRecord, Vendor};
use crate::sysfs::SysRoot;
use answers::Unreadable;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;
use tracing::{debug, warn};

/// Where the NVIDIA fabric answer comes from.
#[derive(Debug, Clone, Default)]
pub enum NvidiaSource {
    /// NVML from the default library; where it cannot be loaded, `nvidia-smi
    /// -q` from PATH.
    #[default]
    Auto,
    /// NVML from this library only; a failure to load it is an unreadable answer.
    Nvml(PathBuf),
    /// Run this `nvidia-smi` binary.
    Command(PathBuf),
    /// Read a saved `nvidia-smi -q` text.
    File(PathBuf),
    /// Nobody: the tree read is not a mounted sysfs, so this host's NVML
    /// and `nvidia-smi` would describe another machine's GPUs.
    NotThisHost,
}

/// The non-sysfs inputs of the fabric readers.
#[derive(Debug, Clone)]
pub struct Sources {
    /// NVIDIA: `nvidia-smi -q`.
    pub nvidia: NvidiaSource,
    /// Ascend: the super-pod JSON file, when given.
    pub ascend: Option<PathBuf>,
    /// How long a vendor tool may run before its answer counts as unreadable.
    pub timeout: Duration,
    /// A capture's recorded answers: used instead of asking anyone, for a
    /// replay that reproduces the captured node.
    pub replay: Option<answers::Answers>,
    /// Notes every answer this pass uses, for `capture`.
    pub recorder: Option<answers::Recorder>,
    /// NVML's reader, where this binary links it and NVML can work here
    /// (see [`NvmlReader`]); without it `Auto` asks `nvidia-smi -q`.
    pub nvml: Option<NvmlReader>,
}

/// Reads every GPU's Fabric block through NVML, from the library named or
/// the default one. Passed in rather than called, so that the lean
/// `nodefabric` binary (linked static, where dlopen is unsafe) links none of
/// NVML's loader: only `nodefabric-full` hands it over.
pub type NvmlReader =
    fn(Option<&std::ffi::OsStr>) -> Result<BTreeMap<String, nvidia::FabricInfo>, nvml::NvmlError>;

impl Default for Sources {
    fn default() -> Self {
        Sources {
            nvidia: NvidiaSource::default(),
            ascend: None,
            timeout: crate::tool::DEFAULT_TIMEOUT,
            replay: None,
            recorder: None,
            nvml: None,
        }
    }
}

impl Sources {
    /// NVIDIA's answer: the replayed one, or a fresh read; noted for capture.
    fn nvidia_answer(&self) -> Result<BTreeMap<String, nvidia::FabricInfo>, Unreadable> {
        let answer = match &self.replay {
            Some(r) => r
                .nvidia
                .as_ref()
                .map_or(Err(Unreadable::NotCaptured), |a| a.to_result()),
            None => nvidia_blocks(self),
        };
        if let Some(rec) = &self.recorder {
            rec.lock().expect("recorder lock").nvidia = Some(answers::Answer::from_result(&answer));
        }
        answer
    }

    /// Ascend's super-pod answers: the replayed ones, or the file's; noted
    /// for capture. `None` when no Ascend input was given (nothing to read).
    fn ascend_answers(&self) -> Option<Result<BTreeMap<String, ascend::Answer>, Unreadable>> {
        let answer = match (&self.replay, &self.ascend) {
            (Some(r), _) => r.ascend.as_ref().map(|a| a.to_result()),
            (None, Some(f)) => Some(read_capped(f).and_then(|t| {
                ascend::parse(&t).map_err(|reason| Unreadable::Ascend {
                    origin: f.display().to_string(),
                    reason,
                })
            })),
            (None, None) => None,
        };
        if let (Some(rec), Some(a)) = (&self.recorder, &answer) {
            rec.lock().expect("recorder lock").ascend = Some(answers::Answer::from_result(a));
        }
        answer
    }
}

/// Every NVIDIA GPU's Fabric block, keyed by PCI address, from the chosen
/// source. Running `nvidia-smi` (a missing binary, a failure, a hang past
/// the timeout) and reading its answer can each fail: all are unreadable.
fn nvidia_blocks(sources: &Sources) -> Result<BTreeMap<String, nvidia::FabricInfo>, Unreadable> {
    let run_q = |bin: &std::path::Path| {
        crate::tool::output(bin, &["-q"], sources.timeout).map_err(Unreadable::Tool)
    };
    let (text, origin) = match &sources.nvidia {
        NvidiaSource::Nvml(lib) => {
            let read = sources
                .nvml
                .ok_or(Unreadable::Nvml(nvml::NvmlError::NotLinked))?;
            return read(Some(lib.as_os_str())).map_err(Unreadable::Nvml);
        }
        NvidiaSource::Auto => match sources
            .nvml
            .map_or(Err(nvml::NvmlError::NotLinked), |read| read(None))
        {
            Ok(blocks) => return Ok(blocks),
            Err(e @ (nvml::NvmlError::Unavailable { .. } | nvml::NvmlError::NotLinked)) => {
                debug!("{e}; reading nvidia-smi -q instead");
                (
                    run_q(std::path::Path::new("nvidia-smi"))?,
                    "nvidia-smi -q".to_string(),
                )
            }
            Err(e) => return Err(Unreadable::Nvml(e)),
        },
        NvidiaSource::Command(bin) => (run_q(bin)?, format!("{} -q", bin.display())),
        NvidiaSource::File(f) => (read_capped(f)?, f.display().to_string()),
        NvidiaSource::NotThisHost => return Err(Unreadable::NotThisHost),
    };
    nvidia::parse_any(&text).map_err(|reason| Unreadable::Nvidia { origin, reason })
}

/// Reads a saved vendor answer, refusing anything that is not a regular file
/// (it is read on every pass, so a pipe has no place here) or is larger
/// than a tool's answer can be.
fn read_capped(f: &std::path::Path) -> Result<String, Unreadable> {
    crate::input::read_text(
        f,
        crate::tool::MAX_OUTPUT,
        "a vendor answer",
        crate::input::Pipes::Refuse,
    )
    .map_err(Unreadable::Input)
}

/// The longest note an accelerator carries: a note repeats for every
/// accelerator in the record, so a vendor's runaway text must not.
pub const MAX_NOTE: usize = 512;

/// Fills `topology.fabric` (or a note saying why not) on every accelerator.
/// A manufacturer whose answer cannot be read keeps the previous record's
/// fabric for its accelerators, so no label is withdrawn on a failed read.
pub fn apply(root: &SysRoot, record: &mut NodeRecord, sources: &Sources, previous: &Previous) {
    fill(root, record, sources, previous);
    for group in &mut record.spec.groups {
        for acc in &mut group.accelerators {
            if let Some(note) = &mut acc.fabric_note {
                if note.len() > MAX_NOTE {
                    *note = crate::tool::cap_text(note, MAX_NOTE, note.len() as u64);
                }
            }
        }
    }
}

/// [`apply`] before the notes are capped.
fn fill(root: &SysRoot, record: &mut NodeRecord, sources: &Sources, previous: &Previous) {
    for group in &mut record.spec.groups {
        match group.manufacturer {
            Vendor::Nvidia => {
                let blocks = match sources.nvidia_answer() {
                    Ok(b) => b,
                    Err(e) => {
                        keep_previous(&mut group.accelerators, "NVIDIA", &e, previous);
                        continue;
                    }
                };
                for acc in &mut group.accelerators {
                    match blocks.get(&acc.pci_bus_id) {
                        Some(info) => match nvidia::fabric(info) {
                            Ok(f) => acc.topology.fabric = Some(f),
                            Err(why) => acc.fabric_note = Some(why.to_string()),
                        },
                        None => {
                            acc.fabric_note =
                                Some("the NVIDIA fabric answer has no entry for this GPU".into())
                        }
                    }
                }
            }
            Vendor::Amd => {
                for acc in &mut group.accelerators {
                    let path = format!(
                        "bus/pci/devices/{}/xgmi_hive_info/xgmi_hive_id",
                        acc.pci_bus_id
                    );
                    match root.read_trimmed(&path) {
                        // The driver prints a 64-bit number; any alphanumeric
                        // token is kept verbatim, all zeros means "no hive".
                        Ok(id)
                            if !id.is_empty()
                                && id.chars().all(|c| c.is_ascii_alphanumeric())
                                && !id.chars().all(|c| c == '0') =>
                        {
                            acc.topology.fabric = Some(Fabric {
                                kind: "xgmi".into(),
                                id: Some(id),
                                ..Default::default()
                            });
                        }
                        Ok(id) => acc.fabric_note = Some(format!("{path} is {id:?}: no XGMI hive")),
                        Err(e) => acc.fabric_note = Some(format!("no XGMI hive: {e}")),
                    }
                }
            }
            Vendor::Ascend => {
                let answers = match sources.ascend_answers() {
                    None => Err(Unreadable::NoAscendInput),
                    Some(Err(e)) => {
                        keep_previous(&mut group.accelerators, "Ascend", &e, previous);
                        continue;
                    }
                    Some(Ok(map)) => Ok(map),
                };
                for acc in &mut group.accelerators {
                    match &answers {
                        Ok(map) => match map.get(&acc.pci_bus_id) {
                            Some(answer) => {
                                let (fabric, note) = ascend::fabric(answer);
                                acc.topology.fabric = Some(fabric);
                                acc.fabric_note = note;
                            }
                            None => {
                                acc.fabric_note =
                                    Some("the Ascend fabric input has no entry for this NPU".into())
                            }
                        },
                        Err(e) => acc.fabric_note = Some(e.to_string()),
                    }
                }
            }
            Vendor::Cambricon => {
                for acc in &mut group.accelerators {
                    acc.fabric_note = Some(
                        "Cambricon MLU-Link reports no domain identity, only per-link peers".into(),
                    );
                }
            }
            other => {
                for acc in &mut group.accelerators {
                    acc.fabric_note = Some(format!("no scale-up fabric reader for {other}"));
                }
            }
        }
    }
}

/// An unreadable answer for a whole manufacturer: each accelerator keeps what
/// the previous record said for it, and one warning says so for the pass.
fn keep_previous(
    accs: &mut [crate::record::Accelerator],
    maker: &str,
    e: &Unreadable,
    previous: &Previous,
) {
    let mut kept = 0;
    // Read only when there is an accelerator to keep an answer for.
    let previous = if accs.is_empty() {
        None
    } else {
        previous.get()
    };
    for acc in accs.iter_mut() {
        acc.topology.fabric = previous
            .and_then(|p| p.accelerators().find(|a| a.pci_bus_id == acc.pci_bus_id))
            .and_then(|a| a.topology.fabric.clone());
        kept += usize::from(acc.topology.fabric.is_some());
        acc.fabric_note = Some(match acc.topology.fabric {
            Some(_) => format!("fabric unreadable, kept from the previous pass: {e}"),
            None => format!("fabric unreadable, no previous answer to keep: {e}"),
        });
    }
    if kept > 0 {
        warn!("{maker} fabric unreadable, keeping the previous answer for {kept} of {} accelerators: {e}", accs.len());
    } else {
        warn!("{maker} fabric unreadable, and no previous answer to keep: {e}");
    }
}
