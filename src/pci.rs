//! PCI coordinates: addresses, the one upstream-bridge walk, and the bus
//! distance between two devices.
//!
//! NICs and all accelerators derive their `pciRootId` / `pciSwitches` from
//! [`upstream_bridges`], so the two sides compare equal by construction.

use serde::{Deserialize, Serialize};
use std::fmt;

/// True when `s` is a full PCI address `DDDD:BB:DD.F` (hex, any case).
pub fn is_pci_address(s: &str) -> bool {
    parse(s).is_some()
}

/// A full PCI address's four numbers, named so no caller mixes up the
/// bus and the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Address {
    /// The PCI domain (segment): up to 32 bits as written, 16 in the kernel's form.
    pub domain: u32,
    /// The bus number.
    pub bus: u8,
    /// The device number (0 to 0x1f).
    pub device: u8,
    /// The function number (0 to 7).
    pub function: u8,
}

/// Splits a full PCI address into its domain, bus, device and function.
pub fn parse(s: &str) -> Option<Address> {
    let (dom, rest) = s.split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (dev, func) = rest.split_once('.')?;
    if dom.is_empty() || dom.len() > 8 || bus.len() != 2 || dev.len() != 2 || func.len() != 1 {
        return None;
    }
    let all_hex = |t: &str| t.chars().all(|c| c.is_ascii_hexdigit());
    if !(all_hex(dom) && all_hex(bus) && all_hex(dev) && all_hex(func)) {
        return None;
    }
    let dev_n = u8::from_str_radix(dev, 16).ok()?;
    let func_n = u8::from_str_radix(func, 16).ok()?;
    if dev_n > 0x1f || func_n > 7 {
        return None;
    }
    Some(Address {
        domain: u32::from_str_radix(dom, 16).ok()?,
        bus: u8::from_str_radix(bus, 16).ok()?,
        device: dev_n,
        function: func_n,
    })
}

/// Normalises a PCI address to the kernel's form: lowercase, 4-digit domain
/// (`00000000:1B:00.0` as nvidia-smi prints it → `0000:1b:00.0`). `None` when
/// the text is not a PCI address or the domain does not fit 16 bits.
pub fn normalize(s: &str) -> Option<String> {
    let Address {
        domain,
        bus,
        device,
        function,
    } = parse(s.trim())?;
    if domain > 0xffff {
        return None;
    }
    Some(format!("{domain:04x}:{bus:02x}:{device:02x}.{function:x}"))
}

/// The upstream bridges of a device, innermost first, from its canonical
/// sysfs path (`devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0`).
///
/// Every PCI-address component before the device's own is a bridge: that is
/// how the kernel nests devices under the bridge whose secondary bus they sit
/// on. Returns `None` when the path is not under a PCI host bridge.
pub fn upstream_bridges(canonical: &str) -> Option<Vec<String>> {
    let parts: Vec<&str> = canonical.split('/').collect();
    let host = parts.iter().position(|p| p.starts_with("pci"))?;
    let chain: Vec<&str> = parts[host + 1..]
        .iter()
        .copied()
        .take_while(|p| is_pci_address(p))
        .collect();
    let (_device, bridges) = chain.split_last()?;
    Some(bridges.iter().rev().map(|b| b.to_string()).collect())
}

/// The PCIe host bridge of a device from its canonical sysfs path: the
/// first `pciDDDD:BB` component (`devices/pci0000:00/0000:00:01.0/…` gives
/// `pci0000:00`). This is what Kubernetes DRA drivers publish as
/// `resource.kubernetes.io/pcieRoot`, and it is not the outermost bridge
/// ([`upstream_bridges`]' last entry), which sits one level below it.
pub fn host_bridge(canonical: &str) -> Option<&str> {
    let host = canonical.split('/').find(|p| p.starts_with("pci"))?;
    is_host_bridge(host).then_some(host)
}

/// True when `s` names a PCI host bridge as sysfs does: `pci`, a domain of
/// four or more hex digits (VMD domains have five), `:`, a two-digit bus.
pub fn is_host_bridge(s: &str) -> bool {
    let Some((dom, bus)) = s.strip_prefix("pci").and_then(|r| r.split_once(':')) else {
        return false;
    };
    let hex = |t: &str| t.bytes().all(|b| b.is_ascii_hexdigit());
    (4..=8).contains(&dom.len()) && bus.len() == 2 && hex(dom) && hex(bus)
}

/// The bus distance vocabulary, smaller is closer. The order of the variants
/// is the order of closeness, so `min()` picks the closest.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "UPPERCASE")]
pub enum Distance {
    /// The same device (never produced from bus coordinates).
    #[serde(rename = "SELF")]
    SelfDevice,
    /// A direct link such as NVLink (never produced from bus coordinates).
    Link,
    /// Behind one PCIe switch.
    Pix,
    /// Behind several switches that share a bridge, no host bridge crossed.
    Pxb,
    /// Through one host bridge (never produced: indistinguishable from NODE).
    Phb,
    /// No shared bridge, same NUMA node.
    Node,
    /// Across NUMA nodes.
    Sys,
    /// A coordinate was missing.
    Unk,
}

impl Distance {
    /// The label spelling (`PIX`, `SYS` …).
    pub fn as_str(self) -> &'static str {
        match self {
            Distance::SelfDevice => "SELF",
            Distance::Link => "LINK",
            Distance::Pix => "PIX",
            Distance::Pxb => "PXB",
            Distance::Phb => "PHB",
            Distance::Node => "NODE",
            Distance::Sys => "SYS",
            Distance::Unk => "UNK",
        }
    }
}

impl fmt::Display for Distance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The coordinates of one side of a distance question.
#[derive(Debug, Clone, Copy)]
pub struct Coordinates<'a> {
    /// The device's own PCI address; `None` for a non-PCI device.
    pub address: Option<&'a str>,
    /// Upstream bridges, innermost first; `None` when the walk found none to read.
    pub bridges: Option<&'a [String]>,
    /// NUMA node; `None` when the kernel gave none.
    pub numa: Option<u32>,
}

/// The distance between two devices, from bus coordinates only.
///
/// `PIX` when they are two functions of one card or every bridge between them
/// belongs to one switch (each side hangs at most one port below the lowest
/// shared bridge); `PXB` when the shared bridge is further up; with no shared
/// bridge `NODE` on one NUMA node (PHB and NODE cannot be told apart, so the
/// further is reported) and `SYS` across nodes; `UNK` when a needed
/// coordinate is missing.
pub fn distance(a: Coordinates<'_>, b: Coordinates<'_>) -> Distance {
    between(&Placed::new(a), &Placed::new(b))
}

/// One side of [`distance`] with its address parsed once: a label that
/// compares every endpoint with every accelerator places each device once,
/// not once per pair.
#[derive(Debug, Clone, Copy)]
pub struct Placed<'a> {
    /// Domain, bus and device number: the card. `None` when the address is
    /// missing or not a PCI address.
    card: Option<(u32, u8, u8)>,
    bridges: Option<&'a [String]>,
    numa: Option<u32>,
}

impl<'a> Placed<'a> {
    /// Places a device by its coordinates.
    pub fn new(c: Coordinates<'a>) -> Self {
        Placed {
            card: c
                .address
                .and_then(parse)
                .map(|a| (a.domain, a.bus, a.device)),
            bridges: c.bridges,
            numa: c.numa,
        }
    }
}

/// [`distance`] between two placed devices.
pub fn between(a: &Placed<'_>, b: &Placed<'_>) -> Distance {
    let (Some(card_a), Some(card_b)) = (a.card, b.card) else {
        return Distance::Unk;
    };
    if card_a == card_b {
        return Distance::Pix;
    }
    let (Some(ba), Some(bb)) = (a.bridges, b.bridges) else {
        return Distance::Unk;
    };
    // Both lists are innermost first, so the shared part is a common suffix.
    let shared = ba
        .iter()
        .rev()
        .zip(bb.iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    if shared > 0 {
        let below_a = ba.len() - shared;
        let below_b = bb.len() - shared;
        return if below_a <= 1 && below_b <= 1 {
            Distance::Pix
        } else {
            Distance::Pxb
        };
    }
    match (a.numa, b.numa) {
        (Some(x), Some(y)) if x == y => Distance::Node,
        (Some(_), Some(_)) => Distance::Sys,
        _ => Distance::Unk,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(xs: &[&str]) -> Vec<String> {
        xs.iter().map(|s| s.to_string()).collect()
    }

    fn c<'a>(addr: &'a str, br: &'a [String], numa: Option<u32>) -> Coordinates<'a> {
        Coordinates {
            address: Some(addr),
            bridges: Some(br),
            numa,
        }
    }

    #[test]
    fn normalises_nvidia_smi_addresses() {
        assert_eq!(
            normalize("00000000:1B:00.0").as_deref(),
            Some("0000:1b:00.0")
        );
        assert_eq!(normalize("0000:af:00.1").as_deref(), Some("0000:af:00.1"));
        assert_eq!(normalize("1B:00.0"), None);
        assert_eq!(normalize("0000:1b:00.9"), None);
        assert_eq!(normalize("00010000:1b:00.0"), None);
    }

    #[test]
    fn walk_lists_bridges_innermost_first() {
        let p = "devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:05:00.0";
        assert_eq!(
            upstream_bridges(p).unwrap(),
            v(&["0000:02:08.0", "0000:01:00.0", "0000:00:01.0"])
        );
        assert_eq!(
            upstream_bridges("devices/pci0000:00/0000:00:1f.6").unwrap(),
            v(&[])
        );
        assert_eq!(upstream_bridges("devices/virtual/net/lo"), None);
        // a PCI device's sub-folder (net/eth0) stops the walk
        let q = "devices/pci0000:00/0000:00:01.0/0000:03:00.0/net/eth0";
        assert_eq!(upstream_bridges(q), Some(v(&["0000:00:01.0"])));
    }

    #[test]
    fn the_host_bridge_is_the_pci_segment_above_the_outermost_bridge() {
        let p = "devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/0000:3c:00.0";
        assert_eq!(host_bridge(p), Some("pci0000:3a"));
        assert_eq!(
            upstream_bridges(p).unwrap().last().map(String::as_str),
            Some("0000:3a:00.0"),
            "pciRootId is the outermost bridge, one level below"
        );
        // a VMD domain has five hex digits
        assert_eq!(
            host_bridge("devices/pci10000:00/10000:00:02.0/10000:01:00.0"),
            Some("pci10000:00")
        );
        assert_eq!(host_bridge("devices/virtual/net/lo"), None);
        assert_eq!(host_bridge("devices/platform/soc/net/eth0"), None);
        for bad in [
            "pci",
            "pci0000",
            "pci000:00",
            "pci0000:0",
            "pcixyzw:00",
            "pci0000:00:1",
        ] {
            assert!(!is_host_bridge(bad), "{bad}");
        }
    }

    #[test]
    fn distance_levels() {
        let sw1 = v(&["0000:02:00.0", "0000:01:00.0", "0000:00:01.0"]);
        let sw1b = v(&["0000:02:01.0", "0000:01:00.0", "0000:00:01.0"]);
        let nested = v(&[
            "0000:04:00.0",
            "0000:03:00.0",
            "0000:02:02.0",
            "0000:01:00.0",
            "0000:00:01.0",
        ]);
        let other = v(&["0000:80:01.0"]);
        let gpu = c("0000:05:00.0", &sw1, Some(0));
        assert_eq!(
            distance(gpu, c("0000:06:00.0", &sw1b, Some(0))),
            Distance::Pix
        );
        assert_eq!(
            distance(gpu, c("0000:05:00.1", &sw1, Some(0))),
            Distance::Pix
        );
        assert_eq!(
            distance(gpu, c("0000:07:00.0", &nested, Some(0))),
            Distance::Pxb
        );
        assert_eq!(
            distance(gpu, c("0000:81:00.0", &other, Some(0))),
            Distance::Node
        );
        assert_eq!(
            distance(gpu, c("0000:81:00.0", &other, Some(1))),
            Distance::Sys
        );
        assert_eq!(
            distance(gpu, c("0000:81:00.0", &other, None)),
            Distance::Unk
        );
        let no_pci = Coordinates {
            address: None,
            bridges: None,
            numa: Some(0),
        };
        assert_eq!(distance(gpu, no_pci), Distance::Unk);
    }

    #[test]
    fn distance_order_is_closeness() {
        assert!(
            Distance::Pix < Distance::Pxb
                && Distance::Node < Distance::Sys
                && Distance::Sys < Distance::Unk
        );
        assert_eq!(
            serde_json::to_string(&Distance::SelfDevice).unwrap(),
            "\"SELF\""
        );
    }
}
