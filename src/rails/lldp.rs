//! The `host-lldp` rail source: which local interfaces see an LLDP
//! neighbour, as `lldpctl -f json` reports them, turned into rail IDs.
//!
//! lldpctl's JSON collapses one-element lists, so `lldp.interface` is an
//! object keyed by interface name when there is one neighbour and a list of
//! one-key objects when there are several (the same name twice when a port
//! has two neighbours); with no neighbour at all the key is absent. The
//! verbose `-f json0` form (every value a list, the name in a `name` field)
//! is read too.

use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::Path;

/// The local interface names that have at least one LLDP neighbour, sorted.
pub fn interfaces(json: &Value) -> Result<BTreeSet<String>> {
    let lldp = match json.get("lldp") {
        Some(Value::Array(a)) if a.len() == 1 => &a[0], // json0
        Some(v @ Value::Object(_)) => v,
        Some(other) => bail!("`lldp` is neither an object nor a one-element list: {other}"),
        None => bail!("no `lldp` key: not lldpctl -f json output"),
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
                    bail!("an `interface` list entry is not an object: {item}");
                };
                if let Some(name) = json0_name(map) {
                    out.insert(name);
                } else if map.len() == 1 {
                    out.extend(map.keys().cloned());
                } else {
                    bail!(
                        "an `interface` list entry has {} keys, expected one interface name",
                        map.len()
                    );
                }
            }
        }
        Some(other) => bail!("`interface` is neither an object nor a list: {other}"),
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

/// Runs `lldpctl -f json` (against `socket` when given) and parses it; a
/// daemon that does not answer within `timeout` fails the pass, never hangs it.
pub fn run_lldpctl(socket: Option<&Path>, timeout: std::time::Duration) -> Result<Value> {
    let socket_arg = socket.map(|s| s.to_string_lossy().into_owned());
    let mut args = Vec::new();
    if let Some(s) = &socket_arg {
        args.extend(["-u", s.as_str()]);
    }
    args.extend(["-f", "json"]);
    let out = crate::tool::output_if_installed(Path::new("lldpctl"), &args, timeout)
        .map_err(anyhow::Error::msg)?
        .context("running lldpctl: not found (is lldpd's client installed and on PATH?)")?;
    serde_json::from_str(&out).context("lldpctl printed something that is not JSON")
}

/// Parses saved `lldpctl -f json` output read from `path`.
pub fn parse_json(text: &str, path: &Path) -> Result<Value> {
    serde_json::from_str(text).with_context(|| format!("{} is not JSON", path.display()))
}
