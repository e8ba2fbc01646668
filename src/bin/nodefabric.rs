//! The `nodefabric` binary NFD runs every minute: lean and linked static
//! (see build.rs); a command that needs the Kubernetes API or NVML is handed
//! to `nodefabric-full` (`cli::forward`).

fn main() -> std::process::ExitCode {
    nodefabric::cli::main_lean()
}
