//! One discovery pass and everything derived from it, shared by every
//! subcommand so `features`, `preflight` and `publish` read the host the same way.

use crate::discover::{self, DiscoverError};
use crate::fabric;
use crate::labels::{self, LabelSet};
use crate::publish;
use crate::record::NodeRecord;
use crate::sysfs::SysRoot;
use std::path::Path;
use std::time::SystemTime;

/// The environment variable that pins "now" (RFC 3339), so replays of a
/// captured tree and tests produce byte-identical output.
pub const NOW_ENV: &str = "NODEFABRIC_NOW";

/// The result of one pass: the record and the labels reduced from it.
#[derive(Debug, Clone)]
pub struct Pass {
    /// The node record.
    pub record: NodeRecord,
    /// The labels, without namespace.
    pub labels: LabelSet,
}

/// A [`NOW_ENV`] value that is not an RFC 3339 time.
#[derive(Debug, thiserror::Error)]
#[error("{NOW_ENV}={value:?}: {source}")]
pub struct BadNow {
    /// The text found.
    pub value: String,
    /// Why it is not a time.
    pub source: humantime::TimestampError,
}

/// The current time, or the one pinned by [`NOW_ENV`].
pub fn now() -> Result<SystemTime, BadNow> {
    match std::env::var(NOW_ENV) {
        Ok(value) => humantime::parse_rfc3339(&value).map_err(|source| BadNow { value, source }),
        Err(_) => Ok(SystemTime::now()),
    }
}

/// Runs discovery on `sysfs_root`, merging `firstSeen` and kept facts from
/// the record in `state_dir`, reads the scale-up fabric (unless `fabric` is
/// `None`: a command whose output does not use it neither asks the vendor
/// tools nor warns about their answers), and reduces it all to labels.
pub fn run(
    sysfs_root: &Path,
    state_dir: Option<&Path>,
    now: SystemTime,
    fabric: Option<&fabric::Sources>,
) -> Result<Pass, DiscoverError> {
    run_on(&SysRoot::new(sysfs_root)?, state_dir, now, fabric)
}

/// [`run`] on an opened tree (a recording one, for `capture`).
pub fn run_on(
    root: &SysRoot,
    state_dir: Option<&Path>,
    now: SystemTime,
    fabric: Option<&fabric::Sources>,
) -> Result<Pass, DiscoverError> {
    let previous = publish::Previous::at(state_dir);
    let stamp = humantime::format_rfc3339_seconds(now).to_string();
    // Discovery drops the tree's resolutions once it has read the tree, so
    // they are not held beside the previous record the fabric may need, nor
    // beside the outputs a publish makes; a later read re-resolves.
    let mut record = discover::discover(root, &previous, &stamp)?;
    if let Some(sources) = fabric {
        fabric::apply(root, &mut record, sources, &previous);
    }
    let mut labels = labels::rdma_labels(&record);
    let fabric_labels = labels::fabric_labels(&record);
    labels.values.extend(fabric_labels.values);
    labels.withheld.extend(fabric_labels.withheld);
    Ok(Pass { record, labels })
}
