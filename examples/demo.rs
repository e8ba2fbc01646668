//! Runs `nodefabric` end to end with no host requirements: builds the bundled
//! 8-GPU / 8-NIC fixture sysfs tree, prints the preflight report, and
//! publishes the feature file, CDI specs and record into `target/demo/`.
//!
//! ```text
//! cargo run --example demo            # then: cat target/demo/features.d/nodefabric
//! ```

#[path = "../tests/support/fixtures.rs"]
mod fixtures;

use clap::Parser;
use nodefabric::cli::{self, Cli};
use std::path::Path;

fn main() -> std::process::ExitCode {
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/demo");
    let sysfs = out.join("sysfs");
    let _ = std::fs::remove_dir_all(&sysfs);
    fixtures::gpu8_switch_paired(&sysfs);
    println!("fixture sysfs tree: {}\n", sysfs.display());
    let root = sysfs.to_str().expect("UTF-8 path");
    let run = |args: &[&str]| {
        let mut argv = vec!["nodefabric", "--sysfs-root", root];
        argv.extend_from_slice(args);
        println!("$ {}", argv.join(" "));
        cli::run(&Cli::parse_from(argv))
    };
    run(&["preflight"]);
    let features = out.join("features.d");
    let state = out.join("state");
    let cdi = out.join("cdi");
    let code = run(&[
        "publish",
        "--features-dir",
        features.to_str().unwrap(),
        "--state-dir",
        state.to_str().unwrap(),
        "--cdi-dir",
        cdi.to_str().unwrap(),
    ]);
    println!(
        "\nwrote {}/nodefabric, {}/record.json and the CDI specs in {}",
        features.display(),
        state.display(),
        cdi.display()
    );
    code
}
