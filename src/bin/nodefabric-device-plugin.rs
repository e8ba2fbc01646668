//! The `nodefabric-device-plugin` binary: all logic lives in the library's
//! `plugin` module.

fn main() -> std::process::ExitCode {
    nodefabric::plugin::cli::main()
}
