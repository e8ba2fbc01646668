//! The typed contract between the CDI specs the publisher writes and every
//! reader of them (the device plugin, the DRA driver): what one CDI device
//! says about its RDMA endpoint, in its `rdma.gpustack.ai/*` annotations.
//!
//! The writer serialises an [`EndpointAnnotations`] and every reader
//! deserialises one, so a key is spelt in one place and a value that does not
//! parse is an error naming the key and the text, never a silent default.
//!
//! | key (after `rdma.gpustack.ai/`) | value | written |
//! |---|---|---|
//! | `rdma-device` | the RDMA device (`mlx5_0`), the CDI device's name | always |
//! | `link` | the link verdict: `OK`, `Unverified` or `Failed` | always |
//! | `link-layer` | the ports' link layer as the kernel prints it (`InfiniBand`, `Ethernet`) | when every readable port agrees |
//! | `pci-address` | `DDDD:BB:DD.F` | PCI endpoints |
//! | `pcie-root` | the host bridge, `pciDDDD:BB` | PCI endpoints |
//! | `numa` | the NUMA node (a VF with none takes its PF's) | when the kernel gave one |
//! | `interface` | the netdev name(s), `+`-joined when one RDMA device has several, each as the record writes it (a byte that is not UTF-8 as `\xNN`, a backslash as `\\`) | when it has one |
//! | `parent` | a VF's PF, `DDDD:BB:DD.F` | VFs |
//!
//! Keys under the prefix that this release does not know are ignored, so a
//! newer publisher's specs still read.

use crate::names;
use crate::pci;
use crate::record::LinkState;
use std::collections::BTreeMap;

/// The annotation-key prefix of the device annotations.
pub const PREFIX: &str = "rdma.gpustack.ai";

/// One annotation of the contract: the key is spelt only here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    /// `rdma-device`.
    RdmaDevice,
    /// `pci-address`.
    PciAddress,
    /// `pcie-root`.
    PcieRoot,
    /// `numa`.
    Numa,
    /// `link`.
    Link,
    /// `link-layer`.
    LinkLayer,
    /// `interface`.
    Interface,
    /// `parent`.
    Parent,
    /// `ports`.
    Ports,
}

impl Key {
    /// The full annotation key, `rdma.gpustack.ai/<name>`.
    pub fn as_str(self) -> &'static str {
        match self {
            Key::RdmaDevice => "rdma.gpustack.ai/rdma-device",
            Key::PciAddress => "rdma.gpustack.ai/pci-address",
            Key::PcieRoot => "rdma.gpustack.ai/pcie-root",
            Key::Numa => "rdma.gpustack.ai/numa",
            Key::Link => "rdma.gpustack.ai/link",
            Key::LinkLayer => "rdma.gpustack.ai/link-layer",
            Key::Interface => "rdma.gpustack.ai/interface",
            Key::Parent => "rdma.gpustack.ai/parent",
            Key::Ports => "rdma.gpustack.ai/ports",
        }
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The separator between the interface names of one RDMA device (a `,`
/// would read as a list separator to annotation consumers).
pub const INTERFACE_SEPARATOR: char = '+';

/// What one CDI device says about its RDMA endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointAnnotations {
    /// The RDMA device (`mlx5_0`): the CDI device name and the `NCCL_IB_HCA` entry.
    pub rdma_device: String,
    /// The endpoint's PCI address, for a PCI device.
    pub pci_address: Option<String>,
    /// The PCIe host bridge (`pci0000:00`), the DRA `pcieRoot` attribute.
    pub pcie_root: Option<String>,
    /// The NUMA node for topology hints; `None` attaches none.
    pub numa: Option<u32>,
    /// The link verdict, the same as the labels' and the record's.
    pub link: LinkState,
    /// The ports' link layer (`InfiniBand`, `Ethernet`), when known.
    pub link_layer: Option<String>,
    /// The netdev names bound to the RDMA device, sorted; empty when none.
    pub interfaces: Vec<String>,
    /// For a VF: its PF's PCI address.
    pub parent: Option<String>,
    /// The ports' states as read, `1=DOWN/Disabled,2=ACTIVE/LinkUp`
    /// ([`ports_summary`]): what a link verdict rests on, for the DRA
    /// driver's taints and health messages. Absent in older specs.
    pub ports: Option<String>,
}

/// The longest `ports` annotation read: a few ports' state words.
pub const MAX_PORTS_LEN: usize = 256;

/// The ports of a link verdict as one annotation value: each port as
/// `N=state/phys_state` with the kernel's number prefix dropped (`4: ACTIVE`
/// becomes `ACTIVE`), an unreadable value as `unreadable`, joined by `,`.
pub fn ports_summary(ports: &[crate::record::PortReading]) -> Option<String> {
    let word = |v: &Option<String>| {
        v.as_deref().map_or("unreadable".to_string(), |v| {
            let w = v.split_once(": ").map_or(v, |(_, w)| w).trim();
            w.chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                .collect()
        })
    };
    let out: Vec<String> = ports
        .iter()
        .map(|p| format!("{}={}/{}", p.port, word(&p.state), word(&p.phys_state)))
        .collect();
    let out = out.join(",");
    (!out.is_empty() && is_ports(&out)).then_some(out)
}

/// The `ports` grammar: ASCII letters, digits and `= / , _ .`, bounded.
fn is_ports(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_PORTS_LEN
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"=/,_.".contains(&b))
}

/// Why a CDI device's annotations do not make an [`EndpointAnnotations`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnnotationError {
    /// A key the writer always sets is absent.
    #[error("annotation {key} is missing")]
    Missing {
        /// The missing key.
        key: Key,
    },
    /// A key holds text that is not its kind of value.
    #[error("annotation {key} is {value:?}, {expected}")]
    Malformed {
        /// The key.
        key: Key,
        /// The text found.
        value: String,
        /// What it should have been.
        expected: &'static str,
    },
}

impl EndpointAnnotations {
    /// The annotations to write on the endpoint's CDI device.
    pub fn to_map(&self) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        let mut put = |k: Key, v: String| {
            m.insert(k.as_str().to_string(), v);
        };
        put(Key::RdmaDevice, self.rdma_device.clone());
        if let Some(pci) = &self.pci_address {
            put(Key::PciAddress, pci.clone());
        }
        if let Some(root) = &self.pcie_root {
            put(Key::PcieRoot, root.clone());
        }
        if let Some(numa) = self.numa {
            put(Key::Numa, numa.to_string());
        }
        put(Key::Link, self.link.as_str().to_string());
        if let Some(layer) = &self.link_layer {
            put(Key::LinkLayer, layer.clone());
        }
        if !self.interfaces.is_empty() {
            put(
                Key::Interface,
                self.interfaces.join(&INTERFACE_SEPARATOR.to_string()),
            );
        }
        if let Some(parent) = &self.parent {
            put(Key::Parent, parent.clone());
        }
        if let Some(ports) = &self.ports {
            put(Key::Ports, ports.clone());
        }
        m
    }

    /// Reads the annotations of a CDI device named `device`: every value is
    /// checked against its grammar, and the `rdma-device` annotation must
    /// name the device itself.
    pub fn from_map(
        device: &str,
        map: &BTreeMap<String, String>,
    ) -> Result<EndpointAnnotations, AnnotationError> {
        let get = |k: Key| map.get(k.as_str()).map(String::as_str);
        let malformed =
            |key: Key, value: &str, expected: &'static str| AnnotationError::Malformed {
                key,
                value: value.to_string(),
                expected,
            };
        let required = |k: Key| get(k).ok_or(AnnotationError::Missing { key: k });
        let pci_address = |k: Key| -> Result<Option<String>, AnnotationError> {
            match get(k) {
                Some(v) if pci::is_pci_address(v) => Ok(Some(v.to_string())),
                Some(v) => Err(malformed(k, v, "expected a PCI address DDDD:BB:DD.F")),
                None => Ok(None),
            }
        };

        let rdma_device = required(Key::RdmaDevice)?;
        if rdma_device != device || !names::is_cdi_device_name(rdma_device) {
            return Err(malformed(
                Key::RdmaDevice,
                rdma_device,
                "expected the CDI device's own name",
            ));
        }
        let link = required(Key::Link)?;
        let link = parse_link(link)
            .ok_or_else(|| malformed(Key::Link, link, "expected OK, Unverified or Failed"))?;
        let link_layer = match get(Key::LinkLayer) {
            Some(v) if is_link_layer(v) => Some(v.to_string()),
            Some(v) => {
                return Err(malformed(
                    Key::LinkLayer,
                    v,
                    "expected a link layer such as InfiniBand or Ethernet",
                ))
            }
            None => None,
        };
        let pcie_root = match get(Key::PcieRoot) {
            Some(v) if pci::is_host_bridge(v) => Some(v.to_string()),
            Some(v) => return Err(malformed(Key::PcieRoot, v, "expected pciDDDD:BB")),
            None => None,
        };
        let numa = match get(Key::Numa) {
            Some(v) => Some(
                v.parse::<u32>()
                    .map_err(|_| malformed(Key::Numa, v, "expected a NUMA node number"))?,
            ),
            None => None,
        };
        let interfaces = match get(Key::Interface) {
            Some(v) => {
                let names: Vec<String> = v.split(INTERFACE_SEPARATOR).map(str::to_string).collect();
                if names.iter().any(String::is_empty) {
                    return Err(malformed(
                        Key::Interface,
                        v,
                        "expected interface names joined by +",
                    ));
                }
                names
            }
            None => Vec::new(),
        };
        let ports = match get(Key::Ports) {
            Some(v) if is_ports(v) => Some(v.to_string()),
            Some(v) => {
                return Err(malformed(
                    Key::Ports,
                    v,
                    "expected port states such as 1=ACTIVE/LinkUp",
                ))
            }
            None => None,
        };
        Ok(EndpointAnnotations {
            rdma_device: rdma_device.to_string(),
            ports,
            pci_address: pci_address(Key::PciAddress)?,
            pcie_root,
            numa,
            link,
            link_layer,
            interfaces,
            parent: pci_address(Key::Parent)?,
        })
    }
}

/// A link layer as the kernel spells one: a short word of ASCII letters
/// (`InfiniBand`, `Ethernet`, `Unknown`).
pub fn is_link_layer(s: &str) -> bool {
    !s.is_empty() && s.len() <= 32 && s.bytes().all(|b| b.is_ascii_alphabetic())
}

/// The verdict from its annotation spelling ([`LinkState::as_str`]).
fn parse_link(s: &str) -> Option<LinkState> {
    [LinkState::Ok, LinkState::Unverified, LinkState::Failed]
        .into_iter()
        .find(|l| l.as_str() == s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vf() -> EndpointAnnotations {
        EndpointAnnotations {
            rdma_device: "mlx5_3".into(),
            pci_address: Some("0000:04:00.2".into()),
            pcie_root: Some("pci0000:00".into()),
            numa: Some(1),
            link: LinkState::Failed,
            link_layer: Some("Ethernet".into()),
            interfaces: vec!["ens1f0v1".into()],
            parent: Some("0000:04:00.0".into()),
            ports: Some("1=ACTIVE/LinkUp".into()),
        }
    }

    #[test]
    fn a_link_layer_that_is_not_a_word_is_refused_naming_the_key() {
        let mut map = vf().to_map();
        map.insert(Key::LinkLayer.as_str().into(), "Ether net;rm".into());
        let e = EndpointAnnotations::from_map("mlx5_3", &map).unwrap_err();
        assert!(e.to_string().contains("rdma.gpustack.ai/link-layer"), "{e}");
    }

    #[test]
    fn the_ports_summary_drops_the_kernels_numbers_and_says_unreadable() {
        use crate::record::PortReading;
        let port = |n: &str, state: Option<&str>, phys: Option<&str>| PortReading {
            port: n.into(),
            state: state.map(str::to_string),
            phys_state: phys.map(str::to_string),
            link_layer: None,
        };
        let ports = [
            port("1", Some("1: DOWN"), Some("3: Disabled")),
            port("2", None, Some("5: LinkUp")),
        ];
        assert_eq!(
            ports_summary(&ports).as_deref(),
            Some("1=DOWN/Disabled,2=unreadable/LinkUp")
        );
        assert_eq!(ports_summary(&[]), None);
        let odd = [port("1", Some("4: ACTIVE (odd) \u{1b}"), Some("x"))];
        let s = ports_summary(&odd).unwrap();
        assert!(is_ports(&s), "{s}");
        let mut map = vf().to_map();
        map.insert("rdma.gpustack.ai/ports".into(), "1=DOWN Disabled".into());
        assert!(EndpointAnnotations::from_map("mlx5_3", &map).is_err());
    }

    #[test]
    fn every_field_round_trips_through_the_annotations() {
        let dual = EndpointAnnotations {
            rdma_device: "mlx5_0".into(),
            pci_address: None,
            pcie_root: None,
            numa: None,
            link: LinkState::Unverified,
            link_layer: None,
            interfaces: vec!["ib0".into(), "ib0.8001".into()],
            parent: None,
            ports: None,
        };
        for a in [vf(), dual] {
            let map = a.to_map();
            assert_eq!(
                EndpointAnnotations::from_map(&a.rdma_device, &map),
                Ok(a.clone())
            );
        }
        let map = vf().to_map();
        assert_eq!(map["rdma.gpustack.ai/link"], "Failed");
        assert_eq!(map["rdma.gpustack.ai/pcie-root"], "pci0000:00");
        assert_eq!(map["rdma.gpustack.ai/link-layer"], "Ethernet");
        assert_eq!(map["rdma.gpustack.ai/ports"], "1=ACTIVE/LinkUp");
        assert_eq!(map.len(), 9);
    }

    #[test]
    fn a_missing_or_malformed_annotation_names_its_key_and_value() {
        let err = |edit: &dyn Fn(&mut BTreeMap<String, String>)| {
            let mut m = vf().to_map();
            edit(&mut m);
            EndpointAnnotations::from_map("mlx5_3", &m)
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            err(&|m| {
                m.remove(Key::Link.as_str());
            }),
            "annotation rdma.gpustack.ai/link is missing"
        );
        assert_eq!(
            err(&|m| {
                m.insert(Key::Link.as_str().into(), "failed".into());
            }),
            "annotation rdma.gpustack.ai/link is \"failed\", expected OK, Unverified or Failed"
        );
        for (key, value) in [
            (Key::Numa, "-1"),
            (Key::Numa, "one"),
            (Key::PciAddress, "04:00.2"),
            (Key::Parent, "0000:04:00"),
            (Key::PcieRoot, "0000:00"),
            (Key::Interface, "a++b"),
            (Key::RdmaDevice, "mlx5_4"),
        ] {
            let text = err(&|m| {
                m.insert(key.as_str().into(), value.into());
            });
            assert!(
                text.starts_with(&format!("annotation {key} is {value:?}, expected")),
                "{text}"
            );
        }
        // keys this release does not know are a newer writer's, not an error
        let mut m = vf().to_map();
        m.insert("rdma.gpustack.ai/rail".into(), "rail-3".into());
        assert_eq!(EndpointAnnotations::from_map("mlx5_3", &m), Ok(vf()));
    }
}
