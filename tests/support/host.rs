//! What the tests that drive real host tools (podman, lldpd) share: finding
//! the tools, and the rule that a missing one skips the test with a message
//! except under CI, where it fails.

use std::process::Command;

/// True when `cmd` is on PATH.
pub fn have(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// True when running as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Whether `test` can run: `Some(why)` skips it with a message, and under CI
/// (where .ci/run installed everything) a missing piece fails it instead.
pub fn runnable(test: &str, missing: Option<String>) -> bool {
    let Some(why) = missing else { return true };
    if std::env::var_os("CI").is_some() {
        panic!("{test} cannot run under CI: {why}");
    }
    // Written to the real stderr, not through `eprintln!`, which the test
    // harness captures and hides for a passing test: a skip must be seen.
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!("SKIPPED {test}: {why}\n").as_bytes(),
    );
    false
}
