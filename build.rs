//! Generates the kubelet device-plugin API from `proto/` with a pure-Rust
//! protobuf compiler, so no system `protoc` is needed, and stamps the commit
//! the binaries were built from into `--version`.

use std::process::Command;

/// One line of `git` output, where git and a checkout are there.
fn git(args: &[&str]) -> Option<String> {
    let o = Command::new("git").args(args).output().ok()?;
    o.status.success().then(|| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A build outside a checkout (a source tarball) says so instead of failing.
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=NODEFABRIC_COMMIT={commit}");
    // Rebuild the stamp when HEAD moves: the HEAD file, and the branch it names.
    for path in [Some("HEAD".to_string()), git(&["symbolic-ref", "-q", "HEAD"])].into_iter().flatten() {
        if let Some(file) = git(&["rev-parse", "--git-path", &path]) {
            println!("cargo:rerun-if-changed={file}");
        }
    }

    let proto = "proto/deviceplugin_v1beta1.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    // Both sides are generated: the plugin serves DevicePlugin and calls
    // Registration; the tests' kubelet stand-in does the reverse.
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    // The CRI runtime API, client side only: the containerd end-to-end test
    // talks to containerd as kubelet does. Only that test includes it.
    let cri = "proto/cri_runtime_v1.proto";
    println!("cargo:rerun-if-changed={cri}");
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .compile_fds(protox::compile([cri], ["proto"])?)?;
    Ok(())
}
