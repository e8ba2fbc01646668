//! `nodefabric-full`: every `nodefabric` command, with the Kubernetes API
//! client and NVML linked in (the record broker, the Node Observer, the
//! interval publisher's probes, the NVLink fabric from NVML).

fn main() -> std::process::ExitCode {
    nodefabric::cli::main()
}
