//! The binary NFD starts every minute stays lean: linked static and
//! non-PIE, without the Kubernetes client, async runtime, TLS, gRPC or NVML
//! loader, and it hands the commands that need those to `nodefabric-full`
//! with their output unchanged.

use crate::support::fixtures;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const LEAN: &str = env!("CARGO_BIN_EXE_nodefabric");
const FULL: &str = env!("CARGO_BIN_EXE_nodefabric-full");

/// The ELF facts that decide how a binary starts: its type (2 executable,
/// 3 position-independent) and whether it names a dynamic loader.
fn elf_start(path: &str) -> (u16, bool) {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..4], b"\x7fELF", "{path}: not ELF");
    let u16_at = |o: usize| u16::from_le_bytes(bytes[o..o + 2].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap());
    let (phoff, phentsize, phnum) = (u64_at(32) as usize, u16_at(54) as usize, u16_at(56));
    let interp = (0..phnum as usize).any(|i| {
        let at = phoff + i * phentsize;
        u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) == 3 // PT_INTERP
    });
    (u16_at(16), interp)
}

/// The static C library the build links `nodefabric` against, if this machine has one.
fn static_libc() -> bool {
    Command::new("cc")
        .arg("-print-file-name=libc.a")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .is_some_and(|p| Path::new(p.trim()).is_absolute())
}

#[test]
fn the_hook_binary_is_static_and_not_position_independent() {
    if !static_libc() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI has no static libc: install libc6-dev"
        );
        eprintln!(
            "skipped: no static libc here, so nodefabric is linked dynamically (build.rs warns)"
        );
        return;
    }
    assert_eq!(
        elf_start(LEAN),
        (2, false),
        "{LEAN}: want ET_EXEC without PT_INTERP"
    );
    // The full binary stays dynamic: it loads NVML with dlopen.
    assert!(elf_start(FULL).1, "{FULL} should be dynamic");
}

/// Defined symbols of a binary, demangled.
fn symbols(path: &str) -> String {
    let o = Command::new("nm")
        .args(["-C", "--defined-only", path])
        .output()
        .expect("run nm (binutils)");
    assert!(
        o.status.success(),
        "nm {path}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn the_hook_binary_links_no_api_client_runtime_tls_grpc_or_nvml_loader() {
    let (lean, full) = (symbols(LEAN), symbols(FULL));
    // What each part does its work with (an error type's Display may be
    // linked for a message; these are the parts that act).
    for part in [
        "tokio::runtime",
        "kube_client::client::Client",
        "rustls::client",
        "hyper::client",
        "axum::serve",
        "h2::proto",
        "libloading::os::unix::Library::open",
        "nvml_wrapper::Nvml",
    ] {
        assert!(
            full.contains(part),
            "nodefabric-full lacks {part}: the check is vacuous"
        );
        let found: Vec<&str> = lean.lines().filter(|l| l.contains(part)).take(3).collect();
        assert!(found.is_empty(), "nodefabric links {part}: {found:#?}");
    }
    assert!(!lean.contains("tonic::"), "nodefabric links gRPC");
}

/// `nodefabric` alone in a folder, with no `nodefabric-full` beside it or on PATH.
fn lean_alone(dir: &Path) -> PathBuf {
    let alone = dir.join("bin/nodefabric");
    std::fs::create_dir_all(alone.parent().unwrap()).unwrap();
    std::fs::copy(LEAN, &alone).unwrap();
    alone
}

fn run(bin: &Path, args: &[&str]) -> Output {
    Command::new(bin)
        .args(args)
        .env("NODEFABRIC_NOW", "2026-03-01T12:00:00Z")
        .env("PATH", "/nonexistent")
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("NODEFABRIC_SYSFS_ROOT")
        .output()
        .unwrap()
}

#[test]
fn the_node_commands_run_in_the_hook_binary_alone_with_the_full_binarys_output() {
    let dir = tempfile::tempdir().unwrap();
    let tree = fixtures::gpu8_switch_paired(&dir.path().join("sys"));
    let alone = lean_alone(dir.path());
    let root = tree.root.to_str().unwrap();
    for cmd in ["inventory", "features", "preflight", "cdi"] {
        let args = ["--sysfs-root", root, cmd];
        let (lean, full) = (run(&alone, &args), run(Path::new(FULL), &args));
        assert_eq!(lean.status.code(), full.status.code(), "{cmd}");
        assert_eq!(
            String::from_utf8_lossy(&lean.stdout),
            String::from_utf8_lossy(&full.stdout),
            "{cmd}: the two binaries disagree"
        );
        assert!(!lean.stdout.is_empty(), "{cmd} printed nothing");
    }
}

#[test]
fn a_command_for_the_full_binary_is_handed_to_it_with_its_output() {
    let dir = tempfile::tempdir().unwrap();
    let (lean, full) = (
        run(Path::new(LEAN), &["crd"]),
        run(Path::new(FULL), &["crd"]),
    );
    assert!(full.status.success());
    assert_eq!(lean.stdout, full.stdout, "crd through nodefabric");
    // Without nodefabric-full the hook binary says what is missing, and why.
    let alone = run(&lean_alone(dir.path()), &["crd"]);
    assert_eq!(alone.status.code(), Some(1));
    let err = String::from_utf8_lossy(&alone.stderr);
    assert!(
        err.contains("nodefabric-full") && err.contains("`crd`") && err.contains("PATH"),
        "{err}"
    );
}
