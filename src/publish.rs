//! The only code that writes: atomic file replacement and the state folder.
//!
//! A write goes to a dot-named temp file in the target folder (NFD ignores
//! dot-files, and the rename stays on one filesystem), is fsynced, renamed over
//! the target, and the folder is fsynced so the rename survives a crash. A
//! reader sees the old file or the new one, never a partial one.

use crate::cdi::{self, Family};
use crate::record::{LinkState, NodeRecord};
use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use tracing::{info, warn};

/// Why a write did not happen; each names the file or folder.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// A file-system step failed: `{step} {path}`, with the cause beneath.
    #[error("{step} {}", path.display())]
    Io {
        /// What was being done (`creating`, `writing`, `renaming into` …).
        step: &'static str,
        /// The file or folder it was done to.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A folder that takes nothing until this process restarts.
    #[error("{0}; nothing published")]
    StaleFolder(String),
    /// A folder that refuses new files: nothing was written anywhere.
    #[error("{} does not take new files; nothing published", path.display())]
    Refused {
        /// The folder.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// CDI families whose spec could not be generated (each previous file kept).
    #[error("CDI specs not written: {}", .0.join(" | "))]
    CdiNotWritten(Vec<String>),
    /// Outputs of a pass that could not be written, each with its cause; the
    /// feature file is then left as it was, so the labels never announce
    /// what the CDI specs and the record do not hold.
    #[error("not written: {}; previous feature file kept", .0.join(" | "))]
    NotWritten(Vec<String>),
}

impl PublishError {
    /// The error and each of its causes on one line, for a list of several.
    pub fn one_line(&self) -> String {
        let mut text = self.to_string();
        let mut cause = std::error::Error::source(self);
        while let Some(c) = cause {
            text.push_str(&format!(": {c}"));
            cause = c.source();
        }
        text
    }
}

/// A `PublishError::Io` for `step` on `path`, for `map_err`.
fn io<'a>(step: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> PublishError + 'a {
    move |source| PublishError::Io {
        step,
        path: path.to_path_buf(),
        source,
    }
}

/// The result of a write.
pub type Result<T, E = PublishError> = std::result::Result<T, E>;

/// The file in `--state-dir` holding the last published record.
pub const STATE_FILE: &str = "record.json";

/// The mode of every file written: readable by the unprivileged readers
/// (nfd-worker's image, CDI loaders), writable by none of them.
pub const FILE_MODE: u32 = 0o644;

/// Replaces `dir/name` with `bytes` atomically, as a [`FILE_MODE`] file.
pub fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<PathBuf> {
    write_atomic_with(dir, name, |w| w.write_all(bytes))
}

/// [`write_atomic`] of what `write` produces, through a buffer into the
/// temp file: a large output (the record, 11 MiB at 10,000 endpoints) is
/// never held whole in memory.
pub fn write_atomic_with(
    dir: &Path,
    name: &str,
    write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let target = dir.join(name);
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .tempfile_in(dir)
        .map_err(io("creating a temp file in", dir))?;
    // The temp file is created 0600; the mode is set before the rename, so
    // the published name never points at a file its readers cannot open.
    tmp.as_file()
        .set_permissions(fs::Permissions::from_mode(FILE_MODE))
        .and_then(|_| {
            let mut buffered = std::io::BufWriter::with_capacity(64 * 1024, tmp.as_file());
            write(&mut buffered)?;
            buffered.flush()
        })
        .and_then(|_| tmp.as_file().sync_all())
        .map_err(io("writing", &target))?;
    tmp.persist(&target)
        .map_err(|e| io("renaming into", &target)(e.error))?;
    // Make the rename itself durable; a failure here is not worth failing the pass.
    if let Err(e) = fs::File::open(dir).and_then(|d| d.sync_all()) {
        warn!("fsync of {} failed: {e}", dir.display());
    }
    Ok(target)
}

/// Makes sure every folder a pass will write into exists and takes a new
/// file, before anything is written: a pass that would fail on its second
/// folder must not have replaced the first folder's file already.
pub fn check_folders(dirs: &[(&str, &Path)]) -> Result<()> {
    if let Some(why) = stale_folder(dirs) {
        return Err(PublishError::StaleFolder(why));
    }
    for (_, dir) in dirs {
        fs::create_dir_all(dir).map_err(io("creating", dir))?;
        tempfile::Builder::new()
            .prefix(CHECK_PREFIX)
            .tempfile_in(dir)
            .map_err(|source| PublishError::Refused {
                path: dir.to_path_buf(),
                source,
            })?;
    }
    Ok(())
}

/// The prefix of [`check_folders`]'s probe files.
const CHECK_PREFIX: &str = ".nodefabric-check.";

/// How old a temp file of ours must be before a pass takes it for one left
/// by a killed write: far past any write's time, so a concurrent one (a
/// second publisher during a rollout) keeps its file.
pub const STALE_TEMP_AGE: std::time::Duration = std::time::Duration::from_secs(60);

/// Whether `file` is a temp file [`write_atomic`] (or the folder check)
/// makes for one of `names`: `.NAME.` or the check's prefix, then the six
/// letters or digits the temp file library adds, and nothing else.
fn is_own_temp(file: &str, names: &[&str]) -> bool {
    let suffix_ok = |rest: &str| rest.len() == 6 && rest.bytes().all(|b| b.is_ascii_alphanumeric());
    if let Some(rest) = file.strip_prefix(CHECK_PREFIX) {
        return suffix_ok(rest);
    }
    names.iter().any(|name| {
        file.strip_prefix('.')
            .and_then(|f| f.strip_prefix(name))
            .and_then(|f| f.strip_prefix('.'))
            .is_some_and(suffix_ok)
    })
}

/// Removes from `dir` the temp files of our own `names` that a killed
/// write left behind (older than [`STALE_TEMP_AGE`], regular files only).
/// Another tool's files are never touched; a file that cannot be removed
/// is logged and left, it costs only its space.
pub fn remove_stale_temps(dir: &Path, names: &[&str]) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let now = std::time::SystemTime::now();
    for entry in entries.flatten() {
        let file = entry.file_name();
        let Some(file) = file.to_str() else { continue };
        if !is_own_temp(file, names) {
            continue;
        }
        let stale = entry.metadata().is_ok_and(|m| {
            m.is_file()
                && m.modified()
                    .is_ok_and(|t| now.duration_since(t).is_ok_and(|age| age > STALE_TEMP_AGE))
        });
        if !stale {
            continue;
        }
        match fs::remove_file(entry.path()) {
            Ok(()) => info!(
                "removed {}, left by an interrupted write",
                entry.path().display()
            ),
            Err(e) => warn!("could not remove {}: {e}", entry.path().display()),
        }
    }
}

/// Removes the file at `path`: true when one was removed, false when none
/// was there, which is what a removal wants (kubelet, an operator or a
/// predecessor may have removed it first).
pub fn remove_if_present(path: &Path) -> std::io::Result<bool> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Why one of `dirs` (each with what it is for: "the CDI folder") can take
/// nothing until this process restarts: it was deleted on the host while
/// mounted here (see [`crate::mounts`]).
pub fn stale_folder(dirs: &[(&str, &Path)]) -> Option<String> {
    dirs.iter()
        .find(|(_, d)| crate::mounts::deleted_in_place(d))
        .map(|(what, d)| crate::mounts::stale_reason(what, d))
}

/// The largest previous record read back: a few MiB past what 10,000
/// endpoints write (see docs/benchmarks.md), and a bound on what a file
/// planted in its place costs a publisher held to 64 MiB. A larger one is
/// ignored with a warning: its facts are unknown for one pass.
pub const MAX_RECORD: u64 = 32 << 20;

/// What a pass holds per network interface at its peak (3.75 KiB), beyond
/// [`PASS_BASE_MIB`]: the line through the peaks measured in
/// docs/benchmarks.md (54.4 MiB at 10,000 endpoints, 65.4 MiB at 13,000).
pub const PASS_BYTES_PER_INTERFACE: u64 = 3_840;

/// Where that line starts: the process and what a pass holds whatever the
/// node's size.
pub const PASS_BASE_MIB: u64 = 18;

/// The share of its memory limit a pass may be expected to peak at: the
/// rest is the margin for what a real node's tree adds.
pub const PASS_LIMIT_SHARE: f64 = 0.9;

/// A node too large for the memory this process may use, found before the
/// pass reads it.
#[derive(Debug, thiserror::Error)]
#[error(
    "{interfaces} network interfaces under {}: a pass would peak at about {need_mib} MiB, over {share:.0}% of the \
     {limit_mib} MiB memory limit of this container ({}); nothing published. Raise the limit (at 64Mi the largest \
     supported node has 10,800 network interfaces: docs/deployment.md)",
    class_net.display(), cgroup_file.display(), share = PASS_LIMIT_SHARE * 100.0
)]
pub struct NodeTooLarge {
    /// The interfaces counted.
    pub interfaces: u64,
    /// Where they were counted.
    pub class_net: PathBuf,
    /// What a pass over them is expected to need, in MiB.
    pub need_mib: u64,
    /// The limit, in MiB.
    pub limit_mib: u64,
    /// Where the limit was read.
    pub cgroup_file: PathBuf,
}

/// The memory a pass over `interfaces` network interfaces is expected to
/// peak at, in MiB, and whether that fits `limit_bytes`.
pub fn pass_fits(interfaces: u64, limit_bytes: u64) -> (u64, bool) {
    let need =
        (PASS_BASE_MIB << 20).saturating_add(interfaces.saturating_mul(PASS_BYTES_PER_INTERFACE));
    let fits = need as f64 <= limit_bytes as f64 * PASS_LIMIT_SHARE;
    (need.div_ceil(1 << 20), fits)
}

/// Refuses, before anything is read or allocated for it, a node whose
/// `class/net` under `sysfs_root` holds more interfaces than a pass can
/// hold within this container's memory limit: the first of `cgroup_files`
/// that exists (cgroup v2 `memory.max`, then v1 `memory.limit_in_bytes`,
/// whose "no limit" is a number too large to matter). No limit (`max`), no
/// file, or an unreadable folder: no check, the pass finds any error itself.
pub fn check_node_size(sysfs_root: &Path, cgroup_files: &[&Path]) -> Result<(), NodeTooLarge> {
    let Some((limit, cgroup_file)) = cgroup_files.iter().find_map(|f| {
        let text = fs::read_to_string(f).ok()?;
        Some((text.trim().parse::<u64>().ok(), *f))
    }) else {
        return Ok(());
    };
    let Some(limit) = limit else {
        return Ok(());
    };
    let class_net = sysfs_root.join("class/net");
    let Ok(entries) = fs::read_dir(&class_net) else {
        return Ok(());
    };
    let interfaces = entries.count() as u64;
    match pass_fits(interfaces, limit) {
        (_, true) => Ok(()),
        (need_mib, false) => Err(NodeTooLarge {
            interfaces,
            class_net,
            need_mib,
            limit_mib: limit >> 20,
            cgroup_file: cgroup_file.to_path_buf(),
        }),
    }
}

/// Reads the previous record from the state folder; a missing or unreadable
/// one is logged and treated as none (it only carries `firstSeen` times and
/// the facts a pass could not read). Parsed as the file is read: at 10,000
/// endpoints its text (~12 MB) held beside the parsed record (~17 MB) took
/// the publisher over its 64Mi limit on a node whose facts were unreadable.
pub fn load_previous(state_dir: Option<&Path>) -> Option<NodeRecord> {
    let path = state_dir?.join(STATE_FILE);
    // Bounded, and never a FIFO: something planted there must not stall
    // every later pass.
    let file = match crate::input::open_file(&path, MAX_RECORD, "a node record") {
        Ok(f) => f,
        Err(crate::input::InputError::Io { cause, .. })
            if cause.kind() == std::io::ErrorKind::NotFound =>
        {
            return None
        }
        Err(e) => {
            // The error names the path.
            warn!("ignoring the previous record: {e}");
            return None;
        }
    };
    match serde_json::from_reader(std::io::BufReader::new(file)) {
        Ok(r) => Some(r),
        Err(e) => {
            warn!("ignoring previous record {}: {e}", path.display());
            None
        }
    }
}

/// The previous record, parsed only when a pass first asks for it: only
/// facts that could not be read, failed links' `firstSeen` and unreadable
/// fabric answers need it, and at 10,000 endpoints it is ~17 MB in memory,
/// which a pass holding the tree's resolutions and the new record beside it
/// would otherwise carry over the 64Mi limit (docs/benchmarks.md).
#[derive(Debug)]
pub struct Previous {
    /// Where it is read from; `None` for one given whole (or none at all).
    state_dir: Option<PathBuf>,
    /// The parsed record (or its absence), once asked for.
    record: std::cell::OnceCell<Option<NodeRecord>>,
}

impl Previous {
    /// The record in `state_dir`, read at first use. A file that is no
    /// regular file or is over [`MAX_RECORD`] is refused (with its warning)
    /// at once, so that every pass says so, needed or not.
    pub fn at(state_dir: Option<&Path>) -> Previous {
        let previous = Previous {
            state_dir: state_dir.map(Path::to_path_buf),
            record: std::cell::OnceCell::new(),
        };
        let refused = state_dir
            .and_then(|d| fs::metadata(d.join(STATE_FILE)).ok())
            .is_some_and(|m| !m.is_file() || m.len() > MAX_RECORD);
        if refused {
            previous.get();
        }
        previous
    }

    /// A record already at hand (or none), for callers that hold one.
    pub fn given(record: Option<NodeRecord>) -> Previous {
        Previous {
            state_dir: None,
            record: std::cell::OnceCell::from(record),
        }
    }

    /// The record, read and parsed on the first call; `None` when there is
    /// none or it cannot be used (logged once, by [`load_previous`]).
    pub fn get(&self) -> Option<&NodeRecord> {
        self.record
            .get_or_init(|| load_previous(self.state_dir.as_deref()))
            .as_ref()
    }

    /// When each endpoint whose link had failed was first seen failing, by
    /// (RDMA device, PCI address). Only these fields are parsed, as the file
    /// is read, unless the whole record is already at hand: on a node whose
    /// links are down the whole record (~17 MB at 10,000 endpoints, and its
    /// text beside it while parsed) is not needed for them. A record this
    /// cannot read is read whole, whose reader says why, once.
    pub fn failing_since(&self) -> HashMap<EndpointKey, String> {
        let whole = |record: &NodeRecord| {
            record
                .endpoints()
                .into_iter()
                .filter_map(|(ep, _)| {
                    let link = ep.link.as_ref()?;
                    let since = link.first_seen.clone()?;
                    (link.state == LinkState::Failed)
                        .then(|| ((ep.rdma_device.clone(), ep.pci_bus_id.clone()), since))
                })
                .collect()
        };
        if let Some(held) = self.record.get() {
            return held.as_ref().map(whole).unwrap_or_default();
        }
        match self.state_dir.as_deref().and_then(failing_only) {
            Some(found) => found,
            None => self.get().map(whole).unwrap_or_default(),
        }
    }
}

/// An endpoint as a failing link is remembered: (RDMA device, PCI address).
pub type EndpointKey = (Option<String>, Option<String>);

/// The failed links of the record in `state_dir`, parsed as the file is read
/// with every other field skipped; `None` when there is no such file or it
/// cannot be read or parsed (for [`Previous::get`] to read and name).
fn failing_only(state_dir: &Path) -> Option<HashMap<EndpointKey, String>> {
    /// The parts of a record that say which links failed since when.
    #[derive(serde::Deserialize)]
    struct Record {
        #[allow(dead_code)] // required, as the whole record requires it
        version: u32,
        spec: Spec,
    }
    #[derive(serde::Deserialize)]
    struct Spec {
        interfaces: Vec<Endpoint>,
    }
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Endpoint {
        #[serde(default)]
        rdma_device: Option<String>,
        #[serde(default)]
        pci_bus_id: Option<String>,
        #[serde(default)]
        link: Option<Link>,
        #[serde(default)]
        virtual_functions: Vec<Endpoint>,
    }
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Link {
        state: LinkState,
        #[serde(default)]
        first_seen: Option<String>,
    }
    fn collect(ep: Endpoint, out: &mut HashMap<EndpointKey, String>) {
        if let Some(Link {
            state: LinkState::Failed,
            first_seen: Some(since),
        }) = ep.link
        {
            out.insert((ep.rdma_device, ep.pci_bus_id), since);
        }
        for vf in ep.virtual_functions {
            collect(vf, out);
        }
    }
    let file =
        crate::input::open_file(&state_dir.join(STATE_FILE), MAX_RECORD, "a node record").ok()?;
    let record: Record = serde_json::from_reader(std::io::BufReader::new(file)).ok()?;
    let mut out = HashMap::new();
    for ep in record.spec.interfaces {
        collect(ep, &mut out);
    }
    Some(out)
}

/// Writes bytes only when they differ from what the file holds; returns
/// whether it wrote.
pub fn write_if_changed(dir: &Path, name: &str, bytes: &[u8]) -> Result<bool> {
    if file_holds(&dir.join(name), bytes) {
        return Ok(false);
    }
    write_atomic(dir, name, bytes)?;
    Ok(true)
}

/// True when the file at `path` holds exactly `bytes`, compared a block at
/// a time through [`SameAs`]: the old file is not read whole beside the new
/// bytes (a 7.4 MB CDI spec at 10,000 endpoints was, at the publisher's
/// peak). What cannot be read as a file (a FIFO, a folder) is not the same.
fn file_holds(path: &Path, bytes: &[u8]) -> bool {
    let Some(mut same) = SameAs::open(path) else {
        return false;
    };
    // In blocks: SameAs reads as much of the file as each write holds.
    bytes
        .chunks(SAME_AS_BLOCK)
        .all(|block| same.write_all(block).is_ok())
        && same.matched_to_end()
}

/// Writes what `write` produces into `dir/name` only when it differs from
/// what the file holds, returning whether it wrote; neither is held whole:
/// the output is compared with the file as it is produced, and produced
/// again into the temp file only on a difference. `write` must produce the
/// same bytes each time.
pub fn write_streamed_if_changed(
    dir: &Path,
    name: &str,
    write: impl Fn(&mut dyn Write) -> std::io::Result<()>,
) -> Result<bool> {
    let target = dir.join(name);
    // What cannot be read as a file (a FIFO, a folder) is simply replaced,
    // unread, as write_if_changed does.
    if let Some(mut same) = SameAs::open(&target) {
        if write(&mut same).is_ok() && same.matched_to_end() {
            return Ok(false);
        }
    }
    write_atomic_with(dir, name, write)?;
    Ok(true)
}

/// How much of the file [`SameAs`] reads at a time.
const SAME_AS_BLOCK: usize = 64 * 1024;

/// A writer that compares what is written to it with a file's bytes, in
/// order, reading the file a buffer at a time.
struct SameAs {
    /// The file, read as the output arrives.
    file: std::io::BufReader<fs::File>,
    /// True while every byte so far matched.
    same: bool,
    /// A buffer for the file's side of each comparison.
    chunk: Vec<u8>,
}

impl SameAs {
    /// The regular file at `path`, opened without blocking on a FIFO;
    /// `None` when it is missing, not a regular file, or unreadable.
    fn open(path: &Path) -> Option<SameAs> {
        let (file, meta) = crate::input::open_checked(path, crate::input::Pipes::Refuse).ok()?;
        meta.is_file().then(|| SameAs {
            file: std::io::BufReader::with_capacity(SAME_AS_BLOCK, file),
            same: true,
            chunk: Vec::new(),
        })
    }

    /// True when everything written matched and the file has nothing more.
    fn matched_to_end(&mut self) -> bool {
        use std::io::BufRead;
        self.same && self.file.fill_buf().is_ok_and(|rest| rest.is_empty())
    }
}

impl Write for SameAs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        use std::io::Read;
        if self.same {
            self.chunk.resize(buf.len(), 0);
            self.same = self.file.read_exact(&mut self.chunk).is_ok() && self.chunk == buf;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The CDI specs of one record, made before anything is written.
#[derive(Debug)]
pub struct CdiFiles {
    /// Each family's file name and bytes; `None` when the family has no
    /// endpoints left (its file is removed).
    files: Vec<(&'static str, Option<Vec<u8>>)>,
    /// Families that cannot be generated: each keeps its previous file.
    failed: Vec<String>,
}

/// Makes one CDI spec per family for `dir`. A family that cannot be
/// generated keeps its previous file and is listed for the pass's error.
pub fn prepare_cdi(dir: &Path, record: &NodeRecord) -> CdiFiles {
    let mut out = CdiFiles {
        files: Vec::new(),
        failed: Vec::new(),
    };
    for family in Family::ALL {
        let name = family.file_name();
        match cdi::spec(record, family) {
            Ok(spec) => out.files.push((name, spec.map(|s| cdi::to_bytes(&s)))),
            // Reported once, by the pass's error; the previous file stays.
            Err(e) => out
                .failed
                .push(format!("{} kept: {e}", dir.join(name).display())),
        }
    }
    out
}

impl CdiFiles {
    /// The families that could not be generated, as the pass's error.
    pub fn not_generated(&self) -> Result<()> {
        if self.failed.is_empty() {
            return Ok(());
        }
        Err(PublishError::CdiNotWritten(self.failed.clone()))
    }
}

/// Writes the prepared specs into `dir`: changed specs are replaced
/// atomically, a family with no endpoints has its file removed. Every file
/// is tried; each one that failed is returned. Files of other tools are
/// never touched: only our own names are written.
pub fn write_cdi(dir: &Path, specs: &CdiFiles) -> Vec<PublishError> {
    let mut failed = Vec::new();
    for (name, bytes) in &specs.files {
        let path = dir.join(name);
        match bytes {
            Some(bytes) => match write_if_changed(dir, name, bytes) {
                Ok(true) => info!("wrote {}", path.display()),
                Ok(false) => {}
                Err(e) => failed.push(e),
            },
            None => match remove_if_present(&path) {
                Ok(true) => info!("removed {}: no endpoints left", path.display()),
                Ok(false) => {}
                Err(e) => failed.push(io("removing", &path)(e)),
            },
        }
    }
    failed
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// A record with a failed PF link, a failed VF link, an up link and a
    /// failed link with no time, as JSON.
    fn failing_record() -> String {
        use crate::record::{Interface, LinkVerdict, Spec};
        let ep = |dev: &str, addr: &str, state, since: Option<&str>| Interface {
            pci_bus_id: Some(addr.into()),
            rdma_device: Some(dev.into()),
            link: Some(LinkVerdict {
                state,
                reason: None,
                ports: Vec::new(),
                first_seen: since.map(str::to_string),
            }),
            ..Interface::default()
        };
        let mut pf = ep(
            "mlx5_0",
            "0000:01:00.0",
            LinkState::Failed,
            Some("2026-01-01T00:00:00Z"),
        );
        pf.virtual_functions = vec![
            ep(
                "mlx5_2",
                "0000:01:00.2",
                LinkState::Failed,
                Some("2026-02-02T00:00:00Z"),
            ),
            ep("mlx5_3", "0000:01:00.3", LinkState::Ok, None),
        ];
        let record = NodeRecord {
            version: crate::record::NODE_RECORD_VERSION,
            spec: Spec {
                interfaces: vec![pf, ep("mlx5_1", "0000:02:00.0", LinkState::Failed, None)],
                ..Spec::default()
            },
        };
        serde_json::to_string_pretty(&record).unwrap()
    }

    /// The failed links read field by field from the file equal what the
    /// whole record gives, so a node whose links are down need not parse it.
    #[test]
    fn failed_links_read_alone_equal_those_of_the_whole_record() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(STATE_FILE), failing_record()).unwrap();
        let alone = Previous::at(Some(dir.path())).failing_since();
        let whole = Previous::at(Some(dir.path()));
        assert!(whole.get().is_some(), "the test record parses whole");
        assert_eq!(alone, whole.failing_since());
        let key = |d: &str, a: &str| (Some(d.to_string()), Some(a.to_string()));
        assert_eq!(
            alone,
            HashMap::from([
                (
                    key("mlx5_0", "0000:01:00.0"),
                    "2026-01-01T00:00:00Z".to_string()
                ),
                (
                    key("mlx5_2", "0000:01:00.2"),
                    "2026-02-02T00:00:00Z".to_string()
                ),
            ])
        );
    }

    /// A record that cannot be read field by field (cut short, or no
    /// record at all) gives no times, as the whole reader says.
    #[test]
    fn a_damaged_previous_record_gives_no_failed_links() {
        let dir = tempfile::tempdir().unwrap();
        let text = failing_record();
        fs::write(dir.path().join(STATE_FILE), &text[..text.len() / 2]).unwrap();
        assert!(Previous::at(Some(dir.path())).failing_since().is_empty());
        fs::write(
            dir.path().join(STATE_FILE),
            "{\"spec\": {\"interfaces\": []}}",
        )
        .unwrap();
        assert!(Previous::at(Some(dir.path())).failing_since().is_empty());
        assert!(Previous::at(None).failing_since().is_empty());
    }

    /// A producer that writes `text` in pieces of `piece` bytes, as a
    /// serializer does, so comparisons cross the reader's buffer edges.
    fn pieces(text: &[u8], piece: usize) -> impl Fn(&mut dyn Write) -> std::io::Result<()> + '_ {
        move |w| text.chunks(piece).try_for_each(|c| w.write_all(c))
    }

    /// The block-by-block comparison says "same" for the same bytes only:
    /// not for one byte changed past the first block, a file shorter or
    /// longer, a folder or a FIFO (which must not be waited on).
    #[test]
    fn a_file_holds_the_bytes_only_when_every_block_is_equal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spec.json");
        let bytes: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        fs::write(&path, &bytes).unwrap();
        assert!(file_holds(&path, &bytes));
        let mut changed = bytes.clone();
        changed[150_000] ^= 1;
        assert!(!file_holds(&path, &changed));
        assert!(!file_holds(&path, &bytes[..bytes.len() - 1]));
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(!file_holds(&path, &longer));
        assert!(!file_holds(&dir.path().join("empty"), b""), "absent");
        fs::write(dir.path().join("empty"), b"").unwrap();
        assert!(file_holds(&dir.path().join("empty"), b""));
        assert!(!file_holds(dir.path(), b""));
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path; mkfifo only creates the node.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(!file_holds(&fifo, b""));
    }

    #[test]
    fn the_same_bytes_streamed_leave_the_file_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        // Past the 64 KiB read buffer, so the comparison reads it in parts.
        let text: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        assert!(write_streamed_if_changed(dir.path(), "f", pieces(&text, 7)).unwrap());
        let before = fs::metadata(dir.path().join("f")).unwrap();
        assert!(!write_streamed_if_changed(dir.path(), "f", pieces(&text, 4093)).unwrap());
        let after = fs::metadata(dir.path().join("f")).unwrap();
        assert_eq!(before.ino(), after.ino(), "the file was replaced");
        assert_eq!(fs::read(dir.path().join("f")).unwrap(), text);
    }

    #[test]
    fn any_difference_streamed_replaces_the_file_with_the_new_bytes() {
        let text: Vec<u8> = (0..100_000u32).map(|i| (i % 13) as u8 + b'a').collect();
        let mut changed = text.clone();
        changed[70_000] = b'!';
        let cases: [(&str, &[u8]); 4] = [
            ("one byte changed", &changed),
            ("shorter: a prefix of the file", &text[..99_999]),
            (
                "longer: the file is a prefix of it",
                &[&text[..], b"x"].concat(),
            ),
            ("empty", b""),
        ];
        for (what, new) in cases {
            let dir = tempfile::tempdir().unwrap();
            fs::write(dir.path().join("f"), &text).unwrap();
            assert!(
                write_streamed_if_changed(dir.path(), "f", pieces(new, 1000)).unwrap(),
                "{what}: not written"
            );
            assert_eq!(fs::read(dir.path().join("f")).unwrap(), new, "{what}");
        }
    }

    #[test]
    fn a_node_past_what_the_limit_holds_is_refused_naming_both() {
        let limit = 64u64 << 20;
        // The measured node fits; the largest supported one just does.
        assert!(pass_fits(10_000, limit).1);
        assert!(pass_fits(10_800, limit).1);
        assert!(!pass_fits(10_900, limit).1);
        let dir = tempfile::tempdir().unwrap();
        let net = dir.path().join("sys/class/net");
        fs::create_dir_all(&net).unwrap();
        for i in 0..12 {
            fs::write(net.join(format!("eth{i}")), "").unwrap();
        }
        let cgroup = dir.path().join("memory.max");
        let v1 = dir.path().join("memory.limit_in_bytes");
        let files = [cgroup.as_path(), v1.as_path()];
        let sys = dir.path().join("sys");
        // 12 interfaces need 18 MiB and a little: 90% of 24 MiB holds them, of 16 not.
        fs::write(&cgroup, format!("{}\n", 24u64 << 20)).unwrap();
        assert!(check_node_size(&sys, &files).is_ok());
        fs::write(&cgroup, format!("{}\n", 16u64 << 20)).unwrap();
        let err = check_node_size(&sys, &files).unwrap_err().to_string();
        assert!(
            err.starts_with("12 network interfaces under ")
                && err.contains("the 16 MiB memory limit")
                && err.contains("memory.max"),
            "{err}"
        );
        fs::write(&cgroup, "max\n").unwrap();
        assert!(check_node_size(&sys, &files).is_ok());
        // cgroup v1: read where v2's file is absent, and named.
        fs::remove_file(&cgroup).unwrap();
        assert!(check_node_size(&sys, &files).is_ok(), "neither file");
        fs::write(&v1, format!("{}\n", 16u64 << 20)).unwrap();
        let err = check_node_size(&sys, &files).unwrap_err().to_string();
        assert!(err.contains("memory.limit_in_bytes"), "{err}");
        // v1's "no limit" is the largest page-aligned count, not `max`.
        fs::write(&v1, "9223372036854771712\n").unwrap();
        assert!(check_node_size(&sys, &files).is_ok());
    }

    #[test]
    fn a_folder_in_the_files_place_is_not_read_as_the_old_bytes() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("f")).unwrap();
        let err = write_streamed_if_changed(dir.path(), "f", pieces(b"x", 1)).unwrap_err();
        assert!(
            matches!(
                err,
                PublishError::Io {
                    step: "renaming into",
                    ..
                }
            ),
            "{err:?}"
        );
    }
}
