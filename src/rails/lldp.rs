//! The `host-lldp` rail source: which local interfaces see an LLDP
//! neighbour, as `lldpctl -f json` reports them, turned into rail IDs.
//!
//! lldpctl's JSON collapses one-element lists, so `lldp.interface` is an
//! object keyed by interface name when there is one neighbour and a list of
//! one-key objects when there are several (the same name twice when a port
//! has two neighbours); with no neighbour at all the key is absent. The
//! verbose `-f json0` form (every value a list, the name in a `name` field)
//! is read too.

use super::answers::{Answer, Origin, Output};
use serde_json::Value;
use std::collections::BTreeSet;

/// Why an LLDP answer names no interfaces; each says which answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LldpError {
    /// lldpctl is not installed on the node.
    #[error("running lldpctl: not found (is lldpd's client installed and on PATH?)")]
    NotInstalled,
    /// The tool or file gave no text; the reason as the read reported it.
    #[error("{0}")]
    Unreadable(String),
    /// The text is not JSON.
    #[error("{}: {cause}", not_json(origin))]
    NotJson {
        /// The command or file.
        origin: Origin,
        /// The JSON parser's words.
        cause: String,
    },
    /// JSON, but not lldpctl's neighbour table (in the message, not a
    /// `source`, so an error chain prints it once).
    #[error("reading the LLDP neighbour table: {0}")]
    Table(TableError),
}

/// How a text that is not JSON is named: by the command that printed it, or the file.
fn not_json(origin: &Origin) -> String {
    match origin {
        Origin::Command(cmd) | Origin::Exec(cmd) => {
            format!("{cmd} printed something that is not JSON")
        }
        Origin::File(path) => format!("{path} is not JSON"),
    }
}

/// JSON that is not an lldpctl neighbour table, saying where the shape breaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TableError {
    /// No `lldp` key at the top.
    #[error("no `lldp` key: not lldpctl -f json output")]
    NoLldpKey,
    /// `lldp` is something else.
    #[error("`lldp` is neither an object nor a one-element list: {0}")]
    LldpShape(String),
    /// `interface` is something else.
    #[error("`interface` is neither an object nor a list: {0}")]
    InterfaceShape(String),
    /// An `interface` list entry is not an object.
    #[error("an `interface` list entry is not an object: {0}")]
    EntryNotObject(String),
    /// An `interface` list entry names more or fewer than one interface.
    #[error("an `interface` list entry has {0} keys, expected one interface name")]
    EntryKeys(usize),
}

/// The interfaces with a neighbour in an LLDP answer, or why it names none.
pub fn neighbours(answer: &Answer) -> Result<BTreeSet<String>, LldpError> {
    let text = match &answer.output {
        Output::Printed(t) => t,
        Output::NotInstalled => return Err(LldpError::NotInstalled),
        Output::Failed(why) => return Err(LldpError::Unreadable(why.clone())),
    };
    let json: Value = serde_json::from_str(text).map_err(|e| LldpError::NotJson {
        origin: answer.origin.clone(),
        cause: e.to_string(),
    })?;
    interfaces(&json).map_err(LldpError::Table)
}

/// The local interface names that have at least one LLDP neighbour, sorted.
pub fn interfaces(json: &Value) -> Result<BTreeSet<String>, TableError> {
    let lldp = match json.get("lldp") {
        Some(Value::Array(a)) if a.len() == 1 => &a[0], // json0
        Some(v @ Value::Object(_)) => v,
        Some(other) => return Err(TableError::LldpShape(other.to_string())),
        None => return Err(TableError::NoLldpKey),
    };
    let mut out = BTreeSet::new();
    match lldp.get("interface") {
        None => {} // no neighbours
        Some(Value::Object(map)) => {
            if let Some(name) = json0_name(map) {
                out.insert(name);
            } else {
                out.extend(map.keys().cloned());
            }
        }
        Some(Value::Array(items)) => {
            for item in items {
                let Value::Object(map) = item else {
                    return Err(TableError::EntryNotObject(item.to_string()));
                };
                if let Some(name) = json0_name(map) {
                    out.insert(name);
                } else if map.len() == 1 {
                    out.extend(map.keys().cloned());
                } else {
                    return Err(TableError::EntryKeys(map.len()));
                }
            }
        }
        Some(other) => return Err(TableError::InterfaceShape(other.to_string())),
    }
    Ok(out)
}

/// The `name` of a json0 interface entry (a string or `[{"value": …}]`).
fn json0_name(map: &serde_json::Map<String, Value>) -> Option<String> {
    match map.get("name")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(a) => a.first()?.get("value")?.as_str().map(str::to_string),
        _ => None,
    }
}
