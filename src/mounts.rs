//! Host folders seen through a container's bind mount, and the one way such
//! a folder goes stale without any error saying so.
//!
//! A `hostPath` volume mounts the host folder that is there when the
//! container starts. If the host deletes that folder (`rm -rf`, an agent
//! reinstalling itself) and makes a new one at the same path, the container
//! keeps the deleted one: empty, taking no new files, and blind to what the
//! host writes into the new folder. Only starting the container again mounts
//! the folder that is there now, so the long-running parts fail their
//! liveness probe when they see this, and the kubelet restarts them.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// True when the folder at `dir` has been deleted while something still
/// holds it, as a container's mount holds a host folder deleted since: it
/// is still a folder at its path, with no names left linking to it, and
/// the kernel answers a listing of it with ENOENT (it marks a removed
/// folder dead). The link count alone is not trusted: a filesystem may
/// report none for a live folder, and a restart loop is a high price.
///
/// A folder that is simply missing, or was made again at the path this
/// process sees, is not: those mend themselves.
pub fn deleted_in_place(dir: &Path) -> bool {
    std::fs::metadata(dir).is_ok_and(|m| deleted(dir, &m))
}

/// [`deleted_in_place`] for a caller that already holds the folder's
/// metadata (`meta`, from a `stat` of `dir`): the listing is asked only of
/// a folder with no links left.
pub fn deleted(dir: &Path, meta: &std::fs::Metadata) -> bool {
    if !(meta.is_dir() && meta.nlink() == 0) {
        return false;
    }
    // Opened (it is there), then refused when listed: a dead folder. The
    // listing is asked of the kernel itself, since libc's readdir reports
    // this ENOENT as the end of an empty folder.
    let Ok(folder) = std::fs::File::open(dir) else {
        return false;
    };
    let mut space = [0u8; 1024];
    // SAFETY: an open folder's descriptor and a writable buffer of the length given.
    let n = unsafe {
        libc::syscall(
            libc::SYS_getdents64,
            std::os::fd::AsRawFd::as_raw_fd(&folder),
            space.as_mut_ptr(),
            space.len(),
        )
    };
    n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOENT)
}

/// What to say of a folder [`deleted_in_place`]: `what` names its role
/// ("the CDI folder").
pub fn stale_reason(what: &str, dir: &Path) -> String {
    format!(
        "{what} {} was deleted on the host while mounted here: what is written there now is not seen, \
         and nothing written here reaches the host, until this container restarts and mounts it again",
        dir.display()
    )
}

/// For tests: `dir` held open, and the path that reaches it through the
/// handle. A held handle stands in for a mount: its `/proc` link reaches the
/// folder it was opened on, as a mount point does, deleted or not.
#[cfg(test)]
pub(crate) fn held(dir: &Path) -> (std::fs::File, std::path::PathBuf) {
    let file = std::fs::File::open(dir).unwrap();
    let through = std::path::PathBuf::from(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&file)
    ));
    (file, through)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_deleted_while_held_is_deleted_in_place_and_a_missing_or_live_one_is_not() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("cdi");
        std::fs::create_dir(&dir).unwrap();
        let (_held, through) = held(&dir);
        assert!(!deleted_in_place(&through), "a live folder");
        assert!(!deleted_in_place(&dir));
        std::fs::remove_dir(&dir).unwrap();
        assert!(deleted_in_place(&through), "deleted while held");
        assert!(!deleted_in_place(&dir), "missing mends itself");
        std::fs::create_dir(&dir).unwrap();
        assert!(!deleted_in_place(&dir), "made again at its path");
        assert!(
            deleted_in_place(&through),
            "what is held is still the deleted one"
        );
        let file = tmp.path().join("file");
        std::fs::write(&file, "x").unwrap();
        assert!(!deleted_in_place(&file), "not a folder");
    }
}
