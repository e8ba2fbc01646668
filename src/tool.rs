//! Running a vendor tool (`nvidia-smi`) as an answer that can fail: it may be
//! missing, exit non-zero, hang, or print without end. Each of those is an
//! unreadable answer naming the command, never a hung pass or an empty one.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;
use wait_timeout::ChildExt;

/// The default time a vendor tool gets before it is killed (`--tool-timeout`).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The most output a tool may print: `nvidia-smi -q` on a 16-GPU node is a
/// few hundred KiB, so more than this is not an answer but a runaway.
pub const MAX_OUTPUT: u64 = 16 * 1024 * 1024;

/// The most of a failing tool's standard error an error keeps: the first
/// lines say what went wrong, and the text is copied into every
/// accelerator's note and the record, so a runaway must not be.
pub const MAX_STDERR_KEPT: usize = 256;

/// `text` cut to at most `max` bytes at a character boundary, with the
/// length of the whole (`total` bytes) said when anything was cut.
pub fn cap_text(text: &str, max: usize, total: u64) -> String {
    if text.len() <= max && total <= text.len() as u64 {
        return text.to_string();
    }
    let mut end = max.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{} …(truncated, {total} bytes in all)",
        text[..end].trim_end()
    )
}

/// The head of a failing tool's standard error as text, cut at a character
/// boundary: `kept` is its first bytes, `total` how many it wrote.
fn stderr_text(kept: &[u8], total: u64) -> String {
    // A cut inside a character leaves an incomplete sequence at the end,
    // which is dropped rather than shown as a replacement character.
    let whole = match std::str::from_utf8(kept) {
        Err(e) if e.error_len().is_none() && (kept.len() as u64) < total => {
            &kept[..e.valid_up_to()]
        }
        _ => kept,
    };
    let text = String::from_utf8_lossy(whole);
    let text = text.trim();
    if (kept.len() as u64) < total {
        cap_text(text, MAX_STDERR_KEPT, total)
    } else {
        text.to_string()
    }
}

/// Why a tool's answer is unreadable, naming the command. The text is the
/// whole answer a capture records and a note carries, so the I/O error is
/// part of it rather than a source.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// The tool could not be started (not installed, not runnable).
    #[error("running {cmd}: {reason}")]
    Start {
        /// The command line.
        cmd: String,
        /// What exec said.
        reason: std::io::Error,
    },
    /// Waiting for the tool failed.
    #[error("waiting for {cmd}: {reason}")]
    Wait {
        /// The command line.
        cmd: String,
        /// What the wait said.
        reason: std::io::Error,
    },
    /// The tool ran past its time and was killed.
    #[error("{cmd} did not answer within {}, killed", humantime::format_duration(*timeout))]
    Hung {
        /// The command line.
        cmd: String,
        /// The time it had.
        timeout: Duration,
    },
    /// The tool exited, but something kept its output open past the time.
    #[error("{cmd} exited but its output did not end within {}", humantime::format_duration(*timeout))]
    OutputOpen {
        /// The command line.
        cmd: String,
        /// The time it had.
        timeout: Duration,
    },
    /// The tool exited non-zero.
    #[error("{cmd} exited with {status}: {stderr}")]
    Failed {
        /// The command line.
        cmd: String,
        /// How it exited.
        status: ExitStatus,
        /// Its standard error, trimmed, at most [`MAX_STDERR_KEPT`] bytes
        /// of it with the whole length when it was longer.
        stderr: String,
    },
    /// The tool printed more than [`MAX_OUTPUT`].
    #[error("{cmd} printed more than {MAX_OUTPUT} bytes, refused")]
    TooMuch {
        /// The command line.
        cmd: String,
    },
}

/// Runs `bin args…` and returns its standard output, or why it is unreadable:
/// not started, killed after `timeout`, exited non-zero, or over [`MAX_OUTPUT`].
pub fn output(bin: &Path, args: &[&str], timeout: Duration) -> Result<String, ToolError> {
    // Not installed is one more unreadable answer here, worded as exec says it.
    output_if_installed(bin, args, timeout)?.ok_or_else(|| ToolError::Start {
        cmd: format!("{} {}", bin.display(), args.join(" ")),
        reason: std::io::Error::from_raw_os_error(libc::ENOENT),
    })
}

/// False only when nothing named `bin` is there to start: a path that
/// names nothing, or a bare name found in no folder of `PATH` (an empty
/// entry is the working folder, as exec reads it). Then no process is
/// started to learn what a look at the folders says; anything found, even
/// unrunnable, is left for the spawn to start or to refuse in its words.
fn may_be_installed(bin: &Path) -> bool {
    if bin.components().count() > 1 {
        return std::fs::symlink_metadata(bin).is_ok();
    }
    let Some(path) = std::env::var_os("PATH") else {
        return true;
    };
    std::env::split_paths(&path).any(|dir| {
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir.as_path()
        };
        std::fs::symlink_metadata(dir.join(bin)).is_ok()
    })
}

/// [`output`], with `Ok(None)` when the tool is not installed at all: for
/// callers that have another way to the answer (rails fall back to the
/// PCIe walk when there is no `nvidia-smi`).
pub fn output_if_installed(
    bin: &Path,
    args: &[&str],
    timeout: Duration,
) -> Result<Option<String>, ToolError> {
    if !may_be_installed(bin) {
        return Ok(None);
    }
    let cmd = format!("{} {}", bin.display(), args.join(" "));
    let mut child = match Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group, so a timeout can kill what it forked too:
        // a grandchild left behind would outlive the pass and every retry.
        .process_group(0)
        .spawn()
    {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(reason) => return Err(ToolError::Start { cmd, reason }),
    };
    // Both pipes are drained on their own threads, so a tool that fills one
    // while we wait on the other cannot deadlock the pass. Each thread hands
    // its bytes over a channel, so the wait for them is bounded too.
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(p) = pipe {
                let _ = p.take(MAX_OUTPUT + 1).read_to_end(&mut buf);
            }
            let _ = tx.send(buf);
        });
        rx
    };
    let started = std::time::Instant::now();
    let out = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let err = drain_head(child.stderr.take());
    let status = match child
        .wait_timeout(timeout)
        .map_err(|reason| ToolError::Wait {
            cmd: cmd.clone(),
            reason,
        })? {
        Some(status) => status,
        None => {
            kill_group(&mut child);
            let _ = child.wait();
            return Err(ToolError::Hung { cmd, timeout });
        }
    };
    // A child that exited but left a grandchild holding its pipes open would
    // keep the readers waiting: they get what is left of the timeout.
    let left = || {
        timeout
            .saturating_sub(started.elapsed())
            .max(Duration::from_millis(100))
    };
    let stdout = match out.recv_timeout(left()) {
        Ok(stdout) => stdout,
        Err(_) => {
            // What holds the pipe is something the tool forked, still in its
            // group though the tool itself is gone and reaped.
            kill_group(&mut child);
            return Err(ToolError::OutputOpen { cmd, timeout });
        }
    };
    let (stderr, total) = err.recv_timeout(left()).unwrap_or_default();
    if !status.success() {
        return Err(ToolError::Failed {
            cmd,
            status,
            stderr: stderr_text(&stderr, total),
        });
    }
    if stdout.len() as u64 > MAX_OUTPUT {
        return Err(ToolError::TooMuch { cmd });
    }
    Ok(Some(String::from_utf8_lossy(&stdout).into_owned()))
}

/// Reads `pipe` to its end on a thread of its own, keeping only its first
/// [`MAX_STDERR_KEPT`] bytes and counting the rest: a tool that fails with
/// megabytes of errors costs this process a few hundred bytes, and is never
/// blocked on a full pipe. Hands over the head and the whole length.
fn drain_head(
    pipe: Option<std::process::ChildStderr>,
) -> std::sync::mpsc::Receiver<(Vec<u8>, u64)> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut head = Vec::with_capacity(MAX_STDERR_KEPT);
        let mut total = 0u64;
        if let Some(mut p) = pipe {
            let mut buf = [0u8; 8192];
            loop {
                match p.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        let room = MAX_STDERR_KEPT - head.len();
                        head.extend_from_slice(&buf[..n.min(room)]);
                        total += n as u64;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
        }
        let _ = tx.send((head, total));
    });
    rx
}

/// Kills the tool's whole process group (it leads one, see the spawn), so
/// nothing it forked is orphaned; the leader itself is killed as well in
/// case the group is already gone, and is left for the caller to reap.
fn kill_group(child: &mut std::process::Child) {
    if let Ok(pgid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: killpg only sends a signal; the group is the one the child
        // leads, whose id cannot be reused while the child is unreaped or any
        // member of the group lives.
        unsafe { libc::killpg(pgid, libc::SIGKILL) };
    }
    let _ = child.kill();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hung_tool_is_killed_and_unreadable() {
        let e = output(Path::new("sleep"), &["30"], Duration::from_millis(200))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("did not answer within") && e.contains("sleep 30"),
            "{e}"
        );
    }

    /// Whether `pid` is gone: no such process, or a zombie nobody reaped yet
    /// (a container's init may be slow to reap what it inherits).
    fn gone(pid: i32) -> bool {
        // SAFETY: signal 0 only checks that the process exists.
        if unsafe { libc::kill(pid, 0) } != 0 {
            return true;
        }
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
            .unwrap_or(true)
    }

    #[test]
    fn a_timed_out_tools_grandchildren_are_orphaned() {
        let dir = tempfile::tempdir().unwrap();
        let tool = dir.path().join("fake-tool");
        let pidfile = dir.path().join("grandchild.pid");
        std::fs::write(&tool, "#!/bin/sh\nsleep 300 &\necho $! > \"$1\"\nwait\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = output(
            &tool,
            &[pidfile.to_str().unwrap()],
            Duration::from_millis(500),
        )
        .unwrap_err();
        assert!(matches!(e, ToolError::Hung { .. }), "{e}");
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !gone(pid) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let alive = !gone(pid);
        if alive {
            // SAFETY: the test's own grandchild, so it does not outlive the test.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        assert!(!alive, "grandchild {pid} outlived the timed-out tool");
    }

    #[test]
    fn a_missing_tool_names_itself() {
        let e = output(
            Path::new("/nonexistent/nvidia-smi"),
            &["-q"],
            DEFAULT_TIMEOUT,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("/nonexistent/nvidia-smi -q"), "{e}");
    }

    #[test]
    fn a_tool_found_nowhere_is_not_started_and_one_found_is() {
        assert!(!may_be_installed(Path::new("nodefabric-no-such-tool")));
        assert!(!may_be_installed(Path::new("/nonexistent/nvidia-smi")));
        assert!(may_be_installed(Path::new("sh")), "sh is on every PATH");
        assert!(may_be_installed(Path::new("/bin/sh")));
        let e = output(
            Path::new("nodefabric-no-such-tool"),
            &["-q"],
            DEFAULT_TIMEOUT,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "running nodefabric-no-such-tool -q: {}",
                std::io::Error::from_raw_os_error(libc::ENOENT)
            )
        );
        // A file that is there but cannot be run is the spawn's to refuse.
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("not-a-program");
        std::fs::write(&plain, "text").unwrap();
        let e = output(&plain, &[], DEFAULT_TIMEOUT)
            .unwrap_err()
            .to_string();
        assert!(e.contains("Permission denied"), "{e}");
    }

    #[test]
    fn a_failing_tool_reports_its_status_and_stderr() {
        let e = output(
            Path::new("sh"),
            &["-c", "echo broken >&2; exit 3"],
            DEFAULT_TIMEOUT,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("exit status: 3") && e.contains("broken"), "{e}");
    }

    #[test]
    fn a_failing_tools_stderr_is_kept_to_its_head_and_its_length() {
        let e = output(
            Path::new("sh"),
            &["-c", "printf x >&2; yes 'ééé' | head -c 99999 >&2; exit 3"],
            DEFAULT_TIMEOUT,
        )
        .unwrap_err();
        let ToolError::Failed { stderr, .. } = &e else {
            panic!("{e}")
        };
        assert!(
            stderr.len() <= MAX_STDERR_KEPT + 64,
            "{} bytes",
            stderr.len()
        );
        assert!(stderr.starts_with("xééé"), "{stderr}");
        assert!(
            stderr.ends_with(" …(truncated, 100000 bytes in all)"),
            "{stderr}"
        );
        assert!(!stderr.contains('\u{fffd}'), "{stderr}");
        // A short one is kept whole, as it was.
        assert_eq!(cap_text("short", 10, 5), "short");
        assert_eq!(cap_text("ééé", 3, 6), "é …(truncated, 6 bytes in all)");
    }
}
