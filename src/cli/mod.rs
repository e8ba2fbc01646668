//! The `nodefabric` command line: argument parsing and the thin glue that
//! calls the library. Kept in the library so tests and examples can drive the
//! exact parser the binary uses.

use crate::labels::DEFAULT_NAMESPACE;
use crate::pass::{self, Pass};
use crate::{cdi, fabric, hook, nfd, preflight};
use anyhow::{Context, Result};
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use output::Format;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;
mod capture;
pub mod cluster_args;
pub mod forward;
pub mod full;
mod hook_args;
pub mod kubectl;
pub mod output;
mod publish;
mod rails;
mod topo;

pub use capture::CaptureArgs;
pub use cluster_args::{BrokerArgs, ObserveArgs, RecordForm};
pub use publish::{publish_once, PublishArgs};
pub use rails::{RailArgs, RailInputArgs, RailsCommand};
pub use topo::TopoArgs;

/// Discovers a node's RDMA and accelerator fabric from sysfs and publishes it
/// for Kubernetes: NFD labels, CDI specs, a rail record.
///
/// Every command reads the same pass over the sysfs tree, so `preflight`
/// shows exactly what `publish` would write.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "nodefabric",
    version = crate::VERSION,
    propagate_version = true,
    after_help = BARE_HELP
)]
pub struct Cli {
    /// The sysfs tree to read: the live /sys, a copy of one, or a
    /// `nodefabric capture` archive (.tar.gz), unpacked to a temp folder.
    #[arg(
        long,
        global = true,
        default_value = "/sys",
        env = SYSFS_ROOT_ENV,
        value_name = "DIR"
    )]
    pub sysfs_root: PathBuf,

    /// Replaying a capture: refuse an archive of more entries than this.
    #[arg(long, global = true, value_name = "N", default_value_t = crate::capture::limits::DEFAULT_MAX_ENTRIES, value_parser = crate::capture::limits::parse_max_entries)]
    pub replay_max_entries: u64,

    /// Replaying a capture: refuse an archive that unpacks to more bytes
    /// than this (a number, optionally with B, KiB, MiB or GiB).
    #[arg(long, global = true, value_name = "SIZE", default_value = DEFAULT_REPLAY_MAX_BYTES, value_parser = crate::capture::limits::parse_max_bytes)]
    pub replay_max_bytes: u64,

    /// Label key namespace (the part before `/`). nfd-master must allow it:
    /// see nfd-hooks/README.md.
    #[arg(long, global = true, default_value = DEFAULT_NAMESPACE, value_name = "NS", value_parser = parse_namespace)]
    pub label_namespace: String,

    /// The nvidia-smi to run instead of the one on PATH: `-q` for the NVLink
    /// fabric, `--query-gpu` and `topo -m` for rails.
    #[arg(
        long,
        global = true,
        value_name = "PATH",
        conflicts_with = "nvidia_smi_q"
    )]
    pub nvidia_smi: Option<PathBuf>,

    /// NVIDIA fabric: read NVML from this library only (by default NVML is
    /// tried from libnvidia-ml.so.1 and, where it is absent, `nvidia-smi -q`;
    /// neither is asked by default for a tree that is not a mounted sysfs,
    /// which is another machine's).
    #[arg(long, global = true, value_name = "PATH", conflicts_with_all = ["nvidia_smi", "nvidia_smi_q"])]
    pub nvml_lib: Option<PathBuf>,

    /// NVIDIA fabric: read a saved `nvidia-smi -q` text instead of running it.
    #[arg(long, global = true, value_name = "FILE")]
    pub nvidia_smi_q: Option<PathBuf>,

    /// Ascend fabric: the super-pod JSON file (see docs/record-and-labels.md, "Scale-up fabric").
    #[arg(long, global = true, value_name = "FILE")]
    pub ascend_fabric: Option<PathBuf>,

    /// How long a host tool (nvidia-smi, lldpctl) may run before it is killed,
    /// and a piped rails input (a shell's <(…)) may take to be written whole;
    /// each tool and each input has its own. For the fabric a tool's answer
    /// then counts as unreadable and the previous one is kept; a rail pass
    /// fails, naming the tool or the input.
    #[arg(long, global = true, default_value = DEFAULT_TOOL_TIMEOUT, value_name = "DURATION", value_parser = parse_tool_timeout)]
    pub tool_timeout: Duration,

    /// Log filter for stderr: error, warn, info, debug or trace.
    #[arg(long, global = true, default_value = DEFAULT_LOG_LEVEL, value_name = "LEVEL")]
    pub log_level: tracing::Level,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,

    /// The vendor answers of a replayed capture (never a flag: set when
    /// `--sysfs-root` is an archive holding them).
    #[arg(skip)]
    pub replayed_answers: Option<fabric::answers::Answers>,

    /// The rail answers of a replayed capture (never a flag: set when
    /// `--sysfs-root` is an archive holding them).
    #[arg(skip)]
    pub replayed_rails: Option<crate::rails::RailAnswers>,

    /// The Kubernetes API and NVML, in `nodefabric-full` only (never a
    /// flag: its `main` sets it; see [`full`]).
    #[arg(skip)]
    pub full: Option<&'static dyn full::Full>,
}

/// The variable that names the sysfs tree when `--sysfs-root` does not.
const SYSFS_ROOT_ENV: &str = "NODEFABRIC_SYSFS_ROOT";
/// `--replay-max-bytes` when not given.
const DEFAULT_REPLAY_MAX_BYTES: &str = "256MiB";
/// `--tool-timeout` when not given.
const DEFAULT_TOOL_TIMEOUT: &str = "30s";
/// `--log-level` when not given.
const DEFAULT_LOG_LEVEL: &str = "warn";

/// What `--help` says of a run with no arguments at all, the way nfd-worker
/// runs a `source.d` hook.
const BARE_HELP: &str = "With no arguments at all, nodefabric runs `features`: the NFD label lines on stdout, nothing written, exit 0 unless the tree cannot be read. That is how NFD (v0.12-v0.16) runs it as a source.d hook. It reads NODEFABRIC_SYSFS_ROOT when set, else /host-sys (where nfd-worker mounts the host's sysfs) when that exists, else /sys; the other NODEFABRIC_* variables apply as usual. See nfd-hooks/README.md.";

/// Kept here for callers that name it through the command line module.
pub use crate::names::parse_namespace;
use crate::names::{duration_in, DurationError};

fn parse_tool_timeout(s: &str) -> Result<Duration, DurationError> {
    duration_in(s, Duration::from_secs(1), Duration::from_secs(3600))
}

/// The subcommands. Each one's flags are built only when it is the one
/// invoked (`defer`): NFD runs `features` every minute, and building every
/// command's flags (rails, publish and observe have dozens) cost a quarter
/// of that run's instructions.
#[derive(Debug, Clone, Subcommand)]
#[command(defer = true)]
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
    /// Rails come from the host's LLDP neighbours (or, with --rail-source
    /// interface-name, from port names alone); path classes from
    /// `nvidia-smi topo -m` where present, else from the PCIe walk. Fails,
    /// naming the rail and GPU, on an unknown path class or a rail with no
    /// qualified NIC.
    #[command(
        after_help = "Example:\n  nodefabric rails --interface-regex '^eth_r([0-9]+)_p[0-9]+$' --rail-id 'rail$1'\n  nodefabric rails --rails-config values.yaml --lldp-json saved-lldpctl.json --sysfs-paths\n  nodefabric rails --rail-source interface-name --interface-regex '^mlx5_([0-9]+)$' --rail-id 'rail$1'"
    )]
    Rails(RailsCommand),
    /// Print how far each accelerator sits from each RDMA NIC on the PCIe
    /// tree (`nvidia-smi topo -m`'s question, for every vendor, from sysfs):
    /// one row per accelerator, one column per NIC (VFs counted in their
    /// PF), each cell the path class the rdma.distance label uses (PIX, PXB,
    /// PHB, NODE, SYS, UNK); then each NIC's NUMA node, link verdict and
    /// rails. `-o dot` or `-o svg` draws the tree from the host bridges down.
    #[command(
        after_help = "Examples:\n  nodefabric topo\n  nodefabric --sysfs-root node.tar.gz topo      # a capture from a bug report\n  nodefabric topo --rails-file /var/lib/nodefabric/rails.json -o svg > topo.svg\n  nodefabric topo -o dot | dot -Tpng > topo.png"
    )]
    Topo(TopoArgs),
    /// Write the feature file and CDI specs atomically, once or every --interval.
    Publish(PublishArgs),
    /// Pack exactly the sysfs files and links one discovery pass reads (and
    /// nothing else of the host), with the vendor and rail tool answers it
    /// used, into a .tar.gz that --sysfs-root reads back: attach it to a bug
    /// report; maintainers replay it with
    /// `nodefabric --sysfs-root FILE.tar.gz inventory` (or `rails …`).
    Capture(CaptureArgs),
    /// The Node Observer: create and own the shared rail ConfigMap (a
    /// controller ownerReference to --owner-deployment) and remove the
    /// records of deleted or replaced Nodes; with --rails-record
    /// custom-resource, delete the NodeRailRecords of such Nodes instead.
    /// Runs until SIGTERM (exit 0).
    #[command(
        after_help = "Examples:\n  nodefabric observe --rails-configmap nodefabric/nodefabric-rails --owner-deployment nodefabric-observer\n  nodefabric observe --rails-record custom-resource"
    )]
    Observe(ObserveArgs),
    /// Print the NodeRailRecord CustomResourceDefinition (YAML), derived
    /// from the rail record's Rust types: what `--rails-record
    /// custom-resource` writes. deploy/crds/ holds the same text.
    #[command(after_help = "Example:\n  nodefabric crd | kubectl apply -f -")]
    Crd,
    /// Install this binary as NFD's source.d hook (NFD v0.12-v0.16): copied
    /// to a hidden temp file in --dest, then renamed to `nodefabric` there,
    /// replacing a previous one, so nfd-worker never runs a partial copy.
    InstallHook(InstallHookArgs),
    /// Remove the hook `nodefabric` from --dest, so nfd-worker stops running
    /// it (its labels go at the next pass). Nothing to do when it is absent.
    RemoveHook(HookDirArgs),
}

/// The `source.d` folder the hook commands work in.
#[derive(Debug, Clone, Args)]
pub struct HookDirArgs {
    /// The host's NFD source.d folder, as mounted where this runs.
    #[arg(long, value_name = "DIR", default_value = hook::SOURCE_D)]
    pub dest: PathBuf,
}

/// Options of `install-hook`.
#[derive(Debug, Clone, Args)]
pub struct InstallHookArgs {
    /// Where to install.
    #[command(flatten)]
    pub dir: HookDirArgs,

    /// After installing, stay until SIGTERM (exit 0): the hook pod's one
    /// process, whose preStop runs `remove-hook`.
    #[arg(long)]
    pub wait: bool,
}

/// Where the previous record lives (for stable `firstSeen` times).
#[derive(Debug, Clone, Args)]
pub struct StateArgs {
    /// Folder holding the last published record; read only by this command.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,

    /// The output format (see each command's formats below).
    #[command(flatten)]
    pub output: output::OutputArg,
}

/// `nodefabric-full`'s whole `main`: every command, with the Kubernetes
/// API and NVML linked in.
pub fn main() -> ExitCode {
    let cli = Cli {
        full: Some(&full::LINKED),
        ..parse()
    };
    crate::logging::init(cli.log_level);
    run(&cli)
}

/// `nodefabric`'s whole `main`: the same commands, run here when they need
/// neither the Kubernetes API nor NVML, else handed to `nodefabric-full`.
pub fn main_lean() -> ExitCode {
    let cli = parse();
    if let Some(why) = forward::needed(&cli) {
        // Run as NFD's hook, alone in source.d, this binary reads the
        // fabric without NVML (nvidia-smi, where there is one) rather than
        // fail a pass and so lose every label.
        let bare_alone = std::env::args_os().len() <= 1 && forward::find_full().is_none();
        if !bare_alone {
            return forward::to_full(why);
        }
    }
    crate::logging::init(cli.log_level);
    run(&cli)
}

/// Parses `std::env::args`; a misuse exits 2 with clap's message. No
/// arguments at all is the NFD hook's run: see [`bare`].
fn parse() -> Cli {
    // The hook's own command lines skip clap, whose tables cost a fifth of
    // a pass on a small node (see [`hook_args`]).
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    if let Some(cli) = hook_args::parse(&args, std::env::var_os(SYSFS_ROOT_ENV)) {
        if args.is_empty() {
            tell_terminal_bare(&cli);
        }
        return cli;
    }
    if args.is_empty() {
        return bare();
    }
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Err(e) = require_folders_off_sys(&cli, &matches) {
        e.exit();
    }
    cli
}

/// The command line of a run with no arguments: `features`, as nfd-worker
/// runs a `source.d` hook (no arguments, its own environment), on
/// `NODEFABRIC_SYSFS_ROOT` when set, else on [`hook::bare_sysfs_root`].
fn bare() -> Cli {
    let matches = Cli::command().get_matches_from(["nodefabric", "features"]);
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if matches.value_source("sysfs_root") == Some(clap::parser::ValueSource::DefaultValue) {
        cli.sysfs_root = hook::bare_sysfs_root();
    }
    tell_terminal_bare(&cli);
    cli
}

/// Says at a terminal what a run with no arguments did. Only a person at a
/// terminal is told: nfd-worker logs every stderr line of a hook at every
/// pass (each minute, on every node).
fn tell_terminal_bare(cli: &Cli) {
    if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        eprintln!(
            "nodefabric: no command given, so this ran `features` on {} (what NFD runs as a source.d hook) and wrote nothing; `nodefabric --help` lists the commands",
            cli.sysfs_root.display()
        );
    }
}

/// `publish` on a tree other than `/sys` (a capture, a copy, a test tree)
/// must name every folder it writes: the defaults are this host's live NFD,
/// CDI and state folders, and a replay must never write into them by accident.
fn require_folders_off_sys(cli: &Cli, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
    let Some(("publish", sub)) = matches.subcommand() else {
        return Ok(());
    };
    if cli
        .sysfs_root
        .components()
        .eq(Path::new("/sys").components())
    {
        return Ok(());
    }
    let defaulted: Vec<String> = ["features_dir", "cdi_dir", "state_dir"]
        .into_iter()
        .filter(|id| sub.value_source(id) == Some(clap::parser::ValueSource::DefaultValue))
        .map(|id| format!("--{}", id.replace('_', "-")))
        .collect();
    if defaulted.is_empty() {
        return Ok(());
    }
    Err(Cli::command().error(
        clap::error::ErrorKind::MissingRequiredArgument,
        format!(
            "--sysfs-root {} is not this host's /sys: give {} explicitly (the defaults are this host's live folders)",
            cli.sysfs_root.display(),
            defaulted.join(", ")
        ),
    ))
}

/// Runs a parsed command line and maps the outcome to an exit status.
pub fn run(cli: &Cli) -> ExitCode {
    let preflight = matches!(cli.command, Command::Preflight(_));
    match execute_on_tree(cli) {
        Ok(code) => code,
        // A reader that stopped reading (`| head`) is not an error: the
        // output it wanted has been written, the rest is not wanted.
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            // Printed once, as the command's last word; not also as a log line.
            eprintln!("nodefabric: error: {e:#}");
            ExitCode::from(if preflight { 2 } else { 1 })
        }
    }
}

/// Writes a command's output to stdout; a closed pipe comes back as an
/// error that [`run`] recognises, instead of the panic `print!` would raise.
fn emit(bytes: impl AsRef<[u8]>) -> Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_all(bytes.as_ref())?;
    out.flush()?;
    Ok(())
}

/// True when an error comes from writing to a pipe whose reader has gone.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

impl Cli {
    /// The fabric inputs named on the command line.
    pub fn fabric_sources(&self) -> fabric::Sources {
        let nvidia = match (&self.nvidia_smi_q, &self.nvidia_smi, &self.nvml_lib) {
            (Some(f), _, _) => fabric::NvidiaSource::File(f.clone()),
            (None, Some(b), _) => fabric::NvidiaSource::Command(b.clone()),
            (None, None, Some(lib)) => fabric::NvidiaSource::Nvml(lib.clone()),
            // The host's NVML and nvidia-smi describe the host's GPUs: a
            // copied tree (not a sysfs mount) is another machine's.
            (None, None, None) if !crate::sysfs::is_mounted_sysfs(&self.sysfs_root) => {
                fabric::NvidiaSource::NotThisHost
            }
            (None, None, None) => fabric::NvidiaSource::Auto,
        };
        // A replayed capture answers with what the captured pass used, unless
        // a fabric input is named on the command line.
        let named = self.nvidia_smi.is_some()
            || self.nvidia_smi_q.is_some()
            || self.nvml_lib.is_some()
            || self.ascend_fabric.is_some();
        // Auto tries NVML only where it can work (Auto is only chosen for a
        // mounted sysfs, above, so the driver is what is left to ask); a
        // named library is always tried.
        let auto = matches!(nvidia, fabric::NvidiaSource::Auto);
        let nvml = self
            .full
            .filter(|_| !auto || nvidia_driver_loaded())
            .map(|f| f.nvml());
        fabric::Sources {
            nvidia,
            ascend: self.ascend_fabric.clone(),
            timeout: self.tool_timeout,
            replay: if named {
                None
            } else {
                self.replayed_answers.clone()
            },
            recorder: None,
            nvml,
        }
    }

    /// The parts only `nodefabric-full` links; an error naming it where
    /// this binary lacks them (the lean one forwards such commands first).
    pub fn full(&self) -> Result<&'static dyn full::Full> {
        self.full.context(
            "this needs the Kubernetes API or NVML, which only nodefabric-full links: run it instead",
        )
    }
}

/// NVML is worth loading only for this host's own sysfs (mounted at `/sys`,
/// or at `/host/sys` in a pod) on a host whose NVIDIA driver is loaded:
/// without `/dev/nvidiactl` nvmlInit fails, and a copied tree is not the
/// machine NVML would describe.
pub fn nvml_can_work(sysfs_root: &Path) -> bool {
    nvidia_driver_loaded() && crate::sysfs::is_mounted_sysfs(sysfs_root)
}

/// The NVIDIA driver's control device exists: nvmlInit fails without it.
fn nvidia_driver_loaded() -> bool {
    Path::new("/dev/nvidiactl").exists()
}

/// One discovery pass; `fabric` says whether the command's output uses the
/// scale-up fabric (and so whether vendor tools are asked at all).
fn one_pass(cli: &Cli, state_dir: Option<&Path>, fabric: bool) -> Result<Pass> {
    one_pass_on(cli, &open_tree(cli)?, state_dir, fabric)
}

/// The tree `--sysfs-root` names, opened once for a pass and the rail read after it.
fn open_tree(cli: &Cli) -> Result<crate::sysfs::SysRoot> {
    crate::sysfs::SysRoot::new(&cli.sysfs_root)
        .map_err(crate::discover::DiscoverError::from)
        .with_context(|| format!("reading sysfs tree {}", cli.sysfs_root.display()))
}

/// [`one_pass`] on an opened tree.
fn one_pass_on(
    cli: &Cli,
    root: &crate::sysfs::SysRoot,
    state_dir: Option<&Path>,
    fabric: bool,
) -> Result<Pass> {
    let now = pass::now()?;
    pass::run_on(
        root,
        state_dir,
        now,
        fabric.then(|| cli.fabric_sources()).as_ref(),
    )
    .with_context(|| format!("reading sysfs tree {}", cli.sysfs_root.display()))
}

/// Executes on the tree `--sysfs-root` names; a capture archive is unpacked
/// into a temporary folder that lives for this run only.
fn execute_on_tree(cli: &Cli) -> Result<ExitCode> {
    if !crate::capture::is_archive(&cli.sysfs_root) {
        return execute(cli);
    }
    let limits = crate::capture::Limits {
        max_entries: cli.replay_max_entries,
        max_bytes: cli.replay_max_bytes,
    };
    // Lives until the command is done; dropping it removes the folder.
    let replay = crate::capture::unpack(&cli.sysfs_root, &limits)?;
    let answers = replay
        .answers()
        .map_err(|e| anyhow::anyhow!("{}: {e}", cli.sysfs_root.display()))?;
    let rails = replay
        .rail_answers()
        .map_err(|e| anyhow::anyhow!("{}: {e}", cli.sysfs_root.display()))?;
    execute(&Cli {
        sysfs_root: replay.tree(),
        replayed_answers: answers,
        replayed_rails: rails,
        ..cli.clone()
    })
}

fn execute(cli: &Cli) -> Result<ExitCode> {
    let ns = &cli.label_namespace;
    match &cli.command {
        Command::Inventory(s) => {
            let format = s.output.pick("inventory", &[Format::Json, Format::Yaml])?;
            let pass = one_pass(cli, s.state_dir.as_deref(), true)?;
            emit(structured(format, &pass.record)?)?;
        }
        Command::Features(s) => {
            // "table" is the feature file's own `key=value` lines.
            let format = s
                .output
                .pick("features", &[Format::Table, Format::Json, Format::Yaml])?;
            let pass = one_pass(cli, s.state_dir.as_deref(), true)?;
            match format {
                Format::Table => emit(nfd::label_lines(&pass.labels, ns))?,
                _ => {
                    let labels: std::collections::BTreeMap<String, &String> = pass
                        .labels
                        .values
                        .iter()
                        .map(|(k, v)| (format!("{ns}/{k}"), v))
                        .collect();
                    emit(structured(format, &labels)?)?
                }
            }
        }
        Command::Preflight(s) => {
            s.output.pick("preflight", &[Format::Table])?;
            let pass = one_pass(cli, s.state_dir.as_deref(), true)?;
            emit(preflight::report(&pass, ns))?;
            let capable = pass.labels.values.contains_key("rdma.capable");
            return Ok(ExitCode::from(if capable { 0 } else { 1 }));
        }
        Command::Cdi(s) => {
            let format = s.output.pick("cdi", &[Format::Json, Format::Yaml])?;
            let pass = one_pass(cli, s.state_dir.as_deref(), false)?;
            let mut specs = serde_json::Map::new();
            for family in cdi::Family::ALL {
                if let Some(spec) = cdi::spec(&pass.record, family)? {
                    specs.insert(family.file_name().into(), serde_json::to_value(spec)?);
                }
            }
            emit(structured(format, &specs)?)?;
        }
        Command::Rails(r) => {
            let format = r.output.pick("rails", &rails::FORMATS)?;
            // Where the record goes is checked first: a misuse of the flags
            // is reported before anything asks the cluster.
            let config = r.rails.config(cli.tool_timeout)?;
            let target = r.rails.target(config.as_ref())?;
            let options = r.rails.options(cli, config.as_ref())?;
            let root = open_tree(cli)?;
            let pass = one_pass_on(cli, &root, r.state_dir.as_deref(), false)?;
            let record =
                rails::rail_record(cli, &root, &pass, &r.rails, config.as_ref(), &options)?;
            if let Some(target) = target {
                cli.full()?
                    .publish_record(&r.rails.cluster, &target, &record)?;
            }
            match format {
                Format::Table => emit(crate::views::rails::table(
                    &record,
                    &crate::views::rails::nic_names(&pass.record),
                ))?,
                // Today's bytes, as `publish --rails-file` writes them.
                Format::Json => emit(crate::rails::to_bytes(&record))?,
                _ => emit(output::yaml(&record)?)?,
            }
        }
        Command::Topo(t) => topo::topo(cli, t)?,
        Command::Publish(p) => match p.interval {
            Some(every) => return cli.full()?.publish_every(cli, p, every),
            None => publish::publish_once(cli, p)?,
        },
        Command::Capture(c) => capture::capture(cli, c)?,
        Command::Observe(o) => cli.full()?.observe(o)?,
        Command::Crd => emit(cli.full()?.crd())?,
        Command::InstallHook(h) => {
            if h.wait {
                hook::block_termination()?;
            }
            let path = hook::install(&h.dir.dest)?;
            eprintln!("nodefabric: installed {}", path.display());
            if h.wait {
                let signal = hook::wait_for_termination()?;
                eprintln!("nodefabric: signal {signal}, exiting (preStop removes the hook)");
            }
        }
        Command::RemoveHook(h) => match hook::remove(&h.dest)? {
            Some(path) => eprintln!("nodefabric: removed {}", path.display()),
            None => eprintln!(
                "nodefabric: no hook in {}, nothing to remove",
                h.dest.display()
            ),
        },
    }
    Ok(ExitCode::SUCCESS)
}

/// `value` in a structured format (json or yaml; the caller picked one).
fn structured<T: serde::Serialize>(format: Format, value: &T) -> Result<String> {
    match format {
        Format::Yaml => output::yaml(value),
        _ => output::json(value),
    }
}

/// Splits an output file given with `flag` into the folder the atomic write
/// works in (`.` for a bare name) and the file name.
fn folder_and_name<'a>(file: &'a Path, flag: &str) -> Result<(&'a Path, &'a str)> {
    let dir = file
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = file
        .file_name()
        .and_then(|n| n.to_str())
        .with_context(|| format!("{flag} {} has no file name", file.display()))?;
    Ok((dir, name))
}
