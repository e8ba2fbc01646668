//! A stand-in for a container's bind mount of a host folder, for the tests
//! of a folder deleted on the host while mounted.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// `dir` held open, and a path that reaches it through the handle, for a
/// child process to be given. Like a mount point, the `/proc` link reaches
/// the folder it was opened on, whatever the host does to `dir` afterwards.
/// The path works while the handle lives.
pub fn held(dir: &Path) -> (std::fs::File, PathBuf) {
    let file = std::fs::File::open(dir).unwrap();
    let through = PathBuf::from(format!(
        "/proc/{}/fd/{}",
        std::process::id(),
        file.as_raw_fd()
    ));
    (file, through)
}
