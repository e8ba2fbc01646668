//! The views people read (`topo` as a table, JSON, YAML, DOT and SVG; `rails`
//! as a table; the `-o` flag every printing command shares), run as the real
//! binaries on fixture trees and snapshotted.

use crate::support::{fixtures, snapshots::settings};
use std::path::Path;
use std::process::{Command, Output};

const NOW: &str = "2026-03-01T12:00:00Z";

fn run(bin: &str, args: &[&str]) -> Output {
    Command::new(bin)
        .args(args)
        .env("NODEFABRIC_NOW", NOW)
        .env_remove("NODEFABRIC_SYSFS_ROOT")
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .expect("run nodefabric")
}

fn ok(bin: &str, args: &[&str]) -> String {
    let o = run(bin, args);
    assert!(
        o.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

fn lean(args: &[&str]) -> String {
    ok(env!("CARGO_BIN_EXE_nodefabric"), args)
}

fn tree(build: impl Fn(&Path) -> fixtures::Tree) -> (tempfile::TempDir, String) {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("sys");
    build(&root);
    let s = root.to_str().unwrap().to_string();
    (tmp, s)
}

/// The demo's rail record for the gpu8 fixture (interface-name, mlx5_N on railN).
fn gpu8_rails(root: &str, dir: &Path) -> String {
    let out = lean(&[
        "--sysfs-root",
        root,
        "rails",
        "-o",
        "json",
        "--rail-source",
        "interface-name",
        "--interface-regex",
        "^mlx5_([0-7])$",
        "--rail-id",
        "rail$1",
        "--sysfs-paths",
    ]);
    let file = dir.join("rails.json");
    std::fs::write(&file, out).unwrap();
    file.to_str().unwrap().to_string()
}

#[test]
fn topo_table_of_the_gpu8_fixture_names_every_accelerator_and_nic() {
    let (tmp, root) = tree(fixtures::gpu8_switch_paired);
    let rails = gpu8_rails(&root, tmp.path());
    let out = lean(&["--sysfs-root", &root, "topo", "--rails-file", &rails]);
    // GPU 0 shares a switch with mlx5_0 only; its socket's other NICs are
    // NODE, the far socket's SYS.
    let gpu0 = out.lines().nth(1).unwrap();
    assert!(
        gpu0.starts_with("0000:12:00.0  nvidia  0     PIX     NODE"),
        "{out}"
    );
    settings().bind(|| insta::assert_snapshot!("topo_gpu8.table", out));
    // README's first section shows this very table.
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    assert!(
        readme.contains(&format!(
            "$ nodefabric topo --rails-file rails.json\n{out}```"
        )),
        "README.md's topo table is not this output:\n{out}"
    );
    let plain = lean(&["--sysfs-root", &root, "topo"]);
    assert!(plain.contains("RAIL"), "{plain}");
}

#[test]
fn topo_json_and_yaml_carry_the_same_matrix() {
    let (tmp, root) = tree(fixtures::gpu8_switch_paired);
    let rails = gpu8_rails(&root, tmp.path());
    let json = lean(&[
        "--sysfs-root",
        &root,
        "topo",
        "-o",
        "json",
        "--rails-file",
        &rails,
    ]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["accelerators"].as_array().unwrap().len(), 8);
    assert_eq!(v["nics"].as_array().unwrap().len(), 10);
    assert_eq!(v["accelerators"][0]["paths"]["mlx5_0"], "PIX");
    assert_eq!(v["nics"][0]["rails"][0], "rail0");
    settings().bind(|| insta::assert_snapshot!("topo_gpu8.json", json));
    let yaml = lean(&[
        "--sysfs-root",
        &root,
        "topo",
        "--output",
        "yaml",
        "--rails-file",
        &rails,
    ]);
    assert!(
        yaml.contains("pciBusId: 0000:12:00.0") || yaml.contains("pciBusId: \"0000:12:00.0\""),
        "{yaml}"
    );
    settings().bind(|| insta::assert_snapshot!("topo_gpu8.yaml", yaml));
}

#[test]
fn topo_folds_vfs_into_their_pf_and_marks_failed_links() {
    let (_t, root) = tree(fixtures::vf_only);
    let out = lean(&["--sysfs-root", &root, "topo"]);
    settings().bind(|| insta::assert_snapshot!("topo_vf_only.table", out));
    let (_t, root) = tree(|r| fixtures::all_ports_down(r, true));
    let out = lean(&["--sysfs-root", &root, "topo"]);
    assert!(out.contains("Failed"), "{out}");
    settings().bind(|| insta::assert_snapshot!("topo_all_down.table", out));
    let dot = lean(&["--sysfs-root", &root, "topo", "-o", "dot"]);
    assert!(
        dot.contains("link Failed") && dot.contains("#d62728"),
        "{dot}"
    );
}

#[test]
fn topo_dot_draws_the_tree_from_the_host_bridges() {
    let (tmp, root) = tree(fixtures::gpu8_switch_paired);
    let rails = gpu8_rails(&root, tmp.path());
    let dot = lean(&[
        "--sysfs-root",
        &root,
        "topo",
        "-o",
        "dot",
        "--rails-file",
        &rails,
    ]);
    assert!(dot.starts_with("digraph topo {"), "{dot}");
    assert!(dot.contains("\"pci0000:00\" -> \"0000:00:01.0\";"), "{dot}");
    settings().bind(|| insta::assert_snapshot!("topo_gpu8.dot", dot));
}

#[test]
fn topo_svg_parses_as_xml_and_names_every_accelerator_and_nic() {
    let (tmp, root) = tree(fixtures::gpu8_switch_paired);
    let rails = gpu8_rails(&root, tmp.path());
    // The lean binary hands -o svg to nodefabric-full beside it.
    let svg = lean(&[
        "--sysfs-root",
        &root,
        "topo",
        "-o",
        "svg",
        "--rails-file",
        &rails,
    ]);
    let doc = roxmltree::Document::parse(&svg).expect("the SVG is well-formed XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let text: String = doc
        .descendants()
        .filter(|n| n.is_text())
        .filter_map(|n| n.text())
        .collect::<Vec<_>>()
        .join("\n");
    let json = lean(&["--sysfs-root", &root, "topo", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    for a in v["accelerators"].as_array().unwrap() {
        let pci = a["pciBusId"].as_str().unwrap();
        assert!(text.contains(pci), "accelerator {pci} not named in the SVG");
    }
    for n in v["nics"].as_array().unwrap() {
        let name = n["name"].as_str().unwrap();
        assert!(text.contains(name), "NIC {name} not named in the SVG");
    }
    // The same picture as the same bytes (layout-rs's float and style-order
    // noise is tidied away).
    let again = lean(&[
        "--sysfs-root",
        &root,
        "topo",
        "-o",
        "svg",
        "--rails-file",
        &rails,
    ]);
    assert_eq!(svg, again);
}

#[test]
fn a_format_a_command_does_not_print_is_refused_naming_the_ones_it_does() {
    let (_t, root) = tree(fixtures::gpu8_switch_paired);
    let o = run(
        env!("CARGO_BIN_EXE_nodefabric"),
        &["--sysfs-root", &root, "inventory", "-o", "dot"],
    );
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("`inventory` prints json, yaml (default json), not --output dot"),
        "{err}"
    );
    let yaml = lean(&["--sysfs-root", &root, "cdi", "-o", "yaml"]);
    assert!(yaml.contains("cdiVersion"), "{yaml}");
    let labels = lean(&["--sysfs-root", &root, "features", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_str(&labels).unwrap();
    assert_eq!(v["feature.gpustack.ai/rdma.capable"], "true");
}

#[test]
fn rails_prints_a_table_by_default_and_json_on_request() {
    let (tmp, root) = tree(fixtures::gpu8_switch_paired);
    let rails = [
        "--sysfs-root",
        &root,
        "rails",
        "--rail-source",
        "interface-name",
        "--interface-regex",
        "^mlx5_([0-7])$",
        "--rail-id",
        "rail$1",
        "--sysfs-paths",
    ];
    let table = lean(&rails);
    let head = table.lines().next().unwrap();
    assert!(head.starts_with("GPU           SOURCE  rail0"), "{table}");
    assert!(
        table.lines().nth(1).unwrap().contains("mlx5_0 PIX"),
        "{table}"
    );
    settings().bind(|| insta::assert_snapshot!("rails_gpu8.table", table));
    let json = lean(&[&rails[..], &["-o", "json"]].concat());
    let file = gpu8_rails(&root, tmp.path());
    assert_eq!(json, std::fs::read_to_string(file).unwrap());
}

#[test]
fn preflight_prints_a_note_shared_by_every_gpu_once() {
    let (_t, root) = tree(fixtures::gpu8_switch_paired);
    let o = run(
        env!("CARGO_BIN_EXE_nodefabric"),
        &["--sysfs-root", &root, "preflight"],
    );
    let out = String::from_utf8(o.stdout).unwrap();
    let marks = out.lines().filter(|l| l.ends_with("[1]")).count();
    assert_eq!(marks, 8, "{out}");
    let notes: Vec<&str> = out.lines().filter(|l| l.starts_with("[1] ")).collect();
    assert_eq!(notes.len(), 1, "{out}");
    assert!(
        notes[0].starts_with("[1] 0000:12:00.0, 0000:22:00.0,"),
        "{out}"
    );
}

#[test]
fn topo_reads_a_capture_archive_as_it_read_the_tree() {
    let (tmp, root) = tree(fixtures::gpu8_switch_paired);
    let archive = tmp.path().join("node.tar.gz");
    let o = run(
        env!("CARGO_BIN_EXE_nodefabric"),
        &[
            "--sysfs-root",
            &root,
            "capture",
            "--out",
            archive.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let live = lean(&["--sysfs-root", &root, "topo", "-o", "json"]);
    let replayed = lean(&[
        "--sysfs-root",
        archive.to_str().unwrap(),
        "topo",
        "-o",
        "json",
    ]);
    assert_eq!(live, replayed);
}

/// The demo's shipped vendor answers (examples/demo/) answer the fixture
/// whole: fabric labels published, no unreadable note, every GPU on a rail.
#[test]
fn the_demo_answers_leave_nothing_unreadable_on_the_fixture() {
    let (_t, root) = tree(fixtures::gpu8_switch_paired);
    let demo = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/demo");
    let q = format!("{demo}/nvidia-smi-q.txt");
    let pre = lean(&["--sysfs-root", &root, "--nvidia-smi-q", &q, "preflight"]);
    assert!(!pre.contains("unreadable"), "{pre}");
    assert!(pre.contains("fabric.domain=nvlink-"), "{pre}");
    let rails = lean(&[
        "--sysfs-root",
        &root,
        "rails",
        "-o",
        "json",
        "--rails-config",
        &format!("{demo}/rails.yaml"),
        "--topo-file",
        &format!("{demo}/nvidia-smi-topo-m.txt"),
        "--gpu-query-file",
        &format!("{demo}/nvidia-smi-query-gpu.csv"),
    ]);
    let r: serde_json::Value = serde_json::from_str(&rails).unwrap();
    let gpus = r["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 8);
    assert!(
        gpus.iter()
            .all(|g| g["source"] == "nvidia-smi" && g["rails"].as_object().unwrap().len() == 8),
        "{rails}"
    );
}
