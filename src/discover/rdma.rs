//! RDMA devices bound to a network device, and the link verdict of each.
//!
//! The check reads the RDMA subsystem's own port attributes, so it applies to
//! every RDMA device whatever its manufacturer.

use crate::record::{LinkState, LinkVerdict, PortReading};
use crate::sysfs::{join, SysError, SysRoot};

/// The RDMA device bound to a device: the first entry of `<device>/infiniband/`.
/// `Ok(None)` when the device has no such folder (nothing bound); an error when
/// the folder exists and cannot be read.
pub fn bound_device(root: &SysRoot, device: &str) -> Result<Option<String>, SysError> {
    match root.list(&join(device, "infiniband")) {
        Ok(names) => Ok(names.into_iter().next()),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

/// The enum name of a port attribute: `4: ACTIVE` → `ACTIVE`. The kernel
/// prints `<number>: <NAME>`; a value without the number is taken whole.
fn enum_name(value: &str) -> &str {
    value.split_once(':').map_or(value, |(_, n)| n).trim()
}

/// Reads every port of `ibdev` (at `<device>/infiniband/<ibdev>`) and decides.
///
/// `OK` needs a port whose state is exactly `ACTIVE` and physical state exactly
/// `LinkUp` (whole names: `ACTIVE_DEFER` is not `ACTIVE`). `Failed` needs every
/// port read and none carrying the link. Anything else is `Unverified`, because
/// an unreadable file is never an answer of "no".
pub fn link_verdict(root: &SysRoot, device: &str, ibdev: &str) -> LinkVerdict {
    let ports_dir = join(device, &format!("infiniband/{ibdev}/ports"));
    let unverified = |reason: String, ports: Vec<PortReading>| LinkVerdict {
        state: LinkState::Unverified,
        reason: Some(reason),
        ports,
        first_seen: None,
    };
    let ports = match root.list(&ports_dir) {
        Ok(p) if p.is_empty() => return unverified(format!("{ports_dir}: no ports"), vec![]),
        Ok(p) => p,
        Err(e) => return unverified(format!("cannot list ports: {e}"), vec![]),
    };
    let mut readings = Vec::new();
    let mut unreadable = Vec::new();
    let mut up = false;
    for port in ports {
        let dir = join(&ports_dir, &port);
        let state = root.read_trimmed(&join(&dir, "state"));
        let phys = root.read_trimmed(&join(&dir, "phys_state"));
        if let (Ok(s), Ok(p)) = (&state, &phys) {
            up |= enum_name(s) == "ACTIVE" && enum_name(p) == "LinkUp";
        }
        for e in [&state, &phys].into_iter().filter_map(|r| r.as_ref().err()) {
            unreadable.push(e.to_string());
        }
        readings.push(PortReading {
            port,
            state: state.ok(),
            phys_state: phys.ok(),
        });
    }
    if up {
        LinkVerdict {
            state: LinkState::Ok,
            reason: None,
            ports: readings,
            first_seen: None,
        }
    } else if !unreadable.is_empty() {
        unverified(
            format!("no port carries the link, and some could not be read: {}", unreadable.join("; ")),
            readings,
        )
    } else {
        LinkVerdict {
            state: LinkState::Failed,
            reason: Some("no port is ACTIVE with physical state LinkUp".into()),
            ports: readings,
            first_seen: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::enum_name;

    #[test]
    fn enum_names_are_whole() {
        assert_eq!(enum_name("4: ACTIVE"), "ACTIVE");
        assert_eq!(enum_name("4: ACTIVE_DEFER"), "ACTIVE_DEFER");
        assert_eq!(enum_name("5: LinkUp"), "LinkUp");
        assert_eq!(enum_name("LinkUp"), "LinkUp");
    }
}
