//! The `nodefabric` binary: all logic lives in the library's `cli` module.

fn main() -> std::process::ExitCode {
    nodefabric::cli::main()
}
