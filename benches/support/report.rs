//! Writes one benchmark's section of docs/benchmarks.md, leaving the others.

use std::fs;
use std::path::Path;

/// Replaces (or appends) the `## <title>…` section of docs/benchmarks.md.
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
            skipping = line.starts_with(&marker);
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
