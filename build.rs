//! Generates the kubelet device-plugin, plugin-registration and DRA APIs (and
//! the CRI client the containerd test uses) from `proto/` with a pure-Rust
//! protobuf compiler, so no system `protoc` is needed, and stamps the commit
//! into `--version`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/deviceplugin_v1beta1.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    // Both sides are generated: the plugin serves DevicePlugin and calls
    // Registration; the tests' kubelet stand-in does the reverse.
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    // kubelet's plugin-registration API, both sides: the DRA driver serves
    // Registration on its registration socket; the tests dial it as kubelet.
    let registration = "proto/pluginregistration_v1.proto";
    println!("cargo:rerun-if-changed={registration}");
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(protox::compile([registration], ["proto"])?)?;
    // kubelet's DRA plugin API in both versions kubelet speaks: the DRA
    // driver serves them on one socket; the tests dial them as kubelet.
    // Each goes to a folder of its own: DRA v1beta1's package has the same
    // name as the device-plugin API's ("v1beta1") and its own `Device`.
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    for (version, dir) in [("v1", "dra_v1"), ("v1beta1", "dra_v1beta1")] {
        let dra = format!("proto/dra_{version}.proto");
        println!("cargo:rerun-if-changed={dra}");
        std::fs::create_dir_all(out.join(dir))?;
        tonic_prost_build::configure()
            .build_client(true)
            .build_server(true)
            .out_dir(out.join(dir))
            .compile_fds(protox::compile([&dra], ["proto"])?)?;
    }
    // The CRI runtime API, client side only: the containerd end-to-end test
    // talks to containerd as kubelet does. Only that test includes it.
    let cri = "proto/cri_runtime_v1.proto";
    println!("cargo:rerun-if-changed={cri}");
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .compile_fds(protox::compile([cri], ["proto"])?)?;
    commit();
    Ok(())
}

/// Sets `NODEFABRIC_COMMIT` for `--version`: the value given to the build
/// (an image build without `.git`), else `git rev-parse`, else "unknown".
fn commit() {
    println!("cargo:rerun-if-env-changed=NODEFABRIC_COMMIT");
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .map(|s| s.trim().to_string())
    };
    // Rebuild when HEAD moves (a worktree keeps HEAD outside `.git/`).
    for path in [git(&["rev-parse", "--git-path", "HEAD"]), git(&["rev-parse", "--symbolic-full-name", "HEAD"])
        .and_then(|r| git(&["rev-parse", "--git-path", &r]))]
    .into_iter()
    .flatten()
    // A missing file would make cargo rerun this script on every build.
    .filter(|p| std::path::Path::new(p).exists())
    {
        println!("cargo:rerun-if-changed={path}");
    }
    let commit = std::env::var("NODEFABRIC_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=NODEFABRIC_COMMIT={commit}");
}
