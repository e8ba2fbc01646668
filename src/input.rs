//! Files an operator names on the command line (a rails values file, a saved
//! `nvidia-smi` or `lldpctl` output, a vendor's answer file) and the files a
//! publish finds where it writes (its previous record, feature file, specs).
//!
//! Each is read whole, within bounds, so that no input can stall or swamp a
//! pass. A regular file is read up to a cap. A pipe (a shell's `<(…)`, a
//! named FIFO) is read where the caller allows it, as its writer writes,
//! until the writer closes it or a deadline passes: opened plainly, a FIFO
//! nobody writes to blocks forever before the first byte, and one whose
//! writer never finishes blocks in the read. Anything else (a device, a
//! socket, a folder) is refused. Every error names the path.

use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What an input may be besides a regular file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pipes {
    /// Refused: an answer that is read on every pass is a file.
    Refuse,
    /// Read as its writer writes, until it closes, for at most this long.
    Wait(Duration),
}

/// Why an input could not be read; every variant names the path.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// Opening or reading failed: missing, permission denied …
    #[error("reading {path}: {cause}")]
    Io {
        /// The input's path.
        path: PathBuf,
        /// The underlying error.
        cause: std::io::Error,
    },
    /// Something that is not a file (nor an allowed pipe).
    #[error("{path}: is a {kind}, not a regular file")]
    NotAFile {
        /// The input's path.
        path: PathBuf,
        /// What it is instead.
        kind: &'static str,
    },
    /// Larger than the caller's cap: not what it was said to be.
    #[error("{path}: larger than {max} bytes, not {what}")]
    TooLarge {
        /// The input's path.
        path: PathBuf,
        /// The cap.
        max: u64,
        /// What the input was meant to be.
        what: String,
    },
    /// A pipe whose writer did not close it in time.
    #[error("{path}: a pipe that was not written to its end within {}", humantime::format_duration(*wait))]
    Stalled {
        /// The input's path.
        path: PathBuf,
        /// How long it was given.
        wait: Duration,
    },
    /// Bytes that are not UTF-8 text.
    #[error("{path}: not UTF-8 text (byte {at})")]
    NotText {
        /// The input's path.
        path: PathBuf,
        /// The offset of the first byte that is not.
        at: usize,
    },
}

/// Reads the text at `path` whole: at most `max` bytes (more is refused as
/// not being `what`), UTF-8, a regular file or, as `pipes` allows, a pipe.
pub fn read_text(path: &Path, max: u64, what: &str, pipes: Pipes) -> Result<String, InputError> {
    let bytes = read_bytes(path, max, what, pipes)?;
    String::from_utf8(bytes).map_err(|e| InputError::NotText {
        path: path.to_path_buf(),
        at: e.utf8_error().valid_up_to(),
    })
}

/// Reads the bytes at `path` whole, as [`read_text`] does, without asking
/// them to be text.
pub fn read_bytes(path: &Path, max: u64, what: &str, pipes: Pipes) -> Result<Vec<u8>, InputError> {
    read_opened(path, max, what, pipes).map(|(bytes, _)| bytes)
}

/// Reads the regular file at `path` whole, as [`read_bytes`] does with pipes
/// refused, and gives the metadata of the file that was read (of the open
/// file, so of the very version read), for a caller that remembers which
/// version it took.
pub fn read_file(
    path: &Path,
    max: u64,
    what: &str,
) -> Result<(Vec<u8>, std::fs::Metadata), InputError> {
    read_opened(path, max, what, Pipes::Refuse)
}

/// Opens the regular file at `path` for reading as it goes, refusing what
/// [`read_file`] refuses (a pipe, a device, a file over `max` bytes); the
/// reader ends one byte past `max`, so a file that grows past the cap reads
/// as longer than any valid input. For a caller that parses as it reads
/// rather than hold the whole text.
pub fn open_file(
    path: &Path,
    max: u64,
    what: &str,
) -> Result<std::io::Take<std::fs::File>, InputError> {
    let (file, meta) = open_checked(path, Pipes::Refuse)?;
    if !meta.file_type().is_file() {
        return Err(InputError::NotAFile {
            path: path.to_path_buf(),
            kind: kind_of(meta.file_type()),
        });
    }
    if meta.len() > max {
        return Err(InputError::TooLarge {
            path: path.to_path_buf(),
            max,
            what: what.to_string(),
        });
    }
    Ok(std::io::Read::take(file, max.saturating_add(1)))
}

/// Opens `path` to read, refusing unopened anything but a regular file (or
/// a FIFO, as `pipes` allows), without blocking; the open file and its own
/// metadata, whose type the caller checks again: what was opened cannot
/// change under it, the path can.
pub(crate) fn open_checked(
    path: &Path,
    pipes: Pipes,
) -> Result<(std::fs::File, std::fs::Metadata), InputError> {
    let io = |cause| InputError::Io {
        path: path.to_path_buf(),
        cause,
    };
    // The type first, so that a device (a link planted to a watchdog, say)
    // is refused unopened: opening some devices acts on them.
    let planned = std::fs::metadata(path).map_err(io)?.file_type();
    if !(planned.is_file() || (planned.is_fifo() && pipes != Pipes::Refuse)) {
        return Err(InputError::NotAFile {
            path: path.to_path_buf(),
            kind: kind_of(planned),
        });
    }
    // Non-blocking, so that opening a FIFO does not wait for a writer.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    Ok((file, meta))
}

/// [`read_bytes`] and [`read_file`]: the bytes and the open file's metadata.
fn read_opened(
    path: &Path,
    max: u64,
    what: &str,
    pipes: Pipes,
) -> Result<(Vec<u8>, std::fs::Metadata), InputError> {
    let io = |cause| InputError::Io {
        path: path.to_path_buf(),
        cause,
    };
    let too_large = || InputError::TooLarge {
        path: path.to_path_buf(),
        max,
        what: what.to_string(),
    };
    let (file, meta) = open_checked(path, pipes)?;
    let ft = meta.file_type();
    let bytes = match (ft.is_file(), ft.is_fifo(), pipes) {
        // Already past the cap: refused unread.
        (true, _, _) if meta.len() > max => return Err(too_large()),
        (true, _, _) => read_capped(file, max, meta.len()).map_err(io)?,
        (false, true, Pipes::Wait(wait)) => read_pipe(file, max, wait, path)?,
        _ => {
            return Err(InputError::NotAFile {
                path: path.to_path_buf(),
                kind: kind_of(ft),
            })
        }
    };
    // A file may grow between the fstat and the read.
    if bytes.len() as u64 > max {
        return Err(too_large());
    }
    Ok((bytes, meta))
}

/// Reads a regular file of about `size` bytes to one byte past `max`, so
/// that growth past the cap shows.
fn read_capped(file: std::fs::File, max: u64, size: u64) -> std::io::Result<Vec<u8>> {
    // Room for what fstat said, and the byte that tells the end.
    let mut bytes =
        Vec::with_capacity(usize::try_from(size.min(max).saturating_add(1)).unwrap_or(0));
    file.take(max + 1).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Reads a pipe (opened non-blocking) as it is written, to one byte past
/// `max`, until its writer closes it; past `wait` it is [`InputError::Stalled`].
fn read_pipe(
    mut file: std::fs::File,
    max: u64,
    wait: Duration,
    path: &Path,
) -> Result<Vec<u8>, InputError> {
    use std::os::fd::AsRawFd;
    let io = |cause| InputError::Io {
        path: path.to_path_buf(),
        cause,
    };
    let deadline = Instant::now() + wait;
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 64 * 1024];
    // A FIFO opened before any writer reads as ended (0) at once, though a
    // writer may be about to open it: the end only counts once poll(2) has
    // said so (a hang-up), which it says only after a writer came and went.
    let mut hung_up = false;
    loop {
        match file.read(&mut chunk) {
            Ok(0) if hung_up => return Ok(bytes),
            Ok(0) => {}
            Ok(n) => {
                bytes.extend_from_slice(&chunk[..n]);
                if bytes.len() as u64 > max {
                    return Ok(bytes);
                }
                continue;
            }
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io(e)),
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(InputError::Stalled {
                path: path.to_path_buf(),
                wait,
            });
        }
        let mut fd = libc::pollfd {
            fd: file.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = libc::c_int::try_from(left.as_millis().max(1)).unwrap_or(libc::c_int::MAX);
        // SAFETY: one valid pollfd, its count, and a timeout in milliseconds.
        let ready = unsafe { libc::poll(&mut fd, 1, ms) };
        if ready < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(io(e));
            }
        }
        hung_up |= fd.revents & libc::POLLHUP != 0;
    }
}

/// A file type in words, for errors that refuse what is not a regular file.
pub(crate) fn kind_of(ft: std::fs::FileType) -> &'static str {
    if ft.is_dir() {
        "folder"
    } else if ft.is_fifo() {
        "FIFO"
    } else if ft.is_char_device() {
        "character device"
    } else if ft.is_block_device() {
        "block device"
    } else if ft.is_socket() {
        "socket"
    } else {
        "special file"
    }
}

/// For tests: makes a FIFO at `path`, the input every reader here must
/// refuse or give up on without hanging.
#[cfg(test)]
pub(crate) fn make_fifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo has no other preconditions.
    assert_eq!(
        unsafe { libc::mkfifo(c.as_ptr(), 0o600) },
        0,
        "mkfifo {}",
        path.display()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fifo(dir: &Path) -> PathBuf {
        let path = dir.join("fifo");
        make_fifo(&path);
        path
    }

    #[test]
    fn a_file_is_read_and_one_past_the_cap_or_not_text_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("values.yaml");
        std::fs::write(&f, "a: 1\n").unwrap();
        assert_eq!(read_text(&f, 5, "x", Pipes::Refuse).unwrap(), "a: 1\n");
        let err = read_text(&f, 4, "a values file", Pipes::Refuse)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("values.yaml") && err.contains("larger than 4 bytes, not a values file"),
            "{err}"
        );
        std::fs::write(&f, b"ok\xff").unwrap();
        assert!(matches!(
            read_text(&f, 10, "x", Pipes::Refuse),
            Err(InputError::NotText { at: 2, .. })
        ));
        assert!(matches!(
            read_text(dir.path(), 10, "x", Pipes::Refuse),
            Err(InputError::NotAFile { kind: "folder", .. })
        ));
        assert!(matches!(
            read_text(&dir.path().join("none"), 10, "x", Pipes::Refuse),
            Err(InputError::Io { .. })
        ));
        // A link to a device is refused by its type, never opened.
        let dev = dir.path().join("record.json");
        std::os::unix::fs::symlink("/dev/null", &dev).unwrap();
        for pipes in [Pipes::Refuse, Pipes::Wait(Duration::from_secs(1))] {
            assert!(matches!(
                read_text(&dev, 10, "x", pipes),
                Err(InputError::NotAFile {
                    kind: "character device",
                    ..
                })
            ));
        }
    }

    #[test]
    fn a_fifo_nobody_writes_to_is_refused_or_given_up_on_without_hanging() {
        let dir = tempfile::tempdir().unwrap();
        let path = fifo(dir.path());
        assert!(matches!(
            read_text(&path, 10, "x", Pipes::Refuse),
            Err(InputError::NotAFile { kind: "FIFO", .. })
        ));
        let start = Instant::now();
        let err = read_text(&path, 10, "x", Pipes::Wait(Duration::from_millis(300))).unwrap_err();
        assert!(matches!(err, InputError::Stalled { .. }), "{err}");
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_fifo_is_read_to_its_writers_end_even_when_the_writer_comes_late() {
        let dir = tempfile::tempdir().unwrap();
        let path = fifo(dir.path());
        let writer = {
            let path = path.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(200));
                let mut w = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
                std::io::Write::write_all(&mut w, b"first ").unwrap();
                std::thread::sleep(Duration::from_millis(100));
                std::io::Write::write_all(&mut w, b"second").unwrap();
            })
        };
        assert_eq!(
            read_text(&path, 100, "x", Pipes::Wait(Duration::from_secs(10))).unwrap(),
            "first second"
        );
        writer.join().unwrap();
    }

    #[test]
    fn a_pipe_that_writes_forever_is_refused_past_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let path = fifo(dir.path());
        let writer = {
            let path = path.clone();
            std::thread::spawn(move || {
                let mut w = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
                // Until the reader goes away (EPIPE ends the loop).
                while std::io::Write::write_all(&mut w, &[b'x'; 4096]).is_ok() {}
            })
        };
        let err = read_text(
            &path,
            10_000,
            "a values file",
            Pipes::Wait(Duration::from_secs(10)),
        )
        .unwrap_err();
        assert!(
            matches!(err, InputError::TooLarge { max: 10_000, .. }),
            "{err}"
        );
        writer.join().unwrap();
    }
}
