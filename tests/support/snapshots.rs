//! One insta configuration for every test file: snapshots live in the
//! repository's `snapshots/` folder, named without the test module.

/// The settings every snapshot assertion binds.
pub fn settings() -> insta::Settings {
    let mut s = insta::Settings::clone_current();
    s.set_snapshot_path("../snapshots");
    s.set_prepend_module_to_snapshot(false);
    s
}
