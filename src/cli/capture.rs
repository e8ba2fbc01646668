//! `nodefabric capture`: one pass on a recording tree, packed for a bug report.

use super::{emit, folder_and_name, Cli, RailInputArgs};
use crate::discover::rail_inputs;
use crate::{fabric, pass, publish, rails};
use anyhow::{Context, Result};
use clap::Args;
use std::path::PathBuf;

/// Options of `capture`.
#[derive(Debug, Clone, Args)]
pub struct CaptureArgs {
    /// The archive to write (atomically); `-` writes it to stdout.
    #[arg(long, value_name = "FILE.tar.gz")]
    pub out: PathBuf,

    /// Where the rail inputs are read from: the archive stores what they
    /// answered, for `rails` on its replay.
    #[command(flatten)]
    pub rails: RailInputArgs,

    /// This node's name, for --gpu-operator-daemonset: the pod asked is
    /// the one on this Node.
    #[arg(long, value_name = "NAME", env = "NODE_NAME", value_parser = crate::names::parse_node_name)]
    pub node_name: Option<String>,
}

/// Runs one pass on a recording tree and packs what it read.
pub(super) fn capture(cli: &Cli, args: &CaptureArgs) -> Result<()> {
    let root = crate::sysfs::SysRoot::recording(&cli.sysfs_root)
        .with_context(|| format!("opening sysfs tree {}", cli.sysfs_root.display()))?;
    let recorder = fabric::answers::Recorder::default();
    let sources = fabric::Sources {
        recorder: Some(recorder.clone()),
        ..cli.fabric_sources()
    };
    let pass = pass::run_on(&root, None, pass::now()?, Some(&sources))
        .with_context(|| format!("reading sysfs tree {}", cli.sysfs_root.display()))?;
    // The host-lldp source reads everything the other one does, and the
    // LLDP table besides: a replay can then build either.
    let broker = super::BrokerArgs {
        node_name: args.node_name.clone(),
        ..Default::default()
    };
    let rail_sources = super::rails::rail_sources(
        cli,
        &args.rails,
        rails::PortSource::HostLldp,
        None,
        &broker,
        &pass.record,
    )?;
    let rail_inputs = rail_inputs::read(&root, &pass.record, &rail_sources);
    let recorded = root.recorded();
    let answers = recorder.lock().expect("recorder lock").clone();
    let packed = crate::capture::pack(&recorded, &answers, &rail_inputs.answers)?;
    // Said before the archive is written, so it is seen with `--out -` too.
    if let Some(flags) = crate::capture::limits::beyond_defaults(packed.entries, packed.unpacked) {
        eprintln!(
            "nodefabric: warning: the capture holds {} entries ({} bytes unpacked), more than a replay takes by default; replay it with {flags}",
            packed.entries, packed.unpacked
        );
    }
    let bytes = packed.bytes;
    if args.out.as_os_str() == "-" {
        emit(bytes)?;
        return Ok(());
    }
    let (dir, name) = folder_and_name(&args.out, "--out")?;
    let path = publish::write_atomic(dir, name, &bytes)?;
    eprintln!(
        "captured {} entries into {} ({} bytes)",
        recorded.len(),
        path.display(),
        bytes.len()
    );
    Ok(())
}
