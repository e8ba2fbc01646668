//! `nodefabric topo`: the accelerator-to-NIC matrix of one pass, as a
//! table, JSON, YAML, a DOT graph or an SVG picture of the PCIe tree.

use super::output::{self, Format, OutputArg};
use super::{emit, one_pass, Cli};
use crate::rails::RailRecord;
use crate::views;
use anyhow::{Context, Result};
use clap::Args;
use std::path::PathBuf;

/// The formats `topo` prints, its default first.
pub const FORMATS: [Format; 5] = [
    Format::Table,
    Format::Json,
    Format::Yaml,
    Format::Dot,
    Format::Svg,
];

/// The largest rail record `--rails-file` reads: far above any node's.
const MAX_RAILS_FILE: u64 = 16 << 20;

/// Each accelerator's PCIe path class to each RDMA NIC, from sysfs, for
/// every vendor (`nvidia-smi topo -m`'s question), then each NIC's NUMA
/// node, link verdict and rails.
///
/// Cells: PIX (at most one PCIe switch between), PXB (several switches, no
/// host bridge), NODE (across host bridges on one NUMA node; sysfs cannot
/// tell PHB from it), SYS (across NUMA nodes), UNK (a coordinate is
/// missing): the walk the rdma.distance label uses. A NIC's VFs are
/// counted in its column (VFS). Formats (-o): table (default), json, yaml,
/// dot (Graphviz: host bridges, bridges, then accelerators and NICs; NICs
/// filled by rail, Failed links in red) and svg (that graph drawn here, no
/// Graphviz needed; `nodefabric` hands it to nodefabric-full).
#[derive(Debug, Clone, Args)]
pub struct TopoArgs {
    /// The output format.
    #[command(flatten)]
    pub output: OutputArg,

    /// A rail record (what `rails -o json` prints and `publish --rails-file`
    /// writes) naming each NIC's rails; without it the RAIL column is `-`.
    #[arg(long, value_name = "FILE")]
    pub rails_file: Option<PathBuf>,
}

/// Runs `topo`.
pub(super) fn topo(cli: &Cli, args: &TopoArgs) -> Result<()> {
    let format = args.output.pick("topo", &FORMATS)?;
    let rails = args
        .rails_file
        .as_deref()
        .map(|path| -> Result<RailRecord> {
            let bytes = crate::input::read_bytes(
                path,
                MAX_RAILS_FILE,
                "rail record",
                crate::input::Pipes::Wait(cli.tool_timeout),
            )?;
            serde_json::from_slice(&bytes)
                .with_context(|| format!("--rails-file {}: not a rail record", path.display()))
        })
        .transpose()?;
    // The fabric is not part of the matrix: no vendor tool is asked.
    let pass = one_pass(cli, None, false)?;
    let m = views::topo::matrix(&pass.record, rails.as_ref());
    emit(match format {
        Format::Table => views::topo::table(&m),
        Format::Json => output::json(&m)?,
        Format::Yaml => output::yaml(&m)?,
        Format::Dot => views::graph::dot(&m),
        Format::Svg => cli.full()?.svg(&views::graph::dot(&m))?,
    })
}
