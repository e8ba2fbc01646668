//! Which commands the lean `nodefabric` binary hands to `nodefabric-full`,
//! and the hand-over itself: the same arguments, environment and process
//! (exec), so signals, exit status and output are the full binary's own.

use super::{Cli, Command};
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The companion binary's file name, looked for beside this one, then on PATH.
pub const FULL_BINARY: &str = "nodefabric-full";

/// Why `cli` needs `nodefabric-full`, or `None` when this binary runs it:
/// anything that may talk to the Kubernetes API, serve probes, or load NVML.
pub fn needed(cli: &Cli) -> Option<&'static str> {
    let fabric_read = match &cli.command {
        Command::Observe(_) => return Some("`observe` talks to the Kubernetes API"),
        Command::Crd => return Some("`crd` is derived from the Kubernetes API types"),
        Command::Publish(p) if p.interval.is_some() => {
            return Some("`publish --interval` runs as a service with probes")
        }
        Command::Rails(r) if r.rails.cluster.may_use_api() => return Some(
            "a cluster is configured or named: the rail record may be read from or written to it",
        ),
        Command::Publish(p) if p.rails.cluster.may_use_api() => return Some(
            "a cluster is configured or named: the rail record may be read from or written to it",
        ),
        Command::Capture(c)
            if c.rails.gpu_operator_named() || crate::cluster::client::configured() =>
        {
            return Some(
                "a cluster is configured or named: nvidia-smi may be run in the GPU Operator's pod",
            )
        }
        Command::Topo(t) if t.output.output == Some(super::output::Format::Svg) => {
            return Some("`topo -o svg` lays the graph out with a crate only nodefabric-full links")
        }
        Command::Inventory(_) | Command::Features(_) | Command::Preflight(_) => true,
        Command::Publish(_) | Command::Capture(_) => true,
        Command::Cdi(_) | Command::Rails(_) | Command::Topo(_) => false,
        Command::InstallHook(_) | Command::RemoveHook(_) => return None,
    };
    let nvidia_named = cli.nvidia_smi.is_some() || cli.nvidia_smi_q.is_some();
    let nvml = cli.nvml_lib.is_some() || (!nvidia_named && super::nvml_can_work(&cli.sysfs_root));
    (fabric_read && nvml)
        .then_some("NVML is read through dlopen, which this static binary does not do")
}

/// Replaces this process with `nodefabric-full` and the same arguments;
/// returns only when that cannot be done, with the error said.
pub fn to_full(why: &str) -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let Some(full) = find_full() else {
        eprintln!(
            "nodefabric: error: {why}, which {FULL_BINARY} does; it is neither beside {} nor on PATH (install it with nodefabric: `cargo build --release` builds both)",
            std::env::current_exe().map_or_else(|_| "this binary".into(), |p| p.display().to_string())
        );
        return ExitCode::from(1);
    };
    let error = std::process::Command::new(&full).args(args).exec();
    eprintln!(
        "nodefabric: error: {why}; starting {} failed: {error}",
        full.display()
    );
    ExitCode::from(1)
}

/// `nodefabric-full` beside this binary (as installed and as cargo builds
/// them), else the first on PATH.
pub(crate) fn find_full() -> Option<PathBuf> {
    let beside = std::env::current_exe()
        .ok()
        .map(|exe| exe.with_file_name(FULL_BINARY))
        .filter(|p| is_file(p));
    beside.or_else(|| {
        std::env::split_paths(&std::env::var_os("PATH")?)
            .map(|dir| dir.join(FULL_BINARY))
            .find(|p| is_file(p))
    })
}

fn is_file(p: &Path) -> bool {
    p.metadata().is_ok_and(|m| m.is_file())
}
