//! Writes one benchmark's section of docs/benchmarks.md, leaving the others.

use std::fs;
use std::path::Path;

/// Replaces (or appends) the section of docs/benchmarks.md headed
/// `## <title>` or `## <title>: …`.
pub fn write_section(title: &str, section: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/benchmarks.md");
    let old = fs::read_to_string(&path).unwrap_or_else(|_| {
        "# Benchmarks\n\nWritten by `cargo bench`; machine: 2 cores, 24 GiB.\n\n".into()
    });
    let marker = format!("## {title}");
    let mut out = String::new();
    let mut skipping = false;
    let mut replaced = false;
    for line in old.lines() {
        if line.starts_with("## ") {
            // The title whole, alone or before a `:`: "Device plugin" is
            // not "Device plugin at the spec cap".
            skipping = line
                .strip_prefix(&marker)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(':'));
            if skipping && !replaced {
                out.push_str(section);
                out.push('\n');
                replaced = true;
            }
        }
        if !skipping {
            out.push_str(line);
            out.push('\n');
        }
    }
    if !replaced {
        out.push_str(section);
    }
    fs::write(&path, out).unwrap();
}
