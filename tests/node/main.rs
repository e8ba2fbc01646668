//! What `nodefabric` reads from a node and writes for it, run as the real
//! binary on fixture trees and real host tools: one test binary, so the
//! crate is linked once for all of them.

// A folder target's own `mod support;` would look inside this folder.
#[path = "../support/mod.rs"]
mod support;

mod capture;
mod cdi;
mod conformance;
mod deploy;
mod discovery;
mod docs;
mod dra_allocate;
mod dra_deploy;
mod dra_deploy_shares;
mod fabric;
mod faults;
mod helm;
mod hook_binary;
mod lldp;
mod nfd_hook_run;
mod nfd_hooks;
mod nvsmi_q_props;
mod protos;
mod rails;
mod sysfs_props;
mod topo_props;
mod views;
