//! nodefabric: the truth about a Kubernetes node's network fabric.
//!
//! Data flows one way: [`discover`] reads a sysfs tree into a
//! [`record::NodeRecord`]; everything published ([`labels`] through [`nfd`])
//! is a pure function of that record; [`publish`] is the only code that writes.

pub mod capture;
pub mod cdi;
pub mod cli;
pub mod discover;
pub mod fabric;
pub mod labels;
pub mod logging;
pub mod names;
pub mod nfd;
pub mod pass;
pub mod pci;
pub mod preflight;
pub mod publish;
pub mod record;
pub mod sysfs;
pub mod plugin;
pub mod rails;
