//! `nodefabric` as NFD's `source.d` hook: run the way nfd-worker's runHook
//! runs it (no arguments, the worker's environment, the host's sysfs at
//! /host-sys) and read the way its parseFeatureFile reads a hook's output,
//! it gives the labels `publish` writes into features.d; `install-hook` and
//! `remove-hook` put it there and take it away without NFD ever seeing a
//! partial file.

use crate::support::{fixtures, host, wait};
use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, SystemTime};

const LEAN: &str = env!("CARGO_BIN_EXE_nodefabric");

/// The labels of one feature file or hook output, read by the rules of
/// NFD's parseFeatureFile (v0.14-v0.16): lines trimmed, empty ones skipped;
/// `#` lines are comments unless they are `# +` directives (`expiry-time`,
/// RFC 3339, applying to the lines after it; `no-label` and `no-feature`
/// for the next line); a line past its expiry is dropped; `key=value`
/// split at the first `=`, a bare key meaning `true`.
fn parse_feature_file(text: &str, now: SystemTime) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut expiry: Option<SystemTime> = None;
    let mut skip_label = false;
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if line.starts_with('#') {
            if let Some(directive) = line.strip_prefix("# +") {
                let (key, value) = directive
                    .split_once('=')
                    .map_or((directive, None), |(k, v)| (k, Some(v)));
                match key {
                    "expiry-time" => {
                        let value = value.expect("expiry-time without a value");
                        expiry = Some(humantime::parse_rfc3339(value.trim()).unwrap_or_else(|e| {
                            panic!("NFD refuses the expiry-time {value:?}: {e}")
                        }));
                    }
                    "no-label" => skip_label = true,
                    "no-feature" => {}
                    other => panic!("NFD logs an unknown directive {other:?}: {line:?}"),
                }
            }
            continue;
        }
        if expiry.is_some_and(|t| t < now) {
            continue;
        }
        let (key, value) = line.split_once('=').unwrap_or((line, "true"));
        if skip_label {
            labels.remove(key);
        } else {
            labels.insert(key.to_string(), value.to_string());
        }
        skip_label = false;
    }
    labels
}

/// The environment nfd-worker's container gives a hook (exec.Command
/// passes the worker's own): its pod's downward-API variables and the
/// service-account ones Kubernetes sets, nothing of ours.
const WORKER_ENV: &[&str] = &[
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOSTNAME=nfd-worker-x7k2p",
    "NODE_NAME=node-a",
    "POD_NAME=nfd-worker-x7k2p",
    "POD_UID=0f3c9c1e-6f0a-4b57-9d2e-1a2b3c4d5e6f",
    "KUBERNETES_SERVICE_HOST=10.96.0.1",
    "KUBERNETES_SERVICE_PORT=443",
    "KUBERNETES_PORT=tcp://10.96.0.1:443",
];

/// Builds, in a private mount namespace, a root that is this machine's with
/// `tree` mounted at `$NFD_SYS_AT` (/host-sys, as NFD's worker DaemonSet
/// mounts the host's /sys), chroots into it and runs the hook with no
/// arguments and only the worker's environment. Nothing outside the
/// namespace changes: the new root is a tmpfs of bind mounts.
const AS_NFD_WORKER: &str = r#"set -eu
mount --make-rprivate /
mount -t tmpfs nfd-worker-root "$NFD_ROOT"
for d in /*; do
  if [ -L "$d" ]; then cp -P "$d" "$NFD_ROOT$d"
  elif [ -d "$d" ]; then mkdir -p "$NFD_ROOT$d"; mount --rbind "$d" "$NFD_ROOT$d"
  fi
done
mkdir -p "$NFD_ROOT$NFD_SYS_AT"
mount --bind "$NFD_TREE" "$NFD_ROOT$NFD_SYS_AT"
exec chroot "$NFD_ROOT" env -i "$@"
"#;

/// Why the namespace run cannot happen here, if it cannot.
fn no_namespace() -> Option<String> {
    if !host::is_root() {
        return Some("not root: a mount namespace and bind mounts need it".into());
    }
    ["unshare", "chroot", "mount"]
        .into_iter()
        .find(|c| !host::have(c))
        .map(|c| format!("{c} is not installed (util-linux, coreutils)"))
}

/// Runs every hook of `source_d` as nfd-worker does (regular files whose
/// names do not start with a dot, each with no arguments, stdin empty),
/// inside the namespace of [`AS_NFD_WORKER`] with `tree` at `sys_at`.
fn run_hooks_as_nfd_worker(source_d: &Path, tree: &Path, sys_at: &str) -> Vec<(String, Output)> {
    let root = tempfile::tempdir().unwrap();
    let mut names: Vec<String> = std::fs::read_dir(source_d)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|name| {
            let hook = source_d.join(&name);
            let out = Command::new("unshare")
                .args(["-m", "sh", "-c", AS_NFD_WORKER, "as-nfd-worker"])
                .args(WORKER_ENV)
                .arg(&hook)
                .env("NFD_ROOT", root.path())
                .env("NFD_TREE", tree)
                .env("NFD_SYS_AT", sys_at)
                .stdin(Stdio::null())
                .output()
                .unwrap();
            (name, out)
        })
        .collect()
}

/// The labels `publish` writes into features.d for `tree`, read by NFD's rules.
fn published_labels(tree: &Path, work: &Path) -> BTreeMap<String, String> {
    let (features, cdi, state) = (work.join("f"), work.join("c"), work.join("s"));
    let out = Command::new(LEAN)
        .arg("--sysfs-root")
        .arg(tree)
        .arg("publish")
        .arg("--features-dir")
        .arg(&features)
        .arg("--cdi-dir")
        .arg(&cdi)
        .arg("--state-dir")
        .arg(&state)
        .env("PATH", "/nonexistent")
        .env_remove("NODEFABRIC_SYSFS_ROOT")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "publish: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(features.join("nodefabric")).unwrap();
    parse_feature_file(&text, SystemTime::now())
}

/// Installs the hook into a fresh `source.d` with `install-hook`, beside a
/// hidden leftover that nfd-worker must not run.
fn source_d_with_hook(dir: &Path) -> PathBuf {
    let source_d = dir.join("source.d");
    std::fs::create_dir_all(&source_d).unwrap();
    std::fs::write(source_d.join(".nodefabric.AbC123"), "#!/bin/false\n").unwrap();
    let out = install(&source_d, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    source_d
}

fn check_hook_gives_published_labels(test: &str, sys_at: &str) {
    if !host::runnable(test, no_namespace()) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tree = fixtures::gpu8_switch_paired(&dir.path().join("tree")).root;
    let source_d = source_d_with_hook(dir.path());
    let runs = run_hooks_as_nfd_worker(&source_d, &tree, sys_at);
    assert_eq!(
        runs.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        ["nodefabric"],
        "nfd-worker would run exactly the installed hook"
    );
    let (_, out) = &runs[0];
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "the hook failed: {stderr}");
    // nfd-worker logs every stderr line of every pass: the hook says only
    // what `features` says of the same tree (here: that the copied tree's
    // NVIDIA fabric is not this host's to ask), no usage, no note.
    assert_eq!(
        diagnostics(&out.stderr),
        diagnostics(&features(&tree).stderr),
        "the hook's stderr: {stderr}"
    );
    let stdout = String::from_utf8(out.stdout.clone()).unwrap();
    let hook = parse_feature_file(&stdout, SystemTime::now());
    assert!(
        hook.contains_key("feature.gpustack.ai/rdma.capable"),
        "{stdout}"
    );
    for key in hook.keys() {
        let (ns, name) = key.split_once('/').unwrap_or_else(|| {
            panic!("{key}: NFD would put an unnamespaced key under feature.node.kubernetes.io")
        });
        assert!(!ns.is_empty() && !name.is_empty(), "{key}");
    }
    // Nothing on stdout NFD would not take as a label or a comment.
    for line in stdout.lines() {
        assert!(
            line.starts_with('#') || line.contains('='),
            "not a feature line: {line:?}"
        );
    }
    assert_eq!(
        hook,
        published_labels(&tree, dir.path()),
        "the hook's labels differ from the features.d file's"
    );
}

#[test]
fn the_hook_run_as_nfd_worker_runs_it_gives_the_labels_publish_writes() {
    check_hook_gives_published_labels(
        "the_hook_run_as_nfd_worker_runs_it_gives_the_labels_publish_writes",
        "/host-sys",
    );
}

#[test]
fn the_hook_without_host_sys_reads_sys() {
    // Outside NFD's container (the hook run on the host itself) there is
    // no /host-sys: /sys is the tree read.
    check_hook_gives_published_labels("the_hook_without_host_sys_reads_sys", "/sys");
}

/// `nodefabric --sysfs-root TREE features`, the command a bare run is.
fn features(tree: &Path) -> Output {
    Command::new(LEAN)
        .arg("--sysfs-root")
        .arg(tree)
        .arg("features")
        .env("PATH", "/nonexistent")
        .env_remove("NODEFABRIC_SYSFS_ROOT")
        .output()
        .unwrap()
}

/// Stderr's lines without the log lines' leading timestamps.
fn diagnostics(stderr: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(stderr)
        .lines()
        .map(|l| match l.split_once(' ') {
            Some((stamp, rest)) if stamp.ends_with('Z') => rest.trim_start().to_string(),
            _ => l.to_string(),
        })
        .collect()
}

fn run_bare(env: &[(&str, &Path)]) -> Output {
    let mut cmd = Command::new(LEAN);
    cmd.env("PATH", "/nonexistent")
        .env_remove("NODEFABRIC_SYSFS_ROOT")
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

#[test]
fn bare_nodefabric_prints_the_feature_lines_not_its_usage() {
    let dir = tempfile::tempdir().unwrap();
    let tree = fixtures::gpu8_switch_paired(&dir.path().join("tree")).root;
    // NODEFABRIC_* variables still apply to a bare run.
    let bare = run_bare(&[("NODEFABRIC_SYSFS_ROOT", &tree)]);
    let features = features(&tree);
    assert_eq!(
        bare.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&bare.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&bare.stdout),
        String::from_utf8_lossy(&features.stdout)
    );
    assert!(!bare.stdout.is_empty());
    // Not a terminal (nfd-worker's pipe): no note of what it did, only
    // what `features` says of the tree.
    assert_eq!(diagnostics(&bare.stderr), diagnostics(&features.stderr));
}

#[test]
fn bare_nodefabric_at_a_terminal_says_what_it_did_and_where_help_is() {
    let test = "bare_nodefabric_at_a_terminal_says_what_it_did_and_where_help_is";
    let missing =
        (!host::have("script")).then(|| "script (util-linux) is not installed".to_string());
    if !host::runnable(test, missing) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tree = fixtures::gpu8_switch_paired(&dir.path().join("tree")).root;
    // script(1) gives the binary a terminal, as a person's shell does.
    let out = Command::new("script")
        .args(["-qec", LEAN, "/dev/null"])
        .env("NODEFABRIC_SYSFS_ROOT", &tree)
        .env("PATH", "/usr/bin:/bin")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains(&format!("ran `features` on {}", tree.display()))
            && text.contains("wrote nothing")
            && text.contains("nodefabric --help"),
        "{text}"
    );
    assert!(text.contains("feature.gpustack.ai/rdma.capable="), "{text}");
}

#[test]
fn help_says_what_a_run_without_arguments_does() {
    let out = Command::new(LEAN).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    for said in [
        "With no arguments at all",
        "source.d hook",
        "/host-sys",
        "NODEFABRIC_SYSFS_ROOT",
        "install-hook",
        "remove-hook",
    ] {
        assert!(help.contains(said), "--help lacks {said:?}:\n{help}");
    }
}

fn install(dest: &Path, extra: &[&str]) -> Output {
    Command::new(LEAN)
        .arg("install-hook")
        .arg("--dest")
        .arg(dest)
        .args(extra)
        .output()
        .unwrap()
}

fn remove(dest: &Path) -> Output {
    Command::new(LEAN)
        .arg("remove-hook")
        .arg("--dest")
        .arg(dest)
        .output()
        .unwrap()
}

/// The names created, moved out and moved in under a folder, in order,
/// seen through inotify while `act` runs.
fn watched(dir: &Path, act: impl FnOnce()) -> Vec<(&'static str, String, u32)> {
    // SAFETY: plain syscalls on a descriptor this function owns; the buffer
    // is parsed within the length read, as inotify(7) lays events out.
    unsafe {
        let fd = libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK);
        assert!(fd >= 0);
        let path = CString::new(dir.as_os_str().as_bytes()).unwrap();
        let mask = libc::IN_CREATE | libc::IN_MOVED_FROM | libc::IN_MOVED_TO | libc::IN_DELETE;
        assert!(libc::inotify_add_watch(fd, path.as_ptr(), mask) >= 0);
        act();
        let mut buf = vec![0u8; 1 << 16];
        let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
        libc::close(fd);
        assert!(n > 0, "no events under {}", dir.display());
        let mut events = Vec::new();
        let mut at = 0usize;
        let head = std::mem::size_of::<libc::inotify_event>();
        while at < n as usize {
            let ev: libc::inotify_event = std::ptr::read_unaligned(buf[at..].as_ptr().cast());
            let name = &buf[at + head..at + head + ev.len as usize];
            let name = String::from_utf8_lossy(name)
                .trim_end_matches('\0')
                .to_string();
            let what = match ev.mask & mask {
                libc::IN_CREATE => "create",
                libc::IN_MOVED_FROM => "moved_from",
                libc::IN_MOVED_TO => "moved_to",
                libc::IN_DELETE => "delete",
                other => panic!("event mask {other:#x}"),
            };
            events.push((what, name, ev.cookie));
            at += head + ev.len as usize;
        }
        events
    }
}

#[test]
fn install_hook_never_shows_nfd_a_partial_file_under_a_visible_name() {
    let dir = tempfile::tempdir().unwrap();
    let events = watched(dir.path(), || {
        let out = install(dir.path(), &[]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
    // The copy is made under a hidden name (nfd-worker skips it) and renamed
    // into place: `nodefabric` appears only as the rename's target.
    let (created, rest): (Vec<_>, Vec<_>) = events.iter().partition(|e| e.0 == "create");
    assert_eq!(created.len(), 1, "{events:?}");
    let temp = &created[0].1;
    assert!(temp.starts_with(".nodefabric."), "{events:?}");
    assert_eq!(rest.len(), 2, "{events:?}");
    assert_eq!((rest[0].0, &rest[0].1), ("moved_from", temp), "{events:?}");
    assert_eq!(
        (rest[1].0, rest[1].1.as_str()),
        ("moved_to", "nodefabric"),
        "{events:?}"
    );
    assert_eq!(rest[0].2, rest[1].2, "one rename: {events:?}");

    let hook = dir.path().join("nodefabric");
    assert_eq!(std::fs::read(&hook).unwrap(), std::fs::read(LEAN).unwrap());
    let mode = std::fs::metadata(&hook).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o755, "nfd-worker, whatever its uid, must execute it");
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["nodefabric"], "a temp file was left behind");
}

#[test]
fn install_hook_replaces_an_older_hook_without_writing_into_it() {
    let dir = tempfile::tempdir().unwrap();
    let hook = dir.path().join("nodefabric");
    std::fs::write(&hook, "#!/bin/sh\necho old=hook\n").unwrap();
    // An upgrade while nfd-worker runs the old hook: the running file is
    // never written into (that would fail with ETXTBSY, or change it under
    // the running process); the name moves to a new file.
    let old = std::fs::File::open(&hook).unwrap();
    let old_inode = old.metadata().unwrap().ino();
    let out = install(dir.path(), &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_ne!(std::fs::metadata(&hook).unwrap().ino(), old_inode);
    assert_eq!(std::fs::read(&hook).unwrap(), std::fs::read(LEAN).unwrap());
    let mut was = String::new();
    std::io::Read::read_to_string(&mut &old, &mut was).unwrap();
    assert_eq!(was, "#!/bin/sh\necho old=hook\n");
}

#[test]
fn install_hook_into_a_missing_folder_fails_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-source.d");
    let out = install(&missing, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(&missing.display().to_string()), "{err}");
    assert!(!missing.exists());
}

#[test]
fn remove_hook_takes_the_hook_away_and_a_second_removal_is_no_error() {
    let dir = tempfile::tempdir().unwrap();
    assert!(install(dir.path(), &[]).status.success());
    let first = remove(dir.path());
    assert!(first.status.success());
    assert!(!dir.path().join("nodefabric").exists());
    assert!(String::from_utf8_lossy(&first.stderr).contains("removed"));
    // A preStop run again, or after the file went with a node's reinstall.
    let second = remove(dir.path());
    assert!(
        second.status.success(),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    // Something not ours under the name is left, said so, and fails.
    std::fs::create_dir(dir.path().join("nodefabric")).unwrap();
    let third = remove(dir.path());
    assert_eq!(third.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&third.stderr).contains("not a regular file"));
}

#[test]
fn install_hook_wait_holds_until_sigterm_and_leaves_removal_to_the_pre_stop() {
    use wait_timeout::ChildExt;
    let dir = tempfile::tempdir().unwrap();
    let hook = dir.path().join("nodefabric");
    let mut child = Command::new(LEAN)
        .arg("install-hook")
        .arg("--dest")
        .arg(dir.path())
        .arg("--wait")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait::until("the hook installed", || hook.exists(), |&there| there);
    // Still holding: the pod stays until it is deleted.
    assert!(child
        .wait_timeout(Duration::from_millis(200))
        .unwrap()
        .is_none());
    // SAFETY: signalling our own child, which has not been reaped.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let status = child
        .wait_timeout(Duration::from_secs(10))
        .unwrap()
        .expect("SIGTERM did not end install-hook --wait");
    assert_eq!(status.code(), Some(0));
    assert!(
        hook.exists(),
        "the preStop's remove-hook removes it, not SIGTERM"
    );
    assert!(remove(dir.path()).status.success());
    assert!(!hook.exists());
}

#[test]
fn the_feature_file_reader_drops_comments_expired_and_no_label_lines_as_nfd_does() {
    let now = SystemTime::now();
    let text = "\n  a.b/x=1  \n# a comment=not\n# +no-label\na.b/hidden=1\na.b/flag\n# +expiry-time=2000-01-01T00:00:00Z\na.b/old=1\n";
    let got = parse_feature_file(text, now);
    let want: BTreeMap<String, String> = [("a.b/x", "1"), ("a.b/flag", "true")]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    assert_eq!(got, want);
}
