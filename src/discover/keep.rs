//! The rule that an unreadable fact is never an answer of "no".
//!
//! Discovery reads each fact as an answer (present, or absent because the
//! kernel has no such attribute) or as unreadable, with the reason. An
//! unreadable fact is listed on its endpoint; this module then fills each one
//! from the previous record (matched by PCI address, else by interface name)
//! and marks it kept. With no previous value the fact stays unknown, which
//! every consumer already reads as `Unverified`, never as absence.

use crate::publish::Previous;
use crate::record::{Fact, Interface, LinkState, LinkVerdict, NodeRecord, UnreadableFact};
use crate::sysfs::{join, SysError, SysRoot};

/// Why a fact that is there (or may be) could not be read: kept typed until
/// it is noted on the record, where its text is the fact's reason. Each
/// variant's text is what the record has always said.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Unreadable {
    /// The attribute could not be read at all.
    #[error(transparent)]
    Read(#[from] SysError),
    /// It was read, but is not a number (a truncated or foreign value).
    #[error("{path}: {text:?} is not a number")]
    NotANumber {
        /// The attribute, relative to the sysfs root.
        path: String,
        /// What it held, trimmed.
        text: String,
    },
    /// A `local_cpulist` that is not a CPU list as the kernel prints one.
    #[error("{path}: {text:?} is not a CPU list")]
    NotACpuList {
        /// The attribute, relative to the sysfs root.
        path: String,
        /// What it held, trimmed.
        text: String,
    },
}

/// The attribute `name` in `folder` read as an answer or as unreadable:
/// `Ok(Some(text))` read, `Ok(None)` the kernel has no such attribute,
/// `Err(reason)` it is there (or may be) and could not be read.
pub(crate) fn attribute_in(
    root: &SysRoot,
    folder: &str,
    name: &str,
) -> Result<Option<String>, Unreadable> {
    answer(root.read_trimmed_in(folder, name))
}

/// [`attribute_in`] of the first attribute read beneath a folder the tree
/// resolved: the read proves the folder where the tree only presumed it
/// (see `sysfs::trust`).
pub(crate) fn attribute_proving(
    root: &SysRoot,
    folder: &str,
    name: &str,
) -> Result<Option<String>, Unreadable> {
    answer(root.read_trimmed_proving(folder, name))
}

/// A read as [`attribute_in`] answers it.
fn answer(read: Result<String, SysError>) -> Result<Option<String>, Unreadable> {
    match read {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// An attribute that must parse as `T` when present; text that does not
/// parse is unreadable too (a truncated or foreign value is not an answer).
pub(crate) fn parsed_in<T: std::str::FromStr>(
    root: &SysRoot,
    folder: &str,
    name: &str,
) -> Result<Option<T>, Unreadable> {
    parse(attribute_in(root, folder, name)?, || join(folder, name))
}

/// [`parsed_in`] of `name` in a resolved `folder`, as
/// [`attribute_proving`] reads it.
pub(crate) fn parsed_proving<T: std::str::FromStr>(
    root: &SysRoot,
    folder: &str,
    name: &str,
) -> Result<Option<T>, Unreadable> {
    parse(attribute_proving(root, folder, name)?, || {
        join(folder, name)
    })
}

/// Text read as `T`; `path` names the attribute when it does not parse.
fn parse<T: std::str::FromStr>(
    text: Option<String>,
    path: impl FnOnce() -> String,
) -> Result<Option<T>, Unreadable> {
    match text {
        None => Ok(None),
        Some(v) => v.parse().map(Some).map_err(|_| Unreadable::NotANumber {
            path: path(),
            text: v,
        }),
    }
}

/// Notes an unreadable fact on an endpoint (not yet kept): the record is
/// where a reason becomes text.
pub(crate) fn note(iface: &mut Interface, fact: Fact, reason: impl std::fmt::Display) {
    iface.unreadable.push(UnreadableFact {
        fact,
        reason: reason.to_string(),
        kept: false,
    });
}

/// The previous record's endpoint matching `ep`: same PCI address, or for a
/// device off the PCI bus (or a placeholder) the same interface name.
fn matching<'a>(previous: &'a NodeRecord, ep: &Interface) -> Option<&'a Interface> {
    previous.endpoints().into_iter().map(|(p, _)| p).find(|p| {
        match (&ep.pci_bus_id, &p.pci_bus_id) {
            (Some(a), Some(b)) => a == b,
            (None, _) => ep.name.is_some() && p.name == ep.name,
            _ => false,
        }
    })
}

/// Copies one fact's value from `prev` into `ep`; false when there is nothing
/// to copy (the previous endpoint has no such value for it).
fn copy_fact(ep: &mut Interface, prev: &Interface, fact: &UnreadableFact) -> bool {
    match fact.fact {
        Fact::Interface => {
            // The whole interface could not be read: everything but the
            // verdict is the previous pass's. The link cannot have been read
            // either, so the verdict says that instead of repeating an old one.
            let unreadable = std::mem::take(&mut ep.unreadable);
            *ep = prev.clone();
            ep.unreadable = unreadable;
            if let Some(link) = ep.link.as_mut() {
                *link = LinkVerdict {
                    state: LinkState::Unverified,
                    reason: Some(format!("interface unreadable: {}", fact.reason)),
                    ports: vec![],
                    first_seen: None,
                };
            }
        }
        Fact::Bus => ep.bus = prev.bus.clone(),
        Fact::Mtu => ep.mtu = prev.mtu,
        Fact::Up => ep.up = prev.up,
        Fact::Numa => ep.numa = prev.numa,
        Fact::CpuAffinity => ep.cpu_affinity = prev.cpu_affinity.clone(),
        Fact::PhysicalFunction => ep.physical_function = prev.physical_function,
        Fact::VirtualFunctionsConfigured => {
            ep.virtual_functions_configured = prev.virtual_functions_configured
        }
        Fact::VirtualFunctions => ep.virtual_functions = prev.virtual_functions.clone(),
        // The verbs device belongs to the RDMA device: kept only for the same one.
        Fact::Verbs if prev.rdma_device == ep.rdma_device && prev.verbs.is_some() => {
            ep.verbs = prev.verbs.clone();
            ep.verbs_error = None;
        }
        Fact::Verbs => return false,
        Fact::RdmaDevice => {
            ep.rdma = prev.rdma;
            ep.rdma_device = prev.rdma_device.clone();
        }
        // An accelerator's facts are kept by the accelerator scan.
        Fact::Accelerator => return false,
    }
    true
}

/// Fills every unreadable fact of the record from `previous`, marking each
/// one kept; facts with nothing to keep stay unknown and unmarked.
pub fn keep_previous(record: &mut NodeRecord, previous: &Previous) {
    let mut unreadable = false;
    record.for_each_endpoint_mut(|ep| unreadable |= !ep.unreadable.is_empty());
    // Read only when a fact needs it: most passes read every fact.
    let Some(previous) = unreadable.then(|| previous.get()).flatten() else {
        return;
    };
    record.for_each_endpoint_mut(|ep| {
        if ep.unreadable.is_empty() {
            return;
        }
        let Some(prev) = matching(previous, ep) else {
            return;
        };
        let facts = ep.unreadable.clone();
        for (i, fact) in facts.iter().enumerate().filter(|(_, f)| !f.kept) {
            ep.unreadable[i].kept = copy_fact(ep, prev, fact);
        }
    });
}
