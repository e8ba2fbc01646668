//! nodefabric: the truth about a Kubernetes node's network fabric.
//!
//! Data flows one way: [`discover`] reads a sysfs tree into a
//! [`record::NodeRecord`]; everything published ([`labels`] through [`nfd`])
//! is a pure function of that record; [`publish`] is the only code that writes
//! what a pass found ([`hook`] writes only the binary itself, as NFD's hook).

/// What `--version` prints for every binary (`nodefabric`, `nodefabric-full`,
/// both kubelet plugins, `kubectl-nodefabric`): the release and the commit
/// it was built from, so a bug report names the exact build.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("NODEFABRIC_COMMIT"),
    ")"
);

pub mod capture;
pub mod cdi;
pub mod cli;
pub mod cluster;
pub mod discover;
pub mod dra;
pub mod escape;
pub mod fabric;
pub mod heap;
pub mod hook;
pub mod input;
pub mod kubelet;
pub mod labels;
pub mod logging;
pub mod mounts;
pub mod names;
pub mod nfd;
pub mod pass;
pub mod pci;
pub mod plugin;
pub mod preflight;
pub mod publish;
pub mod rails;
pub mod record;
pub mod sysfs;
pub mod table;
pub mod tool;
pub mod views;
