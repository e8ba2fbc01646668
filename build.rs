//! Generates the kubelet device-plugin, plugin-registration and DRA APIs (and
//! the CRI client the containerd test uses) from `proto/` with a pure-Rust
//! protobuf compiler, so no system `protoc` is needed, and stamps the commit
//! into `--version`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Every file under proto/ is upstream's, byte for byte (proto/NOTICE), so
    // the gRPC names come from upstream's `package` lines: a name cannot be
    // wrong on the server and agree with itself on the tests' client side.
    println!("cargo:rerun-if-changed=proto");
    // kubelet's APIs, both sides: the binaries serve DevicePlugin,
    // Registration (plugin watcher) and DRAPlugin and call the device
    // plugin's Registration; the tests play kubelet with the clients. Each
    // package becomes `OUT_DIR/<package>.rs`; all the packages differ
    // (`v1beta1` is the device plugin's, DRA v1beta1's is
    // `k8s.io.kubelet.pkg.apis.dra.v1beta1`).
    let kubelet = [
        "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/api.proto",
        "k8s.io/kubelet/pkg/apis/pluginregistration/v1/api.proto",
        "k8s.io/kubelet/pkg/apis/dra/v1/api.proto",
        "k8s.io/kubelet/pkg/apis/dra/v1beta1/api.proto",
        "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1/api.proto",
    ];
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(protox::compile(kubelet, ["proto"])?)?;
    // The CRI runtime API, client side only: the containerd end-to-end test
    // talks to containerd as kubelet does. Only that test includes it.
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .compile_fds(protox::compile(
            ["k8s.io/cri-api/pkg/apis/runtime/v1/api.proto"],
            ["proto"],
        )?)?;
    commit();
    link_hook_static()?;
    Ok(())
}

/// Links the `nodefabric` binary (the one NFD starts every minute) static and
/// not position-independent: its start-up then skips the dynamic loader's
/// search and relocation of libc, most of what such a short run costs.
///
/// Cargo cannot give one binary `+crt-static` (a target feature applies to
/// every crate, proc-macros included, which then cannot be built), so the
/// link is made static from the linker's side. rustc asks for std's system
/// libraries with `-Bdynamic -lgcc_s -lc …`; a folder searched first holds a
/// linker script under each of those names that names the static archive
/// instead, and `-static -no-pie` make the executable. The other binaries
/// stay dynamic: they load NVML with dlopen, which needs the dynamic libc.
/// Where the static archives are missing (no libc6-dev), the binary is
/// linked as before with packed relative relocations, and a warning says so.
fn link_hook_static() -> Result<(), Box<dyn std::error::Error>> {
    let target_ok = std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux")
        && std::env::var("CARGO_CFG_TARGET_ENV").as_deref() == Ok("gnu");
    if !target_ok {
        return Ok(());
    }
    // The C compiler rustc links with answers where its archives are; a bare
    // name back means it has none.
    let archive = |name: &str| -> Option<String> {
        let out = std::process::Command::new("cc")
            .arg(format!("-print-file-name={name}"))
            .output()
            .ok()?;
        let path = String::from_utf8(out.stdout).ok()?.trim().to_string();
        std::path::Path::new(&path).is_absolute().then_some(path)
    };
    let libc = archive("libc.a");
    let gcc = archive("libgcc_eh.a").zip(archive("libgcc.a"));
    let (Some(libc), Some((gcc_eh, gcc))) = (libc, gcc) else {
        println!(
            "cargo::warning=no static libc here (libc6-dev): nodefabric is linked dynamically"
        );
        println!("cargo::rustc-link-arg-bin=nodefabric=-Wl,-z,pack-relative-relocs");
        return Ok(());
    };
    let dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("static-libs");
    std::fs::create_dir_all(&dir)?;
    let mut scripts = vec![
        (
            "libgcc_s.so".to_string(),
            format!("INPUT({gcc_eh} {gcc})\n"),
        ),
        (
            "libc.so".to_string(),
            format!("GROUP({libc} {gcc_eh} {gcc})\n"),
        ),
    ];
    // Merged into libc since glibc 2.34; their archives are empty, but rustc
    // still names them.
    for lib in ["m", "pthread", "rt", "util", "dl"] {
        let body = archive(&format!("lib{lib}.a")).map_or_else(
            || "/* in libc */\n".to_string(),
            |a| format!("INPUT({a})\n"),
        );
        scripts.push((format!("lib{lib}.so"), body));
    }
    for (name, body) in scripts {
        std::fs::write(dir.join(name), body)?;
    }
    println!("cargo::rustc-link-arg-bin=nodefabric=-L{}", dir.display());
    println!("cargo::rustc-link-arg-bin=nodefabric=-static");
    println!("cargo::rustc-link-arg-bin=nodefabric=-no-pie");
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
