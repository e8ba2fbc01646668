//! One insta configuration for every test file: snapshots live in the
//! repository's `snapshots/` folder, named without the test module.

/// The settings every snapshot assertion binds.
pub fn settings() -> insta::Settings {
    let mut s = insta::Settings::clone_current();
    // Absolute: a relative path is taken from the asserting file's folder,
    // which differs between the test binaries' folders.
    s.set_snapshot_path(concat!(env!("CARGO_MANIFEST_DIR"), "/snapshots"));
    s.set_prepend_module_to_snapshot(false);
    s
}
