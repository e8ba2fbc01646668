//! Every attribute name the driver publishes, in one place: the pool
//! (devices.rs) writes only these, docs/conformance.md checks the standard
//! ones against upstream, and the deploy tests check that the shipped
//! DeviceClasses and example claims name only these, so a renamed
//! attribute cannot leave a selector reading a name no device has (which
//! aborts the allocation of the whole claim).

/// Kubernetes' own attribute domain: `resource.kubernetes.io/pcieRoot` is
/// what lets a claim match a GPU of another driver with the NIC beside it.
pub const STANDARD_DOMAIN: &str = "resource.kubernetes.io";

/// The PCIe root the device sits under (`pci0000:00`), as upstream's
/// deviceattribute helper and NVIDIA's GPU driver name it.
pub const PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";

/// The device's PCI address (`0000:3b:00.0`), standard from 1.36.
pub const PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";

/// The NUMA node under the name NVIDIA's GPU driver and dranet publish it
/// (KEP-6072's proposal; not yet an upstream constant), so a claim can
/// pair a GPU and a NIC by NUMA node with `matchAttribute`.
pub const NUMA_NODE: &str = "resource.kubernetes.io/numaNode";

/// The driver's own NUMA node attribute, kept beside the standard one
/// because claims written before it select on it.
pub const OWN_NUMA_NODE: &str = "numaNode";

/// The RDMA device (`mlx5_0`).
pub const RDMA_DEVICE: &str = "rdmaDevice";

/// The network interfaces, joined by `+`.
pub const IF_NAME: &str = "ifName";

/// The link verdict (`OK`, `Unverified`, `Failed`) the DeviceClasses test.
pub const LINK_STATE: &str = "linkState";

/// The ports' link layer (`InfiniBand`, `Ethernet`).
pub const LINK_LAYER: &str = "linkLayer";

/// Whether the device is an SR-IOV VF: what tells the two classes apart.
pub const VIRTUAL_FUNCTION: &str = "virtualFunction";

/// A VF's PF's PCI address.
pub const PARENT_PCI_BUS_ID: &str = "parentPciBusID";

/// The rail the rail record puts the NIC on.
pub const RAIL: &str = "rail";

/// The standard attributes, fully qualified, as devices carry them.
pub const STANDARD: [&str; 3] = [PCIE_ROOT, PCI_BUS_ID, NUMA_NODE];

/// The driver's own attributes, bare (the API reads them as in the
/// driver's domain).
pub const OWN: [&str; 8] = [
    OWN_NUMA_NODE,
    RDMA_DEVICE,
    IF_NAME,
    LINK_STATE,
    LINK_LAYER,
    VIRTUAL_FUNCTION,
    PARENT_PCI_BUS_ID,
    RAIL,
];

/// Whether `domain`/`name` (as a CEL selector or a `matchAttribute`
/// names it) is an attribute this driver, named `driver`, publishes.
pub fn is_published(driver: &str, domain: &str, name: &str) -> bool {
    if domain == STANDARD_DOMAIN {
        STANDARD.contains(&format!("{domain}/{name}").as_str())
    } else {
        domain == driver && OWN.contains(&name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_names_are_in_the_standard_domain_and_own_names_are_bare() {
        for name in STANDARD {
            let (domain, id) = name.split_once('/').unwrap();
            assert_eq!(domain, STANDARD_DOMAIN);
            assert!(is_published("rdma.gpustack.ai", domain, id), "{name}");
        }
        for name in OWN {
            assert!(!name.contains('/'), "{name}");
            assert!(is_published("rdma.gpustack.ai", "rdma.gpustack.ai", name));
            assert!(!is_published("other.example", "rdma.gpustack.ai", name));
        }
        assert!(!is_published("rdma.gpustack.ai", STANDARD_DOMAIN, "numa"));
        assert!(!is_published(
            "rdma.gpustack.ai",
            "rdma.gpustack.ai",
            "linkstate"
        ));
    }
}
