//! A published CDI folder: fixture trees beside a `cdi/` folder that the
//! real `nodefabric publish` wrote, and the `kubelet/` folder a kubelet
//! stand-in and the device plugin meet in.

use std::path::{Path, PathBuf};
use std::process::Command;

/// `nodefabric publish` of a fixture tree's CDI specs into `cdi_dir`.
pub fn publish(root: &Path, cdi_dir: &Path) {
    let state = root.parent().unwrap().join(format!(
        "{}-state",
        root.file_name().unwrap().to_str().unwrap()
    ));
    let out = Command::new(env!("CARGO_BIN_EXE_nodefabric"))
        .args(["publish", "--sysfs-root"])
        .arg(root)
        .arg("--features-dir")
        .arg(state.join("f"))
        .arg("--state-dir")
        .arg(state.join("s"))
        .arg("--cdi-dir")
        .arg(cdi_dir)
        .env("NODEFABRIC_NOW", "2026-03-01T12:00:00Z")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A temp folder with `kubelet/`, `cdi/` and fixture trees beside them.
pub struct Dirs {
    tmp: tempfile::TempDir,
}

impl Dirs {
    /// Empty `kubelet/` and `cdi/` folders.
    pub fn new() -> Dirs {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("kubelet")).unwrap();
        std::fs::create_dir(tmp.path().join("cdi")).unwrap();
        Dirs { tmp }
    }

    /// The tree `fixture` builds, named `name`, published into `cdi/`.
    pub fn published<T>(name: &str, fixture: impl FnOnce(&Path) -> T) -> Dirs {
        let d = Dirs::new();
        fixture(&d.tree(name));
        publish(&d.tree(name), &d.cdi());
        d
    }

    pub fn kubelet(&self) -> PathBuf {
        self.tmp.path().join("kubelet")
    }

    pub fn cdi(&self) -> PathBuf {
        self.tmp.path().join("cdi")
    }

    /// Where a fixture tree named `name` goes.
    pub fn tree(&self, name: &str) -> PathBuf {
        self.tmp.path().join(name)
    }
}
