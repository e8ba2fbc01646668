//! Generates the kubelet device-plugin API from `proto/` with a pure-Rust
//! protobuf compiler, so no system `protoc` is needed.

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
    Ok(())
}
