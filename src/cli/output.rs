//! The one `-o/--output` flag every command that prints data takes, with
//! the same format names everywhere; each command says which it can print.

use anyhow::Result;
use clap::{Args, ValueEnum};
use serde::Serialize;

/// A format a command can print in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Aligned columns for people.
    Table,
    /// JSON, pretty-printed, for scripts (`jq`).
    Json,
    /// YAML, the same fields as JSON.
    Yaml,
    /// A Graphviz DOT graph of the PCIe tree (`topo`).
    Dot,
    /// The DOT graph laid out as SVG, in-process (`topo`; nodefabric-full).
    Svg,
}

impl Format {
    /// The name `--output` takes.
    pub fn name(self) -> &'static str {
        match self {
            Format::Table => "table",
            Format::Json => "json",
            Format::Yaml => "yaml",
            Format::Dot => "dot",
            Format::Svg => "svg",
        }
    }
}

/// `-o/--output`, flattened into each printing command.
#[derive(Debug, Clone, Default, Args)]
pub struct OutputArg {
    /// Output format: table, json, yaml, dot or svg; each command names the
    /// ones it prints and its default in its own help.
    #[arg(short = 'o', long = "output", value_enum, value_name = "FORMAT")]
    pub output: Option<Format>,
}

impl OutputArg {
    /// The format asked for, else `allowed[0]` (the command's default); an
    /// error naming the command and its formats for any other.
    pub fn pick(&self, command: &str, allowed: &[Format]) -> Result<Format> {
        let f = self.output.unwrap_or(allowed[0]);
        if allowed.contains(&f) {
            return Ok(f);
        }
        let names: Vec<&str> = allowed.iter().map(|f| f.name()).collect();
        anyhow::bail!(
            "`{command}` prints {} (default {}), not --output {}",
            names.join(", "),
            names[0],
            f.name()
        )
    }
}

/// `value` as pretty JSON with a final newline.
pub fn json<T: Serialize>(value: &T) -> Result<String> {
    Ok(format!("{}\n", serde_json::to_string_pretty(value)?))
}

/// `value` as YAML (the same fields as [`json`]).
pub fn yaml<T: Serialize>(value: &T) -> Result<String> {
    Ok(serde_saphyr::to_string(value)?)
}
