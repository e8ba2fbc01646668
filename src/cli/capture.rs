//! `nodefabric capture`: one pass on a recording tree, packed for a bug report.

use super::{emit, folder_and_name, Cli};
use crate::{fabric, pass, publish};
use anyhow::{Context, Result};
use clap::Args;
use std::path::PathBuf;

/// Options of `capture`.
#[derive(Debug, Clone, Args)]
pub struct CaptureArgs {
    /// The archive to write (atomically); `-` writes it to stdout.
    #[arg(long, value_name = "FILE.tar.gz")]
    pub out: PathBuf,
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
    pass::run_on(&root, None, pass::now()?, Some(&sources))
        .with_context(|| format!("reading sysfs tree {}", cli.sysfs_root.display()))?;
    let recorded = root.recorded();
    let answers = recorder.lock().expect("recorder lock").clone();
    let bytes = crate::capture::pack(&recorded, &answers)?;
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
