//! The `nodefabric-dra` binary: all logic lives in the library's `dra`
//! module.

fn main() -> std::process::ExitCode {
    nodefabric::dra::cli::main()
}
