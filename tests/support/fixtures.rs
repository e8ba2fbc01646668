//! Builds sysfs trees in the kernel's layout for tests, examples and benches.
//!
//! Everything is real files and relative symlinks, laid out as the kernel does:
//! devices live under `devices/pci<dom>:<bus>/<bridge>/…/<device>`, and
//! `bus/pci/devices/*`, `class/net/*`, `class/infiniband/*`,
//! `class/infiniband_verbs/*` and `class/misc/*` are links into that tree.
//! Included with `#[path]` by each user, so not every helper is used by each.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

/// PCI vendor IDs used by the fixtures.
pub const NVIDIA: u16 = 0x10de;
pub const MELLANOX: u16 = 0x15b3;
pub const INTEL: u16 = 0x8086;
pub const BROADCOM_PLX: u16 = 0x10b5;
pub const AMD: u16 = 0x1002;
pub const HUAWEI: u16 = 0x19e5;

/// PCI class codes used by the fixtures.
pub const CLASS_3D: u32 = 0x030200;
pub const CLASS_ETH: u32 = 0x020000;
pub const CLASS_IB: u32 = 0x020700;
pub const CLASS_BRIDGE: u32 = 0x060400;
pub const CLASS_ACCEL: u32 = 0x120000;
pub const CLASS_AUDIO: u32 = 0x040300;

/// An RDMA port as the kernel prints it: (`state`, `phys_state`).
pub const UP: (&str, &str) = ("4: ACTIVE", "5: LinkUp");
pub const DOWN: (&str, &str) = ("1: DOWN", "3: Disabled");
pub const DEFER: (&str, &str) = ("5: ACTIVE_DEFER", "5: LinkUp");

/// A sysfs tree under construction.
pub struct Tree {
    pub root: PathBuf,
    next_uverbs: std::cell::Cell<u32>,
}

/// The relative link text from the folder holding `link` to `target`, both
/// relative to the tree root (what the kernel's sysfs links look like).
/// Paths, not text: a netdev name may be any bytes but `/` and NUL.
fn relative(link: &Path, target: &Path) -> PathBuf {
    let depth = link.parent().map_or(0, |p| p.components().count());
    let mut text: PathBuf = std::iter::repeat_n("..", depth).collect();
    text.push(target);
    text
}

impl Tree {
    /// Starts a tree with the folders every kernel has.
    pub fn new(root: &Path) -> Tree {
        let t = Tree {
            root: root.to_path_buf(),
            next_uverbs: std::cell::Cell::new(0),
        };
        for d in [
            "bus/pci/devices",
            "bus/platform/devices",
            "class/net",
            "class/infiniband",
            "class/infiniband_verbs",
            "class/misc",
            "devices/virtual/net",
        ] {
            t.mkdir(d);
        }
        t
    }

    pub fn mkdir(&self, rel: &str) {
        fs::create_dir_all(self.root.join(rel)).unwrap();
    }

    /// Writes an attribute with the kernel's trailing newline.
    pub fn write(&self, rel: &str, value: &str) {
        self.write_at(Path::new(rel), value);
    }

    /// [`Tree::write`] at a path of any bytes.
    pub fn write_at(&self, rel: &Path, value: &str) {
        let p = self.root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, format!("{value}\n")).unwrap();
    }

    /// A relative symlink at `link` pointing to `target` (both root-relative).
    pub fn link(&self, link: &str, target: &str) {
        self.link_at(Path::new(link), Path::new(target));
    }

    /// [`Tree::link`] between paths of any bytes.
    pub fn link_at(&self, link: &Path, target: &Path) {
        let p = self.root.join(link);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        let _ = fs::remove_file(&p);
        symlink(relative(link, target), p).unwrap();
    }

    /// A symlink with verbatim link text (for links that escape the root).
    pub fn raw_link(&self, link: &str, text: &str) {
        let p = self.root.join(link);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        symlink(text, p).unwrap();
    }

    fn pci_attrs(&self, dir: &str, vendor: u16, device: u16, class: u32, numa: i32) {
        self.write(&format!("{dir}/vendor"), &format!("0x{vendor:04x}"));
        self.write(&format!("{dir}/device"), &format!("0x{device:04x}"));
        self.write(&format!("{dir}/class"), &format!("0x{class:06x}"));
        self.write(&format!("{dir}/numa_node"), &numa.to_string());
        let cpus = match numa {
            0 => "0-23,48-71",
            1 => "24-47,72-95",
            _ => "0-95",
        };
        self.write(&format!("{dir}/local_cpulist"), cpus);
        self.link(&format!("{dir}/subsystem"), "bus/pci");
        let addr = dir.rsplit('/').next().unwrap();
        self.link(&format!("bus/pci/devices/{addr}"), dir);
    }

    /// A PCI device at the end of `chain` (addresses outermost first: root
    /// port, switch ports …, device). Missing bridges are created as PCIe
    /// bridges on `numa`. Returns the device folder, root-relative.
    pub fn pci(&self, chain: &[&str], vendor: u16, device: u16, class: u32, numa: i32) -> String {
        let first = chain[0];
        let mut dir = format!("devices/pci{}", &first[..7]);
        for (i, addr) in chain.iter().enumerate() {
            dir = format!("{dir}/{addr}");
            let last = i + 1 == chain.len();
            if last {
                self.pci_attrs(&dir, vendor, device, class, numa);
            } else if !self.root.join(&dir).exists() {
                self.pci_attrs(&dir, BROADCOM_PLX, 0xc030, CLASS_BRIDGE, numa);
            }
        }
        dir
    }

    /// A network interface `name` on device folder `dev`.
    pub fn netdev(&self, dev: &str, name: &str, mtu: u32, up: bool) {
        self.netdev_named(dev, OsStr::new(name), mtu, up);
    }

    /// [`Tree::netdev`] with a name of any bytes the kernel allows in one
    /// (all but `/` and NUL), UTF-8 or not.
    pub fn netdev_named(&self, dev: &str, name: &OsStr, mtu: u32, up: bool) {
        let net = Path::new(dev).join("net").join(name);
        self.write_at(&net.join("mtu"), &mtu.to_string());
        self.write_at(&net.join("operstate"), if up { "up" } else { "down" });
        let flags = if up { "0x1003" } else { "0x1002" };
        self.write_at(&net.join("flags"), flags);
        self.link_at(&net.join("device"), Path::new(dev));
        self.link_at(&net.join("subsystem"), Path::new("class/net"));
        self.link_at(&Path::new("class/net").join(name), &net);
    }

    /// A software interface under `devices/virtual/net`.
    pub fn virtual_netdev(&self, name: &str) {
        let net = format!("devices/virtual/net/{name}");
        self.write(&format!("{net}/mtu"), "65536");
        self.write(&format!("{net}/operstate"), "unknown");
        self.write(&format!("{net}/flags"), "0x9");
        self.link(&format!("class/net/{name}"), &net);
    }

    /// A platform (non-PCI) device, `devices/platform/<name>`.
    pub fn platform_device(&self, name: &str, numa: i32) -> String {
        let dir = format!("devices/platform/{name}");
        self.write(&format!("{dir}/numa_node"), &numa.to_string());
        self.link(&format!("{dir}/subsystem"), "bus/platform");
        self.link(&format!("bus/platform/devices/{name}"), &dir);
        dir
    }

    /// An RDMA device `ibdev` bound to `dev`, with its ports and its verbs
    /// character device `uverbsN` (major 231, minor N).
    pub fn rdma(&self, dev: &str, ibdev: &str, ports: &[(&str, &str)]) -> u32 {
        let ib = format!("{dev}/infiniband/{ibdev}");
        for (i, (state, phys)) in ports.iter().enumerate() {
            let p = format!("{ib}/ports/{}", i + 1);
            self.write(&format!("{p}/state"), state);
            self.write(&format!("{p}/phys_state"), phys);
            self.write(&format!("{p}/link_layer"), "Ethernet");
        }
        self.write(&format!("{ib}/node_type"), "1: CA");
        self.link(&format!("{ib}/device"), dev);
        self.link(&format!("class/infiniband/{ibdev}"), &ib);
        let n = self.next_uverbs.get();
        self.next_uverbs.set(n + 1);
        let uv = format!("{dev}/infiniband_verbs/uverbs{n}");
        self.write(&format!("{uv}/ibdev"), ibdev);
        self.write(&format!("{uv}/dev"), &format!("231:{n}"));
        self.link(&format!("{uv}/device"), dev);
        self.link(&format!("class/infiniband_verbs/uverbs{n}"), &uv);
        n
    }

    /// Configures SR-IOV on `pf`: `total` possible, the given VF folders configured.
    pub fn sriov(&self, pf: &str, total: u32, vfs: &[String]) {
        self.write(&format!("{pf}/sriov_totalvfs"), &total.to_string());
        self.write(&format!("{pf}/sriov_numvfs"), &vfs.len().to_string());
        for (i, vf) in vfs.iter().enumerate() {
            self.link(&format!("{pf}/virtfn{i}"), vf);
            self.link(&format!("{vf}/physfn"), pf);
        }
    }

    /// The connection-manager device, `class/misc/rdma_cm` (major 10, minor 58).
    pub fn rdma_cm(&self) {
        let d = "devices/virtual/misc/rdma_cm";
        self.write(&format!("{d}/dev"), "10:58");
        self.link("class/misc/rdma_cm", d);
    }
}

/// Bus-number helpers: `addr(bus, dev, fn)` → `0000:bb:dd.f`.
pub fn addr(bus: u32, dev: u32, func: u32) -> String {
    format!("0000:{bus:02x}:{dev:02x}.{func:x}")
}

/// The predictable interface name the kernel gives a PCI NIC port.
pub fn nic_name(bus: u32) -> String {
    format!("enp{bus}s0np0")
}

/// An 8-GPU / 8-NIC node: each GPU shares a PCIe switch with one NIC (PIX),
/// four pairs per socket, two storage NICs on their own root ports, an
/// onboard management NIC with no bridge at all, and loopback.
pub fn gpu8_switch_paired(dir: &Path) -> Tree {
    gpu8_named(dir, |_, bus| nic_name(bus))
}

/// [`gpu8_switch_paired`] with the eight GPU-paired NICs named by
/// `name(i, bus)` (rail tests name them like rail ports).
pub fn gpu8_named(dir: &Path, name: impl Fn(u32, u32) -> String) -> Tree {
    let t = Tree::new(dir);
    t.rdma_cm();
    for i in 0..8u32 {
        let numa = (i / 4) as i32;
        let host = if i < 4 { 0x00 } else { 0x80 };
        let b = host + 0x10 * (i % 4) + 0x10;
        let rp = addr(host, 1 + i % 4, 0);
        let usp = addr(b, 0, 0);
        let gpu = [
            rp.as_str(),
            usp.as_str(),
            &addr(b + 1, 0, 0),
            &addr(b + 2, 0, 0),
        ];
        t.pci(&gpu, NVIDIA, 0x2330, CLASS_3D, numa);
        // the GPU's HDMI-audio function is not an accelerator
        let nic_chain = [
            rp.as_str(),
            usp.as_str(),
            &addr(b + 1, 1, 0),
            &addr(b + 3, 0, 0),
        ];
        let nic = t.pci(&nic_chain, MELLANOX, 0x1021, CLASS_ETH, numa);
        t.netdev(&nic, &name(i, b + 3), 9000, true);
        t.rdma(&nic, &format!("mlx5_{i}"), &[UP]);
    }
    for (j, host) in [(0u32, 0x00u32), (1, 0x80)] {
        let rp = addr(host, 5, 0);
        let nic = t.pci(
            &[rp.as_str(), &addr(host + 0x70, 0, 0)],
            MELLANOX,
            0x101d,
            CLASS_ETH,
            j as i32,
        );
        t.netdev(&nic, &nic_name(host + 0x70), 9000, true);
        t.rdma(&nic, &format!("mlx5_{}", 8 + j), &[UP]);
    }
    let mgmt = t.pci(&["0000:00:1f.6"], INTEL, 0x15b9, CLASS_ETH, 0);
    t.netdev(&mgmt, "eno1", 1500, true);
    t.virtual_netdev("lo");
    t
}

/// A node whose only RDMA devices are VFs: a PF with no RDMA of its own and
/// four VFs, one without a netdev, two with a blank NUMA node.
pub fn vf_only(dir: &Path) -> Tree {
    let t = Tree::new(dir);
    t.rdma_cm();
    let rp = addr(0x00, 2, 0);
    t.pci(
        &[
            rp.as_str(),
            &addr(0x01, 0, 0),
            &addr(0x02, 0, 0),
            &addr(0x03, 0, 0),
        ],
        NVIDIA,
        0x2330,
        CLASS_3D,
        1,
    );
    let pf = t.pci(
        &[
            rp.as_str(),
            &addr(0x01, 0, 0),
            &addr(0x02, 1, 0),
            &addr(0x04, 0, 0),
        ],
        MELLANOX,
        0x101d,
        CLASS_ETH,
        1,
    );
    t.netdev(&pf, "enp4s0f0np0", 1500, true);
    let mut vfs = Vec::new();
    for k in 0..4u32 {
        let vf = t.pci(
            &[
                rp.as_str(),
                &addr(0x01, 0, 0),
                &addr(0x02, 1, 0),
                &addr(0x04, 0, 2 + k),
            ],
            MELLANOX,
            0x101e,
            CLASS_ETH,
            if k < 2 { -1 } else { 1 },
        );
        if k != 3 {
            t.netdev(&vf, &format!("enp4s0f0v{k}"), 1500, true);
        }
        t.rdma(&vf, &format!("mlx5_{}", 1 + k), &[UP]);
        vfs.push(vf);
    }
    t.sriov(&pf, 8, &vfs);
    t
}

/// One GPU and one NIC under one switch whose single port is `port`.
pub fn single_port(dir: &Path, port: (&str, &str)) -> Tree {
    let t = Tree::new(dir);
    let rp = addr(0x00, 1, 0);
    t.pci(
        &[
            rp.as_str(),
            &addr(0x01, 0, 0),
            &addr(0x02, 0, 0),
            &addr(0x03, 0, 0),
        ],
        NVIDIA,
        0x2330,
        CLASS_3D,
        0,
    );
    let nic = t.pci(
        &[
            rp.as_str(),
            &addr(0x01, 0, 0),
            &addr(0x02, 1, 0),
            &addr(0x04, 0, 0),
        ],
        MELLANOX,
        0x1021,
        CLASS_ETH,
        0,
    );
    t.netdev(&nic, "enp4s0np0", 4200, true);
    t.rdma(&nic, "mlx5_0", &[port]);
    t
}

/// A dual-port NIC whose every port is down, and a second NIC whose link is
/// up: the node keeps `rdma.capable`, the broken one is `Failed`.
pub fn all_ports_down(dir: &Path, with_working_nic: bool) -> Tree {
    let t = Tree::new(dir);
    let nic = t.pci(
        &[&addr(0x00, 1, 0), &addr(0x01, 0, 0)],
        MELLANOX,
        0x1017,
        CLASS_ETH,
        0,
    );
    t.netdev(&nic, "enp1s0np0", 1500, false);
    t.rdma(&nic, "mlx5_0", &[DOWN, ("1: DOWN", "2: Polling")]);
    if with_working_nic {
        let ok = t.pci(
            &[&addr(0x80, 1, 0), &addr(0x81, 0, 0)],
            MELLANOX,
            0x1017,
            CLASS_ETH,
            1,
        );
        t.netdev(&ok, "enp129s0np0", 1500, true);
        t.rdma(&ok, "mlx5_1", &[UP]);
    }
    t
}

/// A port that cannot be read (its `state` is a dangling link, which even
/// root cannot read) beside a port that is down: `Unverified`, not `Failed`.
pub fn unreadable_port(dir: &Path) -> Tree {
    let t = Tree::new(dir);
    let nic = t.pci(
        &[&addr(0x00, 1, 0), &addr(0x01, 0, 0)],
        MELLANOX,
        0x1017,
        CLASS_ETH,
        0,
    );
    t.netdev(&nic, "enp1s0np0", 1500, true);
    t.rdma(&nic, "mlx5_0", &[DOWN, DOWN]);
    let state = format!("{nic}/infiniband/mlx5_0/ports/2/state");
    fs::remove_file(t.root.join(&state)).unwrap();
    t.raw_link(&state, "state.gone");
    t
}

/// NICs and no accelerator: `rdma.distance` is omitted.
pub fn no_accelerator(dir: &Path) -> Tree {
    let t = Tree::new(dir);
    for (i, host) in [0x00u32, 0x80].into_iter().enumerate() {
        let nic = t.pci(
            &[&addr(host, 1, 0), &addr(host + 1, 0, 0)],
            MELLANOX,
            0x1021,
            CLASS_ETH,
            i as i32,
        );
        t.netdev(&nic, &nic_name(host + 1), 9000, true);
        t.rdma(&nic, &format!("mlx5_{i}"), &[UP]);
    }
    // an NVIDIA audio function and an NVSwitch-class bridge are not accelerators
    t.pci(
        &[&addr(0x00, 3, 0), &addr(0x05, 0, 1)],
        NVIDIA,
        0x22ba,
        CLASS_AUDIO,
        0,
    );
    t.pci(
        &[&addr(0x00, 4, 0), &addr(0x06, 0, 0)],
        NVIDIA,
        0x22a3,
        0x068000,
        0,
    );
    t
}

/// The byte names of [`byte_names`]' two NICs, with their RDMA devices.
pub const BYTE_NAMES: [(&[u8], &str); 2] = [(b"eth\xff0", "mlx5_0"), (b"eth\\xff0", "mlx5_1")];

/// Two NICs named as the kernel allows and text does not hold as it is:
/// `eth<0xff>0`, which is not UTF-8, and the text `eth\xff0` (a backslash is
/// allowed too), which the first one's escaped text must not be taken for.
pub fn byte_names(dir: &Path) -> Tree {
    use std::os::unix::ffi::OsStrExt;
    let t = Tree::new(dir);
    for (bus, (name, ibdev)) in (1..).zip(BYTE_NAMES) {
        let nic = t.pci(
            &[&addr(0, bus, 0), &addr(bus, 0, 0)],
            MELLANOX,
            0x1017,
            CLASS_ETH,
            0,
        );
        t.netdev_named(&nic, OsStr::from_bytes(name), 9000, true);
        t.rdma(&nic, ibdev, &[UP]);
    }
    t
}

/// Every device reports NUMA node -1 (the kernel gave none).
pub fn blank_numa(dir: &Path) -> Tree {
    let t = Tree::new(dir);
    t.pci(
        &[&addr(0x00, 1, 0), &addr(0x01, 0, 0)],
        NVIDIA,
        0x2330,
        CLASS_3D,
        -1,
    );
    let nic = t.pci(
        &[&addr(0x00, 2, 0), &addr(0x02, 0, 0)],
        MELLANOX,
        0x1021,
        CLASS_ETH,
        -1,
    );
    t.netdev(&nic, "enp2s0np0", 9000, true);
    t.rdma(&nic, "mlx5_0", &[UP]);
    t
}

/// A GPU two switches deep and a NIC on the outer switch: `PXB`.
pub fn nested_switches(dir: &Path) -> Tree {
    let t = Tree::new(dir);
    let rp = addr(0x00, 1, 0);
    let outer = [
        rp.clone(),
        addr(0x01, 0, 0),
        addr(0x02, 0, 0),
        addr(0x03, 0, 0),
        addr(0x04, 0, 0),
    ];
    let mut gpu: Vec<&str> = outer.iter().map(String::as_str).collect();
    let g = addr(0x05, 0, 0);
    gpu.push(&g);
    t.pci(&gpu, AMD, 0x74a1, CLASS_ACCEL, 0);
    let nic = t.pci(
        &[
            rp.as_str(),
            &addr(0x01, 0, 0),
            &addr(0x02, 1, 0),
            &addr(0x06, 0, 0),
        ],
        MELLANOX,
        0x1021,
        CLASS_ETH,
        0,
    );
    t.netdev(&nic, "enp6s0np0", 9000, true);
    t.rdma(&nic, "mlx5_0", &[UP]);
    t
}

/// An RDMA port on a platform device (not on the PCI bus), beside an Ascend
/// NPU, a virtio NIC and loopback.
pub fn non_pci(dir: &Path) -> Tree {
    let t = Tree::new(dir);
    t.pci(
        &[&addr(0x00, 0, 0), &addr(0x01, 0, 0)],
        HUAWEI,
        0xd802,
        CLASS_ACCEL,
        0,
    );
    let plat = t.platform_device("hisi-roce.0", 0);
    t.netdev(&plat, "eth0", 1500, true);
    t.rdma(&plat, "hns_0", &[UP]);
    // a virtio NIC: its device sits on the virtio bus under a PCI function
    let vpci = t.pci(&[&addr(0x00, 3, 0)], 0x1af4, 0x1041, CLASS_ETH, -1);
    let virtio = format!("{vpci}/virtio0");
    t.link(&format!("{virtio}/subsystem"), "bus/virtio");
    t.mkdir("bus/virtio");
    t.netdev(&virtio, "ens3", 1500, true);
    t.virtual_netdev("lo");
    t
}

/// Hostile and broken entries: an interface link escaping the root, a
/// port attribute over 64 KiB, beside one good NIC.
pub fn hostile(dir: &Path) -> Tree {
    let t = single_port(dir, UP);
    t.raw_link("class/net/evil", "../../../../../../../../etc");
    let nic = t.pci(
        &[&addr(0x00, 2, 0), &addr(0x09, 0, 0)],
        MELLANOX,
        0x1021,
        CLASS_ETH,
        0,
    );
    t.netdev(&nic, "enp9s0np0", 1500, true);
    t.rdma(&nic, "mlx5_9", &[DOWN]);
    t.write(
        &format!("{nic}/infiniband/mlx5_9/ports/1/state"),
        &"X".repeat(70 * 1024),
    );
    t
}

/// A large node for benchmarks: `endpoints` RDMA endpoints (PFs, each with
/// VFs past the first 8 endpoints) spread across two sockets, 8 GPUs.
pub fn large(dir: &Path, endpoints: u32) -> Tree {
    let t = Tree::new(dir);
    t.rdma_cm();
    let pfs = endpoints.min(8);
    let vfs_total = endpoints - pfs;
    for i in 0..8u32 {
        let host = if i < 4 { 0x00 } else { 0x80 };
        let b = host + 0x10 * (i % 4) + 0x10;
        let rp = addr(host, 1 + i % 4, 0);
        t.pci(
            &[
                rp.as_str(),
                &addr(b, 0, 0),
                &addr(b + 1, 0, 0),
                &addr(b + 2, 0, 0),
            ],
            NVIDIA,
            0x2330,
            CLASS_3D,
            (i / 4) as i32,
        );
    }
    for i in 0..pfs {
        let host = if i < 4 { 0x00 } else { 0x80 };
        let b = host + 0x10 * (i % 4) + 0x10;
        let rp = addr(host, 1 + i % 4, 0);
        let nic_chain = [
            rp.as_str(),
            &addr(b, 0, 0),
            &addr(b + 1, 1, 0),
            &addr(b + 3, 0, 0),
        ];
        let pf = t.pci(&nic_chain, MELLANOX, 0x1021, CLASS_ETH, (i / 4) as i32);
        t.netdev(&pf, &nic_name(b + 3), 9000, true);
        let per_pf = vfs_total / pfs + u32::from(i < vfs_total % pfs);
        if per_pf == 0 {
            t.rdma(&pf, &format!("mlx5_{i}"), &[UP]);
            continue;
        }
        let mut vfs = Vec::new();
        for k in 0..per_pf {
            // VFs on the buses after the PF's, 8 functions per device slot
            let vbus = b + 4 + k / 256;
            let vf_addr = addr(vbus, (k % 256) / 8, k % 8);
            let vf = t.pci(
                &[rp.as_str(), &addr(b, 0, 0), &addr(b + 1, 1, 0), &vf_addr],
                MELLANOX,
                0x101e,
                CLASS_ETH,
                (i / 4) as i32,
            );
            t.netdev(&vf, &format!("{}v{k}", nic_name(b + 3)), 9000, true);
            t.rdma(&vf, &format!("mlx5_{i}_{k}"), &[UP]);
            vfs.push(vf);
        }
        t.sriov(&pf, per_pf.max(8), &vfs);
    }
    t.pci_configs();
    t
}

impl Tree {
    /// A `config` file for every PCI function of the tree, as real sysfs has
    /// and as `lspci` needs to read a tree (the benchmark runs it beside
    /// discovery): the standard 256-byte header with the function's vendor,
    /// device and class, and for a bridge its primary, secondary and
    /// subordinate bus numbers, taken from the folders nested under it.
    /// Beside it, the `revision`, `subsystem_vendor` and `subsystem_device`
    /// attributes the kernel gives every PCI function: `lspci -tv` on a real
    /// node opens all three for each function, and where they are missing it
    /// stops at the first and skips the other two, so a tree without them
    /// would time it doing less than it does on any real node.
    pub fn pci_configs(&self) {
        let bus = |addr: &str| u8::from_str_radix(&addr[5..7], 16).unwrap();
        let is_addr =
            |n: &str| n.len() == 12 && n.as_bytes()[4] == b':' && n.as_bytes()[10] == b'.';
        for entry in fs::read_dir(self.root.join("bus/pci/devices")).unwrap() {
            let dir = fs::canonicalize(entry.unwrap().path()).unwrap();
            let hex = |name: &str| {
                u32::from_str_radix(
                    fs::read_to_string(dir.join(name))
                        .unwrap()
                        .trim()
                        .trim_start_matches("0x"),
                    16,
                )
                .unwrap()
            };
            let (vendor, device, class) = (hex("vendor"), hex("device"), hex("class"));
            let mut c = [0u8; 256];
            c[0..2].copy_from_slice(&(vendor as u16).to_le_bytes());
            c[2..4].copy_from_slice(&(device as u16).to_le_bytes());
            c[4] = 0x06; // memory space and bus master on
            c[9..12].copy_from_slice(&class.to_le_bytes()[..3]); // prog-if, subclass, class
                                                                 // Revision 0 (byte 8, left zero). An endpoint's subsystem IDs
                                                                 // repeat its own, as a vendor's reference board does; a bridge's
                                                                 // header has no such field (only a capability, not modelled
                                                                 // here, would give them), so the kernel prints 0 for it.
            let bridge = class >> 8 == 0x0604;
            let (sub_vendor, sub_device) = if bridge {
                (0, 0)
            } else {
                (vendor as u16, device as u16)
            };
            if !bridge {
                c[0x2c..0x2e].copy_from_slice(&sub_vendor.to_le_bytes());
                c[0x2e..0x30].copy_from_slice(&sub_device.to_le_bytes());
            }
            fs::write(dir.join("revision"), "0x00\n").unwrap();
            fs::write(
                dir.join("subsystem_vendor"),
                format!("0x{sub_vendor:04x}\n"),
            )
            .unwrap();
            fs::write(
                dir.join("subsystem_device"),
                format!("0x{sub_device:04x}\n"),
            )
            .unwrap();
            if bridge {
                // Every PCI address below the bridge, at any depth, is on
                // a bus it forwards to.
                let mut below = Vec::new();
                let mut pending = vec![dir.clone()];
                while let Some(d) = pending.pop() {
                    for e in fs::read_dir(&d).unwrap() {
                        let e = e.unwrap();
                        let name = e.file_name().to_string_lossy().into_owned();
                        if is_addr(&name) && e.file_type().unwrap().is_dir() {
                            below.push(bus(&name));
                            pending.push(e.path());
                        }
                    }
                }
                let own = dir.file_name().unwrap().to_string_lossy().into_owned();
                c[0x0e] = 1; // header type 1: PCI-to-PCI bridge
                c[0x18] = bus(&own);
                c[0x19] = below.iter().copied().min().unwrap_or(0);
                c[0x1a] = below.iter().copied().max().unwrap_or(0);
            }
            fs::write(dir.join("config"), c).unwrap();
        }
    }
}

/// AMD accelerators, one per hive id given (`None`: no xgmi_hive_info at all).
pub fn amd_hives(dir: &Path, hives: &[Option<&str>]) -> Tree {
    let t = Tree::new(dir);
    for (i, hive) in hives.iter().enumerate() {
        let i = i as u32;
        let dev = t.pci(
            &[&addr(0x00, 1 + i, 0), &addr(0x10 * (i + 1), 0, 0)],
            AMD,
            0x74a1,
            CLASS_ACCEL,
            0,
        );
        if let Some(h) = hive {
            t.write(&format!("{dev}/xgmi_hive_info/xgmi_hive_id"), h);
        }
    }
    t
}

/// `nvidia-smi -q` text for the gpu8 fixture's GPUs, in the tool's layout;
/// `fabric(i)` gives GPU i's (state, status, clique, cluster uuid).
pub fn nvsmi_q(
    fabric: impl Fn(u32) -> (&'static str, &'static str, &'static str, &'static str),
) -> String {
    let mut s = String::from("\n==============NVSMI LOG==============\n\nTimestamp                                 : Mon Mar  2 12:00:00 2026\nDriver Version                            : 570.86.15\nCUDA Version                              : 12.8\n\nAttached GPUs                             : 8\n");
    for i in 0..8u32 {
        let host = if i < 4 { 0x00 } else { 0x80 };
        let bus = host + 0x10 * (i % 4) + 0x10 + 2;
        let (state, status, clique, uuid) = fabric(i);
        s.push_str(&format!(
            "GPU 00000000:{bus:02X}:00.0\n    Product Name                          : NVIDIA H100 80GB HBM3\n    Persistence Mode                      : Enabled\n    Fabric\n        State                             : {state}\n        Status                            : {status}\n        CliqueId                          : {clique}\n        ClusterUUID                       : {uuid}\n        Health\n            Bandwidth                     : Full\n    Processes                             : None\n\n"
        ));
    }
    s
}
