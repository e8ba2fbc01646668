//! Device taints for link verdicts (KEP-5055, `resource.k8s.io/v1`
//! `devices[].taints`, gate `DRADeviceTaints`): a device whose link is
//! `Failed` carries `<driver>/link-failed`, so the scheduler stops offering
//! it to every claim, not only to the ones that use our DeviceClass. Pure:
//! the taints follow from the device and the rule.

use super::devices::DraDevice;
use crate::record::LinkState;
use k8s_openapi::api::resource::v1::{Device, DeviceTaint};

/// The taint key's name under the driver's domain.
pub const LINK_FAILED: &str = "link-failed";

/// The most devices the API server takes in a slice whose devices carry
/// taints (`ResourceSliceMaxDevicesWithAdvancedFeatures`, 1.35+): every
/// slice is cut at this size, so a taint appearing never re-cuts the pool.
pub const DEVICES_PER_SLICE: usize = 64;

/// The gate whose absence makes the API server drop taints.
pub const GATE: &str = "DRADeviceTaints";

/// What a `Failed` link's taint does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum FailedEffect {
    /// No new claim gets the device; pods using it keep running.
    #[default]
    NoSchedule,
    /// Also evicts the pods using the device (a flapping RoCE link would
    /// evict training jobs: opt in only where that is wanted).
    NoExecute,
}

impl FailedEffect {
    /// The API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            FailedEffect::NoSchedule => "NoSchedule",
            FailedEffect::NoExecute => "NoExecute",
        }
    }
}

/// How devices are tainted: the key's domain and the effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaintRule {
    /// The driver name, the taint key's domain.
    pub driver: String,
    /// The effect of a `Failed` link's taint.
    pub effect: FailedEffect,
}

impl TaintRule {
    /// The taint key, `<driver>/link-failed`.
    pub fn key(&self) -> String {
        format!("{}/{LINK_FAILED}", self.driver)
    }

    /// The device's taints: one for a `Failed` link, none otherwise (an
    /// `Unverified` link is no reason to keep a device from anyone, and the
    /// informational effect `None` is refused by 1.34's API).
    pub fn taints(&self, device: &DraDevice) -> Option<Vec<DeviceTaint>> {
        (device.link == LinkState::Failed).then(|| {
            vec![DeviceTaint {
                key: self.key(),
                value: Some(value(device.ports.as_deref())),
                effect: self.effect.as_str().to_string(),
                time_added: None,
            }]
        })
    }
}

/// A taint value (a label value: at most 63 characters of `[A-Za-z0-9_.-]`,
/// starting and ending with a letter or digit) from the ports' states:
/// `1=DOWN/Disabled,2=DOWN/Polling` becomes `1-DOWN-Disabled.2-DOWN-Polling`.
pub fn value(ports: Option<&str>) -> String {
    let ports = ports.unwrap_or("Failed");
    let mut out: String = ports
        .chars()
        .map(|c| match c {
            ',' => '.',
            c if c.is_ascii_alphanumeric() || c == '_' => c,
            _ => '-',
        })
        .take(63)
        .collect();
    while out.ends_with(|c: char| !c.is_ascii_alphanumeric()) {
        out.pop();
    }
    if !out.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return "Failed".into();
    }
    out
}

/// `wanted` with each taint's server-set `timeAdded` copied from the same
/// taint (key, value, effect) of the same device in `kept`: the server
/// stamps the time, and without it every comparison would see a change.
pub fn stamped(wanted: &[Device], kept: &[Device]) -> Vec<Device> {
    wanted
        .iter()
        .map(|w| {
            let mut w = w.clone();
            let Some(k) = kept.iter().find(|k| k.name == w.name) else {
                return w;
            };
            for taint in w.taints.iter_mut().flatten() {
                let same = k.taints.iter().flatten().find(|t| {
                    t.key == taint.key && t.value == taint.value && t.effect == taint.effect
                });
                if let Some(t) = same {
                    taint.time_added = t.time_added.clone();
                }
            }
            w
        })
        .collect()
}

/// `devices` without their taints: two lists equal this way differ in
/// taints alone, which a slice may change in place.
pub fn untainted(devices: &[Device]) -> Vec<Device> {
    devices
        .iter()
        .map(|d| Device {
            taints: None,
            ..d.clone()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_taint_value_is_a_label_value_whatever_the_ports_say() {
        assert_eq!(
            value(Some("1=DOWN/Disabled,2=DOWN/Polling")),
            "1-DOWN-Disabled.2-DOWN-Polling"
        );
        assert_eq!(value(None), "Failed");
        assert_eq!(value(Some("=/,")), "Failed");
        let long = value(Some(&"1=DOWN/Disabled,".repeat(10)));
        assert!(long.len() <= 63 && long.ends_with(|c: char| c.is_ascii_alphanumeric()));
    }
}
