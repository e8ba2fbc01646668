//! `nodefabric publish`: the one command that writes, once or every interval.

use super::rails::{publish_rails, RailArgs};
use super::{folder_and_name, Cli};
use crate::names::{duration_in, DurationError};
use crate::{cluster, nfd, pass, publish};
use anyhow::{Context, Result};
use clap::Args;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;
use tracing::{debug, error, info};

fn parse_interval(s: &str) -> Result<Duration, DurationError> {
    duration_in(s, Duration::from_secs(1), Duration::from_secs(24 * 3600))
}

/// `0s` turns expiry off; otherwise at most a year, far past any interval.
fn parse_expiry(s: &str) -> Result<Duration, DurationError> {
    duration_in(s, Duration::ZERO, Duration::from_secs(365 * 24 * 3600))
}

/// Options of `publish`.
#[derive(Debug, Clone, Args)]
pub struct PublishArgs {
    /// NFD's features.d folder; the file written there is `nodefabric`.
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/etc/kubernetes/node-feature-discovery/features.d"
    )]
    pub features_dir: PathBuf,

    /// CDI spec folder; this tool owns the files named nodefabric-*.json there.
    #[arg(long, value_name = "DIR", default_value = "/var/run/cdi")]
    pub cdi_dir: PathBuf,

    /// Folder for the last published record (keeps `firstSeen` stable).
    #[arg(long, value_name = "DIR", default_value = "/var/lib/nodefabric")]
    pub state_dir: PathBuf,

    /// Publish again every DURATION (e.g. 60s) instead of once.
    #[arg(long, value_name = "DURATION", value_parser = parse_interval)]
    pub interval: Option<Duration>,

    /// Label lifetime written as NFD's expiry-time directive, so labels lapse
    /// if the publisher dies. Default: 3 × --interval; none for a one-shot run.
    /// 0s disables it.
    #[arg(long, value_name = "DURATION", value_parser = parse_expiry)]
    pub expiry: Option<Duration>,

    /// Also write the rail record (as `rails` prints it) to FILE, atomically.
    /// When it cannot be built the previous file is kept and the pass fails.
    #[arg(long, value_name = "FILE")]
    pub rails_file: Option<PathBuf>,

    /// With --interval: serve /livez and /readyz on this address (e.g.
    /// 0.0.0.0:8081); ready while the last pass succeeded.
    #[arg(long, value_name = "ADDR", requires = "interval")]
    pub health_addr: Option<std::net::SocketAddr>,

    /// The rail inputs, used with --rails-file or a rail ConfigMap.
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

/// `publish --interval`: a pass every `interval`, with the probe server,
/// until the process is killed (in `nodefabric-full` only: see [`super::full`]).
pub(super) fn publish_loop(cli: &Cli, args: &PublishArgs, interval: Duration) -> Result<ExitCode> {
    let health = cluster::health::Health::new();
    if let Some(addr) = args.health_addr {
        let bound = health
            .serve(addr)
            .with_context(|| format!("--health-addr {addr}"))?;
        info!("health endpoints on http://{bound}/livez and /readyz");
    }
    health.set_live(true);
    // A pass waits at most for its vendor tools and the API, each bounded:
    // none completing in three intervals plus three such waits is a stuck
    // process, which liveness reports so the kubelet restarts it.
    health.expect_passes_within(3 * (interval + args.rails.cluster.api_timeout + cli.tool_timeout));
    keep_large_blocks_mapped();
    let mut n = 0u64;
    loop {
        n += 1;
        // A failed pass keeps everything previously published; the sidecar
        // carries on, unready, and tries again next interval.
        let result = publish_once(cli, args);
        health.pass_completed();
        // Counted, so that a measurement (benches/features.rs --publish)
        // can read the peak RSS after exactly N passes.
        debug!("publish pass {n} finished");
        health.set_ready(result.is_ok());
        if let Err(e) = result {
            error!("publish pass failed, previous output kept: {e:#}");
        }
        // A folder deleted under this container's mount takes nothing until
        // a restart mounts the new one: liveness fails so the kubelet does it.
        health.set_broken(publish::stale_folder(&output_folders(args).0));
        // The pass's structures are dropped: their pages go back to the OS
        // rather than wait, fragmented, under the next pass's.
        crate::heap::release_freed_memory();
        std::thread::sleep(interval);
    }
}

/// Has glibc serve every block of 128 KiB or more (a pass's tables, lists
/// and file buffers) from its own mapping, returned to the OS when freed.
/// By default the threshold rises to the largest block freed so far, so
/// from the second pass on such blocks came from the heap, where the
/// record's small allocations pinned them: the process grew pass after
/// pass (70 MiB by the fifth at 10,000 endpoints, docs/benchmarks.md).
fn keep_large_blocks_mapped() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt takes no pointers and only sets an allocator parameter.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
}

/// Every folder a pass writes into, with what it is for; a `--rails-file`
/// that names no file in a folder is the error, after the others.
fn output_folders(args: &PublishArgs) -> (Vec<(&'static str, &Path)>, Result<()>) {
    let mut folders = vec![
        ("the features folder", args.features_dir.as_path()),
        ("the CDI folder", args.cdi_dir.as_path()),
        ("the state folder", args.state_dir.as_path()),
    ];
    let rails = match &args.rails_file {
        Some(file) => folder_and_name(file, "--rails-file")
            .map(|(dir, _)| folders.push(("the --rails-file folder", dir))),
        None => Ok(()),
    };
    (folders, rails)
}

/// Where this container's memory limit is, as the container sees its own
/// cgroup: v2's `memory.max`, else v1's `memory.limit_in_bytes`. A node too
/// large for it is refused before a pass reads it.
const CGROUP_MEMORY_LIMITS: [&str; 2] = [
    "/sys/fs/cgroup/memory.max",
    "/sys/fs/cgroup/memory/memory.limit_in_bytes",
];

/// One publish pass: discover, then write each artifact only if it changed.
pub fn publish_once(cli: &Cli, args: &PublishArgs) -> Result<()> {
    publish::check_node_size(&cli.sysfs_root, &CGROUP_MEMORY_LIMITS.map(Path::new))?;
    let now = pass::now()?;
    let state_dir = args.state_dir.as_path();
    // One tree for the pass and the rail read after it.
    let (root, pass) = crate::sysfs::SysRoot::new(&cli.sysfs_root)
        .map_err(crate::discover::DiscoverError::from)
        .and_then(|root| {
            let pass = pass::run_on(&root, Some(state_dir), now, Some(&cli.fabric_sources()))?;
            Ok((root, pass))
        })
        .with_context(|| {
            format!(
                "reading sysfs tree {}; nothing published",
                cli.sysfs_root.display()
            )
        })?;

    let ttl = args.ttl();
    let expiry = ttl.map(|t| nfd::expiry_at(now, t)).transpose()?;
    let text = nfd::render_checked(&pass.labels, &cli.label_namespace, expiry)
        .context("previous feature file kept")?;
    let (folders, rails) = output_folders(args);
    rails?;
    publish::check_folders(&folders)?;
    remove_stale_temps(args);
    let dir = &args.features_dir;
    // What cannot be read as our file (larger than NFD reads, a FIFO) is
    // rewritten; it never stalls the pass.
    let existing = crate::input::read_text(
        &dir.join(nfd::FEATURE_FILE),
        nfd::MAX_FEATURE_FILE as u64,
        "a feature file",
        crate::input::Pipes::Refuse,
    )
    .ok();

    // Everything is made before anything is written; the labels are written
    // last, and only when the CDI specs and the record were: a pass cut
    // short (a full disk) never leaves labels announcing devices the specs
    // do not hold. The record is saved even when a CDI family cannot be
    // generated, so firstSeen stays stable; that failure is still reported
    // through the exit status, and the labels follow the pass.
    let cdi = publish::prepare_cdi(&args.cdi_dir, &pass.record);
    let mut failed = publish::write_cdi(&args.cdi_dir, &cdi);
    // Streamed: compared with the file and written without the record's
    // JSON (11 MiB at 10,000 endpoints) or the old file held whole.
    let record_json = |w: &mut dyn std::io::Write| -> std::io::Result<()> {
        serde_json::to_writer_pretty(&mut *w, &pass.record)?;
        w.write_all(b"\n")
    };
    if let Err(e) = publish::write_streamed_if_changed(state_dir, publish::STATE_FILE, record_json)
    {
        failed.push(e);
    }
    let written = if failed.is_empty() {
        if nfd::needs_rewrite(existing.as_deref(), &text, now, ttl) {
            publish::write_atomic(dir, nfd::FEATURE_FILE, text.as_bytes())
                .map(|path| info!("wrote {}", path.display()))
        } else {
            Ok(())
        }
    } else {
        Err(publish::PublishError::NotWritten(
            failed.iter().map(publish::PublishError::one_line).collect(),
        ))
    };
    let rails = args.rails.config(cli.tool_timeout).and_then(|config| {
        match (&args.rails_file, args.rails.target(config.as_ref())?) {
            (None, None) => Ok(()),
            (file, target) => publish_rails(
                cli,
                &root,
                &pass,
                &args.rails,
                config.as_ref(),
                file.as_deref(),
                target.as_ref(),
            ),
        }
    });
    written
        .and(cdi.not_generated())
        .map_err(anyhow::Error::from)
        .and(rails)
}

/// Removes the temp files a killed write of ours left in each output folder.
fn remove_stale_temps(args: &PublishArgs) {
    publish::remove_stale_temps(&args.features_dir, &[nfd::FEATURE_FILE]);
    let specs: Vec<&str> = crate::cdi::Family::ALL
        .iter()
        .map(|f| f.file_name())
        .collect();
    publish::remove_stale_temps(&args.cdi_dir, &specs);
    publish::remove_stale_temps(&args.state_dir, &[publish::STATE_FILE]);
    if let Some(file) = &args.rails_file {
        if let Ok((dir, name)) = folder_and_name(file, "--rails-file") {
            publish::remove_stale_temps(dir, &[name]);
        }
    }
}
