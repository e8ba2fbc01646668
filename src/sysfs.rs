//! Bounded, root-confined reads of a sysfs tree.
//!
//! Every read of the host goes through [`SysRoot`]. A sysfs path is a chain of
//! symlinks (`class/net/eth0/device` → `../../../devices/pci0000:00/…`), so each
//! read resolves the whole chain first and refuses a path that lands outside the
//! root. That is what lets a captured tree under `/tmp/node` read exactly like the
//! live `/sys`, and what stops a hostile link in a captured tree from making us
//! read `/etc/shadow`. One attribute read is capped at [`MAX_ATTR_BYTES`].
//!
//! Paths and names cross this module as text, each name escaped as
//! [`crate::escape`] writes it: a netdev may be named with bytes that are not
//! UTF-8, and its text must lead back to exactly those bytes. Every name
//! read from the kernel (a listing, a link's text, a resolved path) is
//! escaped here, and every path handed to the kernel is its bytes again.
//!
//! The work is split by concern: [`resolve`] finds where a path leads
//! (the pass's cache of resolved folders, the kernel's links read one at a
//! time, the full walk that names a fault); [`read`] opens, reads and lists
//! what a path names, bounded; [`kernel`] holds the system calls under
//! both (`openat2(2)` beneath the root, paths as C strings, `statfs`);
//! [`trust`] is what discovery presumes of link targets until its reads
//! prove it; [`record`] is what a recording tree keeps for `capture`.

mod kernel;
mod read;
mod record;
mod resolve;
mod trust;

pub use kernel::is_mounted_sysfs;
pub use record::{Entry, Recorded};
pub use resolve::BuildPathHash;

use std::fs;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The largest attribute we read; sysfs attributes are a page at most, so a
/// larger file is not an attribute and is refused rather than truncated.
pub const MAX_ATTR_BYTES: u64 = 64 * 1024;

/// Why a sysfs path could not be read; every variant names the path.
#[derive(Debug, thiserror::Error)]
pub enum SysError {
    /// The symlink chain resolves to a place outside the tree root.
    #[error("{path}: resolves outside the sysfs root")]
    Escapes {
        /// The path as asked for, relative to the root.
        path: String,
        /// Where the chain landed.
        target: String,
        /// The root it must stay inside.
        root: String,
    },
    /// The attribute is larger than [`MAX_ATTR_BYTES`].
    #[error("{path}: larger than {max} bytes, refused", max = MAX_ATTR_BYTES)]
    TooLarge {
        /// The path as asked for, relative to the root.
        path: String,
    },
    /// The path is a symlink whose target does not exist: something is there
    /// but cannot be read, which is not the same as "no such attribute".
    #[error("{path}: dangling link (its target does not exist)")]
    Dangling {
        /// The path as asked for, relative to the root.
        path: String,
    },
    /// Something other than a regular file stands where an attribute belongs
    /// (a FIFO or a device would block or never end; a folder is no value).
    #[error("{path}: is a {kind}, not a regular file")]
    NotRegular {
        /// The path as asked for, relative to the root.
        path: String,
        /// What it is instead (`folder`, `FIFO`, `character device` …).
        kind: &'static str,
    },
    /// Any other I/O failure: missing, permission denied, not a directory …
    /// The OS error is part of the message and deliberately not a `source`,
    /// so an error chain prints it once, not once per layer.
    #[error("{path}: {cause}")]
    Io {
        /// The path as asked for, relative to the root.
        path: String,
        /// The underlying error.
        cause: std::io::Error,
    },
}

impl SysError {
    /// True when the path simply does not exist (as opposed to existing and
    /// being unreadable), which callers treat as "the kernel has no such
    /// attribute". A dangling link is not "not found": see [`SysError::Dangling`].
    pub fn is_not_found(&self) -> bool {
        matches!(self, SysError::Io { cause, .. } if cause.kind() == std::io::ErrorKind::NotFound)
    }
}

/// A sysfs tree: the live `/sys` or a captured copy of one.
#[derive(Debug, Clone)]
pub struct SysRoot {
    root: PathBuf,
    /// When capturing, every entry a read touched (see [`SysRoot::recording`]).
    recorder: Option<Arc<Mutex<Recorded>>>,
    /// Paths already resolved, by the path they were asked for, to their
    /// canonical path under the root: one pass reads many attributes of each
    /// device folder and follows the same links more than once, and
    /// re-walking the symlink chain for each was most of its cost.
    folders: Arc<Mutex<resolve::Places>>,
    /// The root opened as a directory handle, for `openat2(2)` with
    /// `RESOLVE_BENEATH`: the kernel then walks an attribute's links and
    /// keeps the walk inside the root in one call. `None` where the kernel
    /// or a seccomp filter refuses it (the resolving path is used instead).
    beneath: Option<Arc<std::os::fd::OwnedFd>>,
    /// The root opened as a directory handle whether or not `openat2(2)`
    /// answers: links are read relative to it, so the kernel walks only
    /// the path under the root, not the root's own path again each time.
    handle: Option<Arc<std::os::fd::OwnedFd>>,
    /// What this pass presumes of link targets, to be proved (see [`trust`]).
    trust: Arc<trust::Trust>,
    /// The root is a live sysfs, where everything is a regular file, a
    /// folder or a link (kernfs makes nothing else): a read that the kernel
    /// keeps on this mount (`RESOLVE_NO_XDEV`) needs no type check of what
    /// it opened, and a folder answers its read with EISDIR. A copy of a
    /// tree (tmpfs, a disk) can hold anything, so there each read checks.
    kernfs: bool,
}

impl SysRoot {
    /// Opens a tree; the root itself is canonicalised so that containment
    /// checks compare like with like.
    pub fn new(root: impl AsRef<Path>) -> Result<Self, SysError> {
        let root = root.as_ref();
        let canonical = fs::canonicalize(root).map_err(|cause| SysError::Io {
            path: root.display().to_string(),
            cause,
        })?;
        let handle = kernel::open_dir(&canonical).map(Arc::new);
        let beneath = handle.clone().filter(|fd| kernel::openat2_works(fd));
        // Room for a small node's folders (an 8-GPU node remembers about
        // 130), grown as a larger one needs: a larger table up front made
        // every pass touch pages it mostly left empty (the kernel zeroes
        // each on first touch), which cost more than the few growths (each
        // hashes every path again).
        let folders = Arc::new(Mutex::new(resolve::Places::with_capacity_and_hasher(
            192,
            BuildPathHash,
        )));
        let kernfs = handle.as_deref().is_some_and(kernel::is_sysfs);
        Ok(SysRoot {
            root: canonical,
            recorder: None,
            folders,
            beneath,
            handle,
            trust: Arc::default(),
            kernfs,
        })
    }

    /// The canonical root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }
}

/// Parses a hex attribute as the kernel prints it (`0x10de`, `0x1003`).
pub fn parse_hex(s: &str) -> Option<u32> {
    u32::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok()
}

/// Joins sysfs path pieces with `/`, for building relative paths.
pub fn join(base: &str, name: &str) -> String {
    if base.is_empty() {
        return name.to_string();
    }
    // Sized once: this builds every path a pass reads.
    let mut out = String::with_capacity(base.len() + 1 + name.len());
    out.push_str(base);
    out.push('/');
    out.push_str(name);
    out
}

/// Calls `f` with `folder/name`, joined in a buffer on the stack when it
/// fits (every sysfs path does), as [`join`] would join them: for a path
/// only handed on, not kept.
pub fn with_joined<T>(folder: &str, name: &str, f: impl FnOnce(&str) -> T) -> T {
    let mut buf = [0u8; 512];
    let len = folder.len() + 1 + name.len();
    if folder.is_empty() || len > buf.len() {
        return f(&join(folder, name));
    }
    buf[..folder.len()].copy_from_slice(folder.as_bytes());
    buf[folder.len()] = b'/';
    buf[folder.len() + 1..len].copy_from_slice(name.as_bytes());
    // Two texts and a `/` between them are text.
    f(std::str::from_utf8(&buf[..len]).expect("joined text is text"))
}

/// The last path component of a resolved path (`devices/…/0000:03:00.0` → `0000:03:00.0`).
pub fn basename(rel: &str) -> &str {
    Path::new(rel)
        .components()
        .next_back()
        .and_then(|c| match c {
            Component::Normal(s) => s.to_str(),
            _ => None,
        })
        .unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::resolve::{plain_names, split_last};
    use super::*;

    /// The tree at `dir` opened each way a host may allow: with
    /// `openat2(2)`, without it (a kernel before 5.6, or a seccomp filter
    /// refusing it), and without even a root handle. Each must answer alike.
    fn every_way(dir: &Path) -> Vec<(&'static str, SysRoot)> {
        let full = SysRoot::new(dir).unwrap();
        assert!(full.beneath.is_some(), "openat2 answers on this kernel");
        let no_openat2 = SysRoot {
            beneath: None,
            ..SysRoot::new(dir).unwrap()
        };
        let no_handle = SysRoot {
            beneath: None,
            handle: None,
            ..SysRoot::new(dir).unwrap()
        };
        vec![
            ("openat2", full),
            ("no openat2", no_openat2),
            ("no root handle", no_handle),
        ]
    }

    #[test]
    fn a_read_through_a_link_out_of_the_root_is_refused_by_either_path() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("mtu"), "1500\n").unwrap();
        fs::create_dir(dir.path().join("net")).unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("net/evil")).unwrap();
        std::os::unix::fs::symlink("../../..", dir.path().join("net/up")).unwrap();
        for (way, root) in every_way(dir.path()) {
            for rel in ["net/evil/mtu", "net/up/etc/hostname"] {
                match root.read(rel) {
                    Err(SysError::Escapes { .. }) => {}
                    other => panic!("{way}: {rel}: {other:?}"),
                }
            }
        }
    }

    #[test]
    fn a_fifo_attribute_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        crate::input::make_fifo(&dir.path().join("state"));
        for (way, root) in every_way(dir.path()) {
            assert!(
                matches!(
                    root.read("state"),
                    Err(SysError::NotRegular { kind: "FIFO", .. })
                ),
                "{way}"
            );
        }
    }

    #[test]
    fn reads_past_the_first_buffer_and_refuses_past_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let long = "x".repeat(600);
        fs::write(dir.path().join("long"), &long).unwrap();
        fs::write(dir.path().join("full"), "y".repeat(MAX_ATTR_BYTES as usize)).unwrap();
        fs::write(
            dir.path().join("over"),
            "z".repeat(MAX_ATTR_BYTES as usize + 1),
        )
        .unwrap();
        fs::write(dir.path().join("short"), " 7\n").unwrap();
        for (way, root) in every_way(dir.path()) {
            assert_eq!(root.read("long").unwrap(), long, "{way}");
            assert_eq!(
                root.read("full").unwrap().len(),
                MAX_ATTR_BYTES as usize,
                "{way}"
            );
            assert!(
                matches!(root.read("over"), Err(SysError::TooLarge { .. })),
                "{way}"
            );
            assert_eq!(root.read_trimmed("short").unwrap(), "7", "{way}");
        }
    }

    #[test]
    fn listing_follows_links_inside_and_refuses_them_outside() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("devices/dev0/ports")).unwrap();
        for p in ["2", "1", "10"] {
            fs::create_dir(dir.path().join("devices/dev0/ports").join(p)).unwrap();
        }
        fs::create_dir(dir.path().join("class")).unwrap();
        std::os::unix::fs::symlink("../devices/dev0", dir.path().join("class/dev0")).unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("class/evil")).unwrap();
        std::os::unix::fs::symlink("../devices/gone", dir.path().join("class/gone")).unwrap();
        for (way, root) in every_way(dir.path()) {
            assert_eq!(
                root.list("class/dev0/ports").unwrap(),
                ["1", "10", "2"],
                "{way}"
            );
            assert!(
                matches!(root.list("class/evil"), Err(SysError::Escapes { .. })),
                "{way}"
            );
            assert!(
                matches!(root.list("class/gone"), Err(SysError::Dangling { .. })),
                "{way}"
            );
            assert!(root.list("class/none").unwrap_err().is_not_found(), "{way}");
            // Listed from a canonical folder, a climb back up is still a listing
            // of the folder it lands in, and nothing under it is taken as canonical.
            assert_eq!(
                root.list("devices/dev0/ports/..").unwrap(),
                ["ports"],
                "{way}"
            );
            assert_eq!(
                root.resolve("devices/dev0/ports/../ports/1").unwrap(),
                "devices/dev0/ports/1",
                "{way}"
            );
            // A link asked for twice resolves the same, the second time from the cache.
            for _ in 0..2 {
                assert_eq!(
                    root.resolve("class/dev0/ports/1").unwrap(),
                    "devices/dev0/ports/1",
                    "{way}"
                );
                assert!(
                    matches!(root.resolve("class/gone"), Err(SysError::Dangling { .. })),
                    "{way}"
                );
                assert!(!root.exists("class/dev0/nothing"), "{way}");
            }
        }
    }

    #[test]
    fn a_folder_of_many_buffers_lists_whole() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("class/net");
        fs::create_dir_all(&big).unwrap();
        // Names of every length up to NAME_MAX, so buffers end at every
        // distance from their end, several buffers' worth in all.
        let mut want: Vec<String> = (0..1500)
            .map(|i| format!("{i:05}{}", "x".repeat(i % 251)))
            .collect();
        for name in &want {
            fs::create_dir(big.join(name)).unwrap();
        }
        want.sort();
        for (way, root) in every_way(dir.path()) {
            assert_eq!(root.list("class/net").unwrap(), want, "{way}");
        }
    }

    #[test]
    fn the_live_sysfs_reads_untyped_as_it_reads_typed() {
        // This host's own /sys: every machine the tests run on has one.
        let live = SysRoot::new("/sys").unwrap();
        assert!(live.kernfs, "/sys is a sysfs mount");
        let typed = SysRoot {
            kernfs: false,
            ..SysRoot::new("/sys").unwrap()
        };
        for attr in [
            "devices/system/cpu/online",
            "devices/system/cpu/possible",
            "kernel/mm/transparent_hugepage/enabled",
            "class/net/lo/mtu",
        ] {
            let (a, b) = (live.read(attr), typed.read(attr));
            assert_eq!(a.as_ref().ok(), b.as_ref().ok(), "{attr}");
            assert_eq!(a.is_ok(), b.is_ok(), "{attr}");
        }
        // A folder where an attribute belongs, a missing one, and one through a link.
        for way in [&live, &typed] {
            assert!(matches!(
                way.read("devices/system/cpu"),
                Err(SysError::NotRegular { kind: "folder", .. })
            ));
            assert!(way
                .read("devices/system/cpu/no-such-attribute")
                .unwrap_err()
                .is_not_found());
            assert!(way.read("class/net/lo/operstate").is_ok());
        }
        // A tree copied to tmpfs is not trusted so.
        let copy =
            tempfile::tempdir_in("/dev/shm").unwrap_or_else(|_| tempfile::tempdir().unwrap());
        assert!(!SysRoot::new(copy.path()).unwrap().kernfs);
    }

    #[test]
    fn a_listing_under_a_storm_of_signals_is_whole() {
        // The kernel stops filling a getdents64 buffer early when a signal is
        // pending; a listing that took a short buffer for the end would drop
        // names. Signals rain on the listing thread while it lists.
        extern "C" fn ignore(_: libc::c_int) {}
        let dir = tempfile::tempdir_in("/dev/shm").unwrap_or_else(|_| tempfile::tempdir().unwrap());
        let big = dir.path().join("class/net");
        fs::create_dir_all(&big).unwrap();
        let want: Vec<String> = (0..3000).map(|i| format!("enp{i:05}s0np0")).collect();
        for name in &want {
            fs::create_dir(big.join(name)).unwrap();
        }
        // SAFETY: a handler that does nothing, installed with SA_RESTART for
        // a signal nothing else in the test binary uses.
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = ignore as *const () as usize;
            act.sa_flags = libc::SA_RESTART;
            assert_eq!(
                libc::sigaction(libc::SIGUSR2, &act, std::ptr::null_mut()),
                0
            );
        }
        // SAFETY: the calling thread's own id.
        let me = unsafe { libc::pthread_self() };
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let storm = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // SAFETY: `me` lives until `stop` is set and this thread joined.
                    unsafe { libc::pthread_kill(me, libc::SIGUSR2) };
                }
            })
        };
        let root = SysRoot::new(dir.path()).unwrap();
        for _ in 0..20 {
            assert_eq!(root.list("class/net").unwrap(), want);
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        storm.join().unwrap();
    }

    #[test]
    fn a_link_target_of_several_names_with_a_link_midway_is_followed_or_refused() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        fs::create_dir_all(outside.path().join("net/eth0")).unwrap();
        fs::write(outside.path().join("net/eth0/mtu"), "9000\n").unwrap();
        fs::create_dir_all(dir.path().join("devices/real/net/eth0")).unwrap();
        fs::write(dir.path().join("devices/real/net/eth0/mtu"), "1500\n").unwrap();
        // `devices/alias` is a link: the targets below pass through it.
        std::os::unix::fs::symlink("real", dir.path().join("devices/alias")).unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("devices/away")).unwrap();
        fs::create_dir(dir.path().join("class")).unwrap();
        std::os::unix::fs::symlink("../devices/alias/net/eth0", dir.path().join("class/inside"))
            .unwrap();
        std::os::unix::fs::symlink("../devices/away/net/eth0", dir.path().join("class/outside"))
            .unwrap();
        std::os::unix::fs::symlink("../devices/real/net/eth0", dir.path().join("class/plain"))
            .unwrap();
        for (way, root) in every_way(dir.path()) {
            for _ in 0..2 {
                assert_eq!(
                    root.resolve("class/inside").unwrap(),
                    "devices/real/net/eth0",
                    "{way}"
                );
                assert_eq!(
                    root.resolve("class/plain").unwrap(),
                    "devices/real/net/eth0",
                    "{way}"
                );
                assert!(
                    matches!(root.resolve("class/outside"), Err(SysError::Escapes { .. })),
                    "{way}"
                );
                assert!(
                    matches!(
                        root.read("class/outside/mtu"),
                        Err(SysError::Escapes { .. })
                    ),
                    "{way}"
                );
                assert_eq!(
                    root.read_trimmed("class/inside/mtu").unwrap(),
                    "1500",
                    "{way}"
                );
            }
        }
    }

    #[test]
    fn a_bare_climb_link_resolves_to_the_folder_above_it() {
        let dir = tempfile::tempdir().unwrap();
        let function = "devices/pci0000:00/0000:3b:00.0";
        fs::create_dir_all(dir.path().join(function).join("net/eth0")).unwrap();
        fs::write(dir.path().join(function).join("vendor"), "0x15b3\n").unwrap();
        // As the kernel writes a netdev's `device` link, with and without a
        // trailing slash; and one that climbs out of the root.
        let eth0 = dir.path().join(function).join("net/eth0");
        std::os::unix::fs::symlink("../..", eth0.join("device")).unwrap();
        std::os::unix::fs::symlink("../../", eth0.join("slashed")).unwrap();
        std::os::unix::fs::symlink("../../../../../..", eth0.join("away")).unwrap();
        fs::create_dir_all(dir.path().join("class/net")).unwrap();
        std::os::unix::fs::symlink(
            format!("../../{function}/net/eth0"),
            dir.path().join("class/net/eth0"),
        )
        .unwrap();
        for (way, root) in every_way(dir.path()) {
            for _ in 0..2 {
                for link in ["device", "slashed"] {
                    let rel = format!("class/net/eth0/{link}");
                    assert_eq!(root.resolve(&rel).unwrap(), function, "{way} {link}");
                    assert_eq!(
                        root.read_trimmed(&format!("{rel}/vendor")).unwrap(),
                        "0x15b3",
                        "{way} {link}"
                    );
                }
                assert!(
                    root.resolve("class/net/eth0/away").is_err(),
                    "{way}: a climb out of the root is not the root"
                );
            }
        }
    }

    #[test]
    fn a_link_text_longer_than_the_link_buffer_resolves_the_long_way() {
        let dir = tempfile::tempdir().unwrap();
        // Five names of 120 bytes: a link text of over 600 bytes, more than
        // the stack buffer a link is first read into.
        let deep: Vec<String> = (0..5).map(|i| format!("{i}{}", "n".repeat(119))).collect();
        let folder = format!("devices/{}", deep.join("/"));
        fs::create_dir_all(dir.path().join(&folder)).unwrap();
        fs::write(dir.path().join(&folder).join("mtu"), "1500\n").unwrap();
        fs::create_dir(dir.path().join("class")).unwrap();
        let text = format!("../{folder}");
        assert!(text.len() > 512);
        std::os::unix::fs::symlink(&text, dir.path().join("class/long")).unwrap();
        for (way, root) in every_way(dir.path()) {
            for _ in 0..2 {
                assert_eq!(root.resolve("class/long").unwrap(), folder, "{way}");
                assert_eq!(
                    root.read_trimmed("class/long/mtu").unwrap(),
                    "1500",
                    "{way}"
                );
            }
        }
    }

    #[test]
    fn split_last_and_plain_names_read_paths_as_the_kernel_does() {
        assert_eq!(
            split_last("devices/pci0000:00/0000:00:01.0"),
            Some(("devices/pci0000:00", "0000:00:01.0"))
        );
        assert_eq!(split_last("class"), None);
        assert_eq!(split_last("class/"), Some(("class", "")));
        for ok in ["a", "devices/pci0000:00/x", "a/.b/..c/...", "é/ü"] {
            assert!(plain_names(ok), "{ok}");
        }
        for bad in [
            "", "/", "a/", "/a", "a//b", ".", "..", "a/./b", "a/../b", "a/..",
        ] {
            assert!(!plain_names(bad), "{bad}");
        }
    }

    #[test]
    fn basename_of_nested_path() {
        assert_eq!(basename("devices/pci0000:00/0000:00:01.0"), "0000:00:01.0");
        assert_eq!(basename("x"), "x");
    }

    #[test]
    fn join_skips_empty_base() {
        assert_eq!(join("", "a"), "a");
        assert_eq!(join("a", "b"), "a/b");
    }

    /// `class/net/eth0` → `devices/pci0000:00/0000:00:01.0/net/eth0`, the
    /// way the kernel links a netdev, with its `mtu`.
    fn netdev_tree(dir: &Path) {
        let net = dir.join("devices/pci0000:00/0000:00:01.0/net/eth0");
        fs::create_dir_all(&net).unwrap();
        fs::write(net.join("mtu"), "9000\n").unwrap();
        fs::create_dir_all(dir.join("class/net")).unwrap();
        std::os::unix::fs::symlink(
            "../../devices/pci0000:00/0000:00:01.0/net/eth0",
            dir.join("class/net/eth0"),
        )
        .unwrap();
    }

    #[test]
    fn a_presumed_link_target_is_proved_by_the_first_read_beneath_it() {
        let dir = tempfile::tempdir().unwrap();
        netdev_tree(dir.path());
        let root = SysRoot::new(dir.path()).unwrap();
        root.presume();
        let net = root.resolve("class/net/eth0").unwrap();
        assert_eq!(net, "devices/pci0000:00/0000:00:01.0/net/eth0");
        assert!(root.to_prove(&net), "presumed, not checked");
        assert_eq!(root.read_trimmed_proving(&net, "mtu").unwrap(), "9000");
        assert!(!root.to_prove(&net), "proved by the read");
        assert!(root.settle());
    }

    #[test]
    fn a_presumed_link_target_no_read_proved_is_checked_when_settled() {
        let dir = tempfile::tempdir().unwrap();
        netdev_tree(dir.path());
        let root = SysRoot::new(dir.path()).unwrap();
        root.presume();
        root.resolve("class/net/eth0").unwrap();
        // A plain read does not prove it; settling checks it, and it holds.
        assert_eq!(
            root.read_trimmed("devices/pci0000:00/0000:00:01.0/net/eth0/mtu")
                .unwrap(),
            "9000"
        );
        assert!(root.settle());
        assert!(!root.to_prove("devices/pci0000:00/0000:00:01.0/net/eth0"));
    }

    #[test]
    fn a_link_target_through_a_linked_folder_fails_its_presumption() {
        // The PCI function's folder is a link to another: the target as
        // written is not where the link lands. Presumed, the read beneath
        // it follows the link (and so proves nothing), and settling says
        // the tree must be read again; not presuming, the answer is where
        // the link really lands.
        let dir = tempfile::tempdir().unwrap();
        netdev_tree(dir.path());
        let bus = dir.path().join("devices/pci0000:00");
        fs::rename(bus.join("0000:00:01.0"), bus.join("0000:00:02.0")).unwrap();
        std::os::unix::fs::symlink("0000:00:02.0", bus.join("0000:00:01.0")).unwrap();
        let root = SysRoot::new(dir.path()).unwrap();
        root.presume();
        let net = root.resolve("class/net/eth0").unwrap();
        assert_eq!(root.read_trimmed_proving(&net, "mtu").unwrap(), "9000");
        assert!(root.to_prove(&net), "a read through a link proves nothing");
        assert!(!root.settle());
        root.forget_resolutions();
        assert_eq!(
            root.resolve("class/net/eth0").unwrap(),
            "devices/pci0000:00/0000:00:02.0/net/eth0"
        );
    }

    #[test]
    fn a_dangling_link_target_fails_its_presumption() {
        let dir = tempfile::tempdir().unwrap();
        netdev_tree(dir.path());
        fs::remove_dir_all(dir.path().join("devices/pci0000:00/0000:00:01.0/net/eth0")).unwrap();
        let root = SysRoot::new(dir.path()).unwrap();
        root.presume();
        let net = root.resolve("class/net/eth0").unwrap();
        assert!(root
            .read_trimmed_proving(&net, "mtu")
            .unwrap_err()
            .is_not_found());
        assert!(!root.settle(), "what was read on it may be wrong");
        root.forget_resolutions();
        assert!(matches!(
            root.resolve("class/net/eth0"),
            Err(SysError::Dangling { .. })
        ));
    }

    #[test]
    fn a_folders_count_is_its_subfolders_and_says_nothing_of_a_link_or_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let ports = dir.path().join("devices/ib/ports");
        for p in ["1", "2", "3"] {
            fs::create_dir_all(ports.join(p)).unwrap();
        }
        fs::write(ports.join("not-a-port"), "").unwrap();
        std::os::unix::fs::symlink("1", ports.join("link")).unwrap();
        std::os::unix::fs::symlink("ports", dir.path().join("devices/ib/alias")).unwrap();
        for (way, root) in every_way(dir.path()) {
            // Asked only in a folder this pass resolved.
            assert_eq!(root.folders_in("devices/ib/ports"), None, "{way}");
            root.resolve("devices/ib").unwrap();
            let want = match way {
                "no root handle" => None,
                _ => Some(3),
            };
            assert_eq!(root.folders_in("devices/ib/ports"), want, "{way}");
            assert_eq!(root.folders_in("devices/ib/alias"), None, "{way}: a link");
            assert_eq!(
                root.folders_in("devices/ib/ports/not-a-port"),
                None,
                "{way}"
            );
            assert_eq!(root.folders_in("devices/ib/none"), None, "{way}");
        }
    }

    #[test]
    fn a_tree_without_openat2_never_presumes() {
        let dir = tempfile::tempdir().unwrap();
        netdev_tree(dir.path());
        for (way, root) in every_way(dir.path()) {
            root.presume();
            let net = root.resolve("class/net/eth0").unwrap();
            assert_eq!(root.to_prove(&net), way == "openat2", "{way}");
            assert!(root.settle(), "{way}");
        }
    }
}
