//! Shared NICs through consumable capacity (KEP-5075, `resource.k8s.io/v1`
//! `allowMultipleAllocations` and `capacity[].requestPolicy`, gate
//! `DRAConsumableCapacity`: alpha in 1.34, beta and on by default from
//! 1.36). With `--shares N` every whole NIC is published as a device the
//! scheduler may allocate to several claims, each consuming shares of its
//! `shares` capacity, so independent pods share one NIC the way the device
//! plugin's `rdma.shared` resource lets them, and the scheduler counts.
//!
//! VFs stay exclusive: a VF is already the NIC's hardware partition, and
//! handing one VF to several pods would give them one queue pair namespace
//! with none of the isolation a VF is chosen for.
//!
//! On the node, one device may then be prepared for several claims, each
//! allocation told apart by the result's `shareID`; this module decides
//! which of them may coexist: shares with shares, never a share with the
//! device held whole, never one share ID twice. Pure.

use super::claims::Prepared;
use crate::cdi::Family;
use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Device, DeviceCapacity,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::collections::BTreeMap;

/// The capacity a shared NIC publishes and each allocation consumes.
pub const CAPACITY: &str = "shares";

/// The gate whose absence makes the API server drop the sharing fields.
pub const GATE: &str = "DRAConsumableCapacity";

/// The share count `--shares` takes when given no number: the device
/// plugin's `rdma.shared` count per NIC, so both modes offer as many pods.
pub const DEFAULT_SHARES: u32 = 64;

/// The most shares one NIC is cut into: far above kubelet's pods per node
/// (110 by default), so no honest setting is refused, and small enough that
/// a typo (an extra digit or two) is caught rather than published.
pub const MAX_SHARES: u32 = 1024;

/// How the node's whole NICs are offered: exclusively (0) or as N shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Shares(u32);

/// A `--shares` value the driver refuses; the message names it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SharesError {
    /// Not a whole number.
    #[error("--shares {value:?}: not a whole number of shares (0 = exclusive NICs, 1 to {MAX_SHARES} = shares per NIC)")]
    NotANumber {
        /// The value given.
        value: String,
    },
    /// A number outside 0..=[`MAX_SHARES`].
    #[error("--shares {value}: at most {MAX_SHARES} shares per NIC (0 = exclusive NICs)")]
    TooMany {
        /// The value given.
        value: u64,
    },
}

impl Shares {
    /// Every whole NIC exclusive: the default, and all a server with the
    /// gate off can honour.
    pub const EXCLUSIVE: Shares = Shares(0);

    /// `n` shares per NIC; 0 is exclusive.
    pub fn new(n: u32) -> Result<Shares, SharesError> {
        if n > MAX_SHARES {
            return Err(SharesError::TooMany { value: n.into() });
        }
        Ok(Shares(n))
    }

    /// Parses `--shares`: a whole number from 0 to [`MAX_SHARES`].
    pub fn parse(value: &str) -> Result<Shares, SharesError> {
        let n: u64 = value.trim().parse().map_err(|_| SharesError::NotANumber {
            value: value.to_string(),
        })?;
        let n = u32::try_from(n).map_err(|_| SharesError::TooMany { value: n })?;
        Shares::new(n)
    }

    /// The shares per NIC; 0 when NICs are exclusive.
    pub fn count(self) -> u32 {
        self.0
    }

    /// Whether whole NICs are shared.
    pub fn is_shared(self) -> bool {
        self.0 > 0
    }

    /// Makes `device` (of `family`) shareable when NICs are shared and it
    /// is a whole NIC: `allowMultipleAllocations` and a `shares` capacity
    /// whose request policy makes a claim that names no amount take one
    /// share, and lets a claim take 1 to N in steps of one.
    pub fn apply(self, device: &mut Device, family: Family) {
        if !self.is_shared() || family != Family::Whole {
            return;
        }
        let n = Quantity(self.0.to_string());
        let one = Quantity("1".into());
        let capacity = DeviceCapacity {
            value: n.clone(),
            request_policy: Some(CapacityRequestPolicy {
                default: Some(one.clone()),
                valid_range: Some(CapacityRequestPolicyRange {
                    min: one.clone(),
                    max: Some(n),
                    step: Some(one),
                }),
                valid_values: None,
            }),
        };
        device.allow_multiple_allocations = Some(true);
        device
            .capacity
            .get_or_insert_with(BTreeMap::new)
            .insert(CAPACITY.to_string(), capacity);
    }
}

/// `devices` without the fields a server with [`GATE`] off drops (upstream's
/// ResourceSlice strategy): `allowMultipleAllocations` and each capacity's
/// `requestPolicy`. The capacity values stay: they are older than the gate.
pub fn unshared(devices: &[Device]) -> Vec<Device> {
    devices
        .iter()
        .map(|d| {
            let mut d = d.clone();
            d.allow_multiple_allocations = None;
            for c in d.capacity.iter_mut().flat_map(BTreeMap::values_mut) {
                c.request_policy = None;
            }
            d
        })
        .collect()
}

/// Whether the server dropped sharing fields that were `sent`: a device
/// sent as shareable that it `kept` without `allowMultipleAllocations`.
pub fn lost(sent: &[Device], kept: &[Device]) -> bool {
    sent.iter().any(|s| {
        s.allow_multiple_allocations == Some(true)
            && kept
                .iter()
                .find(|k| k.name == s.name)
                .is_some_and(|k| k.allow_multiple_allocations != Some(true))
    })
}

/// Why a claim's device cannot be prepared beside what is prepared already;
/// each names the device and the claim holding it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Conflict {
    /// An exclusive device is still prepared for another claim.
    #[error("device {device} is still prepared for {holder}; it is exclusive, and is free once kubelet unprepares that claim")]
    Exclusive {
        /// The device.
        device: String,
        /// The claim holding it, `ResourceClaim ns/name (uid)`.
        holder: String,
    },
    /// The device is asked whole while shares of it are prepared.
    #[error("device {device} is asked whole, but share {share} of it is prepared for {holder}; it can be held whole once every share is unprepared")]
    WholeOverShares {
        /// The device.
        device: String,
        /// A share held.
        share: String,
        /// The claim holding that share.
        holder: String,
    },
    /// A share of the device is asked while it is prepared whole.
    #[error("share {share} of device {device} is asked, but the device is prepared whole for {holder}; it can be shared once that claim is unprepared")]
    ShareOverWhole {
        /// The device.
        device: String,
        /// The share asked.
        share: String,
        /// The claim holding the device whole.
        holder: String,
    },
    /// One share ID of the device is already prepared for another claim:
    /// a share ID names one allocation, so this is not the scheduler's.
    #[error("share {share} of device {device} is already prepared for {holder}")]
    SameShare {
        /// The device.
        device: String,
        /// The share.
        share: String,
        /// The claim holding it.
        holder: String,
    },
}

/// The first device of `wanted` that cannot be prepared beside `held` (the
/// other claims prepared, by UID), or `None` when every one can: shares of
/// one device coexist, anything else on a device is exclusive.
pub fn conflict<'a>(
    held: impl IntoIterator<Item = (&'a String, &'a Prepared)>,
    wanted: &Prepared,
) -> Option<Conflict> {
    let held: Vec<(&String, &Prepared)> = held.into_iter().collect();
    for w in &wanted.devices {
        for (uid, other) in &held {
            let holder = || format!("ResourceClaim {}/{} ({uid})", other.namespace, other.name);
            let same_device = other
                .devices
                .iter()
                .filter(|d| d.pool_name == w.pool_name && d.device_name == w.device_name);
            for d in same_device {
                let device = w.device_name.clone();
                return Some(match (&w.share_id, &d.share_id) {
                    (None, None) => Conflict::Exclusive {
                        device,
                        holder: holder(),
                    },
                    (None, Some(share)) => Conflict::WholeOverShares {
                        device,
                        share: share.clone(),
                        holder: holder(),
                    },
                    (Some(share), None) => Conflict::ShareOverWhole {
                        device,
                        share: share.clone(),
                        holder: holder(),
                    },
                    (Some(asked), Some(other)) if asked == other => Conflict::SameShare {
                        device,
                        share: asked.clone(),
                        holder: holder(),
                    },
                    (Some(_), Some(_)) => continue,
                });
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dra::claims::PreparedDevice;

    fn device(name: &str, share: Option<&str>) -> PreparedDevice {
        PreparedDevice {
            request_names: vec!["nic".into()],
            pool_name: "node-a".into(),
            device_name: name.into(),
            cdi_device_ids: vec![],
            share_id: share.map(str::to_string),
        }
    }

    fn claim(name: &str, devices: Vec<PreparedDevice>) -> Prepared {
        Prepared {
            namespace: "team".into(),
            name: name.into(),
            devices,
            ..Prepared::default()
        }
    }

    #[test]
    fn shares_coexist_and_whole_versus_share_is_refused_naming_device_and_holder() {
        const NIC: &str = "pci-0000-3b-00-0";
        let shared = BTreeMap::from([(
            "uid-a".to_string(),
            claim("a", vec![device(NIC, Some("s-1"))]),
        )]);
        let another_share = claim("b", vec![device(NIC, Some("s-2"))]);
        assert_eq!(conflict(&shared, &another_share), None);

        let whole = claim("b", vec![device(NIC, None)]);
        let e = conflict(&shared, &whole).unwrap();
        assert!(matches!(e, Conflict::WholeOverShares { .. }), "{e}");
        let text = e.to_string();
        assert!(
            text.contains(NIC) && text.contains("team/a (uid-a)") && text.contains("s-1"),
            "{text}"
        );

        let same = claim("b", vec![device(NIC, Some("s-1"))]);
        assert!(matches!(
            conflict(&shared, &same),
            Some(Conflict::SameShare { .. })
        ));

        let held_whole =
            BTreeMap::from([("uid-a".to_string(), claim("a", vec![device(NIC, None)]))]);
        let e = conflict(&held_whole, &another_share).unwrap();
        assert!(matches!(e, Conflict::ShareOverWhole { .. }), "{e}");
        assert!(e.to_string().contains("team/a (uid-a)"), "{e}");
        let e = conflict(&held_whole, &whole).unwrap();
        assert!(matches!(e, Conflict::Exclusive { .. }), "{e}");
        let elsewhere = claim("b", vec![device("pci-0000-af-00-0", None)]);
        assert_eq!(conflict(&held_whole, &elsewhere), None);
    }

    #[test]
    fn only_whole_nics_are_made_shareable_with_the_v1_request_policy() {
        let shares = Shares::new(64).unwrap();
        let mut nic = Device::default();
        shares.apply(&mut nic, Family::Whole);
        assert_eq!(nic.allow_multiple_allocations, Some(true));
        let json = serde_json::to_value(&nic.capacity).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"shares": {"value": "64", "requestPolicy": {
                "default": "1",
                "validRange": {"min": "1", "max": "64", "step": "1"}}}})
        );
        let mut vf = Device::default();
        shares.apply(&mut vf, Family::Partitioned);
        assert_eq!(vf, Device::default());
        let mut exclusive = Device::default();
        Shares::EXCLUSIVE.apply(&mut exclusive, Family::Whole);
        assert_eq!(exclusive, Device::default());
        // What a server with the gate off keeps: the capacity, no policy.
        let kept = unshared(std::slice::from_ref(&nic));
        assert!(lost(&[nic], &kept));
        assert_eq!(kept[0].capacity.as_ref().unwrap()["shares"].value.0, "64");
    }

    #[test]
    fn a_shares_value_outside_0_to_1024_is_refused_naming_it() {
        assert_eq!(Shares::parse("0").unwrap(), Shares::EXCLUSIVE);
        assert_eq!(Shares::parse("1024").unwrap().count(), 1024);
        for bad in ["1025", "-1", "sixty", "99999999999"] {
            let e = Shares::parse(bad).unwrap_err().to_string();
            assert!(e.contains(bad.trim_start_matches('-')), "{e}");
        }
    }
}
