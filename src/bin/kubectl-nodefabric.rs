//! `kubectl-nodefabric`: the kubectl plugin (`kubectl nodefabric rails`).
//! Its code is the library's `cli::kubectl`.

fn main() -> std::process::ExitCode {
    nodefabric::cli::kubectl::main()
}
