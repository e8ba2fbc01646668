//! The `nodefabric` command line: argument parsing and the thin glue that
//! calls the library. Kept in the library so tests and examples can drive the
//! exact parser the binary uses.

use crate::labels::DEFAULT_NAMESPACE;
use crate::pass::{self, Pass};
use crate::{cdi, fabric, nfd, preflight, publish, rails};
use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;
use tracing::{error, info};

/// Discovers a node's RDMA and accelerator fabric from sysfs and publishes it
/// for Kubernetes: NFD labels, CDI specs, a rail record.
///
/// Every command reads the same pass over the sysfs tree, so `preflight`
/// shows exactly what `publish` would write.
#[derive(Debug, Clone, Parser)]
#[command(name = "nodefabric", version, propagate_version = true)]
pub struct Cli {
    /// The sysfs tree to read: the live /sys, a copy of one, or a
    /// `nodefabric capture` archive (.tar.gz), unpacked to a temp folder.
    #[arg(long, global = true, default_value = "/sys", env = "NODEFABRIC_SYSFS_ROOT", value_name = "DIR")]
    pub sysfs_root: PathBuf,

    /// Label key namespace (the part before `/`). nfd-master must allow it:
    /// see nfd-hooks/README.md.
    #[arg(long, global = true, default_value = DEFAULT_NAMESPACE, value_name = "NS", value_parser = parse_namespace)]
    pub label_namespace: String,

    /// The nvidia-smi to run instead of the one on PATH: `-q` for the NVLink
    /// fabric, `--query-gpu` and `topo -m` for rails.
    #[arg(long, global = true, value_name = "PATH", conflicts_with = "nvidia_smi_q")]
    pub nvidia_smi: Option<PathBuf>,

    /// NVIDIA fabric: read NVML from this library only (by default NVML is
    /// tried from libnvidia-ml.so.1 and, where it is absent, `nvidia-smi -q`).
    #[arg(long, global = true, value_name = "PATH", conflicts_with_all = ["nvidia_smi", "nvidia_smi_q"])]
    pub nvml_lib: Option<PathBuf>,

    /// NVIDIA fabric: read a saved `nvidia-smi -q` text instead of running it.
    #[arg(long, global = true, value_name = "FILE")]
    pub nvidia_smi_q: Option<PathBuf>,

    /// Ascend fabric: the super-pod JSON file (see README, "Scale-up fabric").
    #[arg(long, global = true, value_name = "FILE")]
    pub ascend_fabric: Option<PathBuf>,

    /// Log filter for stderr: error, warn, info, debug or trace.
    #[arg(long, global = true, default_value = "warn", value_name = "LEVEL")]
    pub log_level: tracing::Level,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Kept here for callers that name it through the command line module.
pub use crate::names::parse_namespace;

/// The subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Print the node record as JSON (`.spec.interfaces[]`, `.spec.groups[]`).
    Inventory(StateArgs),
    /// Print the NFD feature-file label lines (what `publish` writes).
    Features(StateArgs),
    /// Print a table of every RDMA endpoint and the labels that would be
    /// published. Exit 0 when the node would carry rdma.capable, 1 when not,
    /// 2 on an error.
    Preflight(StateArgs),
    /// Print the CDI specs, one per resource family, as a JSON object keyed by
    /// the file name `publish` gives each. Fails, naming every place checked,
    /// when an endpoint's verbs device cannot be resolved.
    Cdi(StateArgs),
    /// Print the GPU-to-NIC rail record: for every GPU and every network rail,
    /// the NICs tied at the closest PCIe path class (PIX < PXB < PHB < NODE < SYS).
    /// Rails come from the host's LLDP neighbours; path classes from
    /// `nvidia-smi topo -m` where present, else from the PCIe walk. Fails,
    /// naming the rail and GPU, on an unknown path class or a rail with no
    /// qualified NIC.
    #[command(after_help = "Example:\n  nodefabric rails --interface-regex '^eth_r([0-9]+)_p[0-9]+$' --rail-id 'rail$1'\n  nodefabric rails --rails-config values.yaml --lldp-json saved-lldpctl.json --sysfs-paths")]
    Rails(RailsCommand),
    /// Write the feature file and CDI specs atomically, once or every --interval.
    Publish(PublishArgs),
    /// Pack exactly the sysfs files and links one discovery pass reads (and
    /// nothing else of the host) into a .tar.gz that --sysfs-root reads
    /// back: attach it to a bug report; maintainers replay it with
    /// `nodefabric --sysfs-root FILE.tar.gz inventory`.
    Capture(CaptureArgs),
}

/// Options of `capture`.
#[derive(Debug, Clone, Args)]
pub struct CaptureArgs {
    /// The archive to write (atomically); `-` writes it to stdout.
    #[arg(long, value_name = "FILE.tar.gz")]
    pub out: PathBuf,
}

/// Options of `rails`.
#[derive(Debug, Clone, Args)]
pub struct RailsCommand {
    /// Folder holding the last published record; read only by this command.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,

    /// The rail inputs.
    #[command(flatten)]
    pub rails: RailArgs,
}

/// Where rails and GPU paths come from (`rails`, and `publish --rails-file`).
#[derive(Debug, Args, Clone, Default)]
pub struct RailArgs {
    /// YAML rail configuration: the Helm `gpuNicRailMapping` block or a whole
    /// values file holding it (see README, "Rails"); flags win over it.
    #[arg(long, value_name = "FILE")]
    pub rails_config: Option<PathBuf>,

    /// Rail interfaces: a regular expression on interface names whose capture
    /// groups feed --rail-id, e.g. '^eth_r([0-9]+)_p[0-9]+$'.
    #[arg(long, value_name = "RE")]
    pub interface_regex: Option<String>,

    /// Rail ID template with $1-style capture references, e.g. 'rail$1'.
    #[arg(long, value_name = "TEMPLATE")]
    pub rail_id: Option<String>,

    /// Run `lldpctl -u PATH -f json` against this lldpd socket (default: lldpd's own).
    #[arg(long, value_name = "PATH", conflicts_with = "lldp_json")]
    pub lldp_socket: Option<PathBuf>,

    /// Read a saved `lldpctl -f json` output instead of running lldpctl.
    #[arg(long, value_name = "FILE")]
    pub lldp_json: Option<PathBuf>,

    /// Read a saved `nvidia-smi topo -m` instead of running nvidia-smi (needs --gpu-query-file).
    #[arg(long, value_name = "FILE", requires = "gpu_query_file")]
    pub topo_file: Option<PathBuf>,

    /// Read a saved `nvidia-smi --query-gpu=index,uuid,pci.bus_id --format=csv,noheader` (needs --topo-file).
    #[arg(long, value_name = "FILE", requires = "topo_file")]
    pub gpu_query_file: Option<PathBuf>,

    /// Take every GPU's paths from the PCIe walk, even where nvidia-smi exists.
    #[arg(long, conflicts_with = "topo_file")]
    pub sysfs_paths: bool,

    /// The Node object's UID, recorded so a cluster publisher can tell a
    /// replaced node that reuses a name. In a cluster (KUBERNETES_SERVICE_HOST
    /// set) with --node-name, it is read from the Node object instead.
    #[arg(long, value_name = "UID", env = "NODEFABRIC_NODE_UID", default_value = "")]
    pub node_uid: String,

    /// This node's name, for reading its UID in-cluster (set NODE_NAME from
    /// the downward API's spec.nodeName).
    #[arg(long, value_name = "NAME", env = "NODE_NAME")]
    pub node_name: Option<String>,

    /// The service-account folder (token, ca.crt) for the in-cluster Node read.
    #[arg(long, value_name = "DIR", default_value = rails::node::SERVICE_ACCOUNT_DIR)]
    pub service_account_dir: PathBuf,
}

impl RailArgs {
    /// The rail options, flags over the config file.
    pub fn options(&self, nvidia_smi: Option<&Path>) -> Result<rails::Options> {
        let config = self.rails_config.as_deref().map(rails::config::RailConfig::read).transpose()?;
        if let Some(c) = &config {
            if !c.enabled {
                anyhow::bail!("{}: gpuNicRailMapping is disabled (enabled: false)", self.rails_config.as_ref().unwrap().display());
            }
        }
        let lldp_cfg = config.as_ref().and_then(|c| c.rail_source.host_lldp.clone());
        let regex = self
            .interface_regex
            .clone()
            .or_else(|| lldp_cfg.as_ref().map(|l| l.interface_regex.clone()))
            .context("rails need --interface-regex (or railSource.hostLLDP.interfaceRegex in --rails-config)")?;
        let rail_id = self
            .rail_id
            .clone()
            .or_else(|| lldp_cfg.as_ref().map(|l| l.rail_id.clone()))
            .context("rails need --rail-id (or railSource.hostLLDP.railID in --rails-config)")?;
        let interface_regex = regex::Regex::new(&regex).with_context(|| format!("--interface-regex {regex:?}"))?;
        let lldp = match &self.lldp_json {
            Some(f) => rails::LldpInput::File(f.clone()),
            None => rails::LldpInput::Lldpctl(self.lldp_socket.clone()),
        };
        let nvidia = match (&self.topo_file, &self.gpu_query_file) {
            _ if self.sysfs_paths => rails::NvidiaInput::Sysfs,
            (Some(topo), Some(query)) => rails::NvidiaInput::Files { query: query.clone(), topo: topo.clone() },
            _ => rails::NvidiaInput::Command(nvidia_smi.map(Path::to_path_buf)),
        };
        let node_uid = match (&self.node_name, rails::node::api_server_from_env()) {
            _ if !self.node_uid.is_empty() => self.node_uid.clone(),
            (Some(name), Some(server)) => rails::node::uid(&server, &self.service_account_dir, name)
                .with_context(|| format!("reading Node {name}'s UID"))?,
            _ => String::new(),
        };
        Ok(rails::Options { lldp, interface_regex, rail_id, nvidia, node_uid })
    }
}

/// Where the previous record lives (for stable `firstSeen` times).
#[derive(Debug, Clone, Args)]
pub struct StateArgs {
    /// Folder holding the last published record; read only by this command.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
}

/// Options of `publish`.
#[derive(Debug, Clone, Args)]
pub struct PublishArgs {
    /// NFD's features.d folder; the file written there is `nodefabric`.
    #[arg(long, value_name = "DIR", default_value = "/etc/kubernetes/node-feature-discovery/features.d")]
    pub features_dir: PathBuf,

    /// CDI spec folder; this tool owns the files named nodefabric-*.json there.
    #[arg(long, value_name = "DIR", default_value = "/var/run/cdi")]
    pub cdi_dir: PathBuf,

    /// Folder for the last published record (keeps `firstSeen` stable).
    #[arg(long, value_name = "DIR", default_value = "/var/lib/nodefabric")]
    pub state_dir: PathBuf,

    /// Publish again every DURATION (e.g. 60s) instead of once.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub interval: Option<Duration>,

    /// Label lifetime written as NFD's expiry-time directive, so labels lapse
    /// if the publisher dies. Default: 3 × --interval; none for a one-shot run.
    /// 0s disables it.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub expiry: Option<Duration>,

    /// Also write the rail record (as `rails` prints it) to FILE, atomically.
    /// When it cannot be built the previous file is kept and the pass fails.
    #[arg(long, value_name = "FILE")]
    pub rails_file: Option<PathBuf>,

    /// The rail inputs, used with --rails-file.
    #[command(flatten)]
    pub rails: RailArgs,
}

impl PublishArgs {
    /// The expiry lifetime in force, from --expiry or the --interval default.
    pub fn ttl(&self) -> Option<Duration> {
        match (self.expiry, self.interval) {
            (Some(d), _) if d.is_zero() => None,
            (Some(d), _) => Some(d),
            (None, Some(i)) => Some(i * 3),
            (None, None) => None,
        }
    }
}

/// Parses `std::env::args` and runs; the binary's whole `main`.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    crate::logging::init(cli.log_level);
    run(&cli)
}

/// Runs a parsed command line and maps the outcome to an exit status.
pub fn run(cli: &Cli) -> ExitCode {
    let preflight = matches!(cli.command, Command::Preflight(_));
    match execute_on_tree(cli) {
        Ok(code) => code,
        Err(e) => {
            error!("{e:#}");
            eprintln!("nodefabric: error: {e:#}");
            ExitCode::from(if preflight { 2 } else { 1 })
        }
    }
}

impl Cli {
    /// The fabric inputs named on the command line.
    pub fn fabric_sources(&self) -> fabric::Sources {
        let nvidia = match (&self.nvidia_smi_q, &self.nvidia_smi, &self.nvml_lib) {
            (Some(f), _, _) => fabric::NvidiaSource::File(f.clone()),
            (None, Some(b), _) => fabric::NvidiaSource::Command(b.clone()),
            (None, None, Some(lib)) => fabric::NvidiaSource::Nvml(lib.clone()),
            (None, None, None) => fabric::NvidiaSource::Auto,
        };
        fabric::Sources { nvidia, ascend: self.ascend_fabric.clone() }
    }
}

fn one_pass(cli: &Cli, state_dir: Option<&Path>) -> Result<Pass> {
    let now = pass::now()?;
    pass::run(&cli.sysfs_root, state_dir, now, &cli.fabric_sources())
        .with_context(|| format!("reading sysfs tree {}", cli.sysfs_root.display()))
}

/// Executes on the tree `--sysfs-root` names; a capture archive is unpacked
/// into a temporary folder that lives for this run only.
fn execute_on_tree(cli: &Cli) -> Result<ExitCode> {
    if !crate::capture::is_archive(&cli.sysfs_root) {
        return execute(cli);
    }
    let (_replay, tree) = crate::capture::unpack(&cli.sysfs_root)?;
    execute(&Cli { sysfs_root: tree, ..cli.clone() })
}

fn execute(cli: &Cli) -> Result<ExitCode> {
    let ns = &cli.label_namespace;
    match &cli.command {
        Command::Inventory(s) => {
            let pass = one_pass(cli, s.state_dir.as_deref())?;
            println!("{}", serde_json::to_string_pretty(&pass.record)?);
        }
        Command::Features(s) => {
            let pass = one_pass(cli, s.state_dir.as_deref())?;
            print!("{}", nfd::label_lines(&pass.labels, ns));
        }
        Command::Preflight(s) => {
            let pass = one_pass(cli, s.state_dir.as_deref())?;
            print!("{}", preflight::report(&pass, ns));
            let capable = pass.labels.values.contains_key("rdma.capable");
            return Ok(ExitCode::from(if capable { 0 } else { 1 }));
        }
        Command::Cdi(s) => {
            let pass = one_pass(cli, s.state_dir.as_deref())?;
            let mut specs = serde_json::Map::new();
            for family in cdi::Family::ALL {
                if let Some(spec) = cdi::spec(&pass.record, family)? {
                    specs.insert(family.file_name().into(), serde_json::to_value(spec)?);
                }
            }
            println!("{}", serde_json::to_string_pretty(&specs)?);
        }
        Command::Rails(r) => {
            let options = r.rails.options(cli.nvidia_smi.as_deref())?;
            let pass = one_pass(cli, r.state_dir.as_deref())?;
            let record = rail_record(cli, &pass, &options)?;
            std::io::Write::write_all(&mut std::io::stdout(), &rails::to_bytes(&record))?;
        }
        Command::Publish(p) => return publish_loop(cli, p),
        Command::Capture(c) => capture(cli, c)?,
    }
    Ok(ExitCode::SUCCESS)
}

fn publish_loop(cli: &Cli, args: &PublishArgs) -> Result<ExitCode> {
    let Some(interval) = args.interval else {
        publish_once(cli, args)?;
        return Ok(ExitCode::SUCCESS);
    };
    loop {
        // A failed pass keeps everything previously published; the sidecar
        // carries on and tries again next interval.
        if let Err(e) = publish_once(cli, args) {
            error!("publish pass failed, previous output kept: {e:#}");
        }
        std::thread::sleep(interval);
    }
}

/// One publish pass: discover, then write each artifact only if it changed.
pub fn publish_once(cli: &Cli, args: &PublishArgs) -> Result<()> {
    let now = pass::now()?;
    let state_dir = args.state_dir.as_path();
    let pass = pass::run(&cli.sysfs_root, Some(state_dir), now, &cli.fabric_sources())
        .with_context(|| format!("reading sysfs tree {}; nothing published", cli.sysfs_root.display()))?;

    let ttl = args.ttl();
    let text = nfd::render_checked(&pass.labels, &cli.label_namespace, ttl.map(|t| now + t))
        .context("previous feature file kept")?;
    let dir = &args.features_dir;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let existing = std::fs::read_to_string(dir.join(nfd::FEATURE_FILE)).ok();
    if nfd::needs_rewrite(existing.as_deref(), &text, now, ttl) {
        let path = publish::write_atomic(dir, nfd::FEATURE_FILE, text.as_bytes())?;
        info!("wrote {}", path.display());
    }

    // The record is saved even when a CDI family fails, so firstSeen stays
    // stable; the failure is still reported through the exit status.
    let cdi = publish::publish_cdi(&args.cdi_dir, &pass.record);
    std::fs::create_dir_all(state_dir).with_context(|| format!("creating {}", state_dir.display()))?;
    let mut json = serde_json::to_string_pretty(&pass.record)?;
    json.push('\n');
    publish::write_if_changed(state_dir, publish::STATE_RECORD, json.as_bytes())?;
    let rails = match &args.rails_file {
        Some(file) => publish_rails(cli, &pass, &args.rails, file),
        None => Ok(()),
    };
    cdi.and(rails)
}

/// Runs one pass on a recording tree and packs what it read.
fn capture(cli: &Cli, args: &CaptureArgs) -> Result<()> {
    let root = crate::sysfs::SysRoot::recording(&cli.sysfs_root)
        .with_context(|| format!("opening sysfs tree {}", cli.sysfs_root.display()))?;
    pass::run_on(&root, None, pass::now()?, &cli.fabric_sources())
        .with_context(|| format!("reading sysfs tree {}", cli.sysfs_root.display()))?;
    let recorded = root.recorded();
    let bytes = crate::capture::pack(&recorded)?;
    if args.out.as_os_str() == "-" {
        std::io::Write::write_all(&mut std::io::stdout(), &bytes)?;
        return Ok(());
    }
    let (dir, name) = folder_and_name(&args.out, "--out")?;
    let path = publish::write_atomic(dir, name, &bytes)?;
    eprintln!("captured {} entries into {} ({} bytes)", recorded.len(), path.display(), bytes.len());
    Ok(())
}

/// Splits an output file given with `flag` into the folder the atomic write
/// works in (`.` for a bare name) and the file name.
fn folder_and_name<'a>(file: &'a Path, flag: &str) -> Result<(&'a Path, &'a str)> {
    let dir = file.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = file.file_name().and_then(|n| n.to_str()).with_context(|| format!("{flag} {} has no file name", file.display()))?;
    Ok((dir, name))
}

/// Builds the rail record from a pass.
fn rail_record(cli: &Cli, pass: &Pass, options: &rails::Options) -> Result<rails::RailRecord> {
    let root = crate::sysfs::SysRoot::new(&cli.sysfs_root)?;
    rails::build(&root, &pass.record, options)
}

/// Writes the rail record to `file` if it changed; on failure the previous file stays.
fn publish_rails(cli: &Cli, pass: &Pass, args: &RailArgs, file: &Path) -> Result<()> {
    let record = args
        .options(cli.nvidia_smi.as_deref())
        .and_then(|o| rail_record(cli, pass, &o))
        .with_context(|| format!("rail record not built; previous {} kept", file.display()))?;
    let (dir, name) = folder_and_name(file, "--rails-file")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    publish::write_if_changed(dir, name, &rails::to_bytes(&record))?;
    Ok(())
}
