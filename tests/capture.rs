//! `nodefabric capture` → `--sysfs-root FILE.tar.gz`: every fixture replays
//! to byte-identical output, and the archive holds only what discovery read.

#[path = "support/fixtures.rs"]
mod fixtures;

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;
use std::process::{Command, Output};

fn nodefabric(root: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nodefabric"))
        .arg("--sysfs-root")
        .arg(root)
        .args(args)
        .env("NODEFABRIC_NOW", "2026-03-01T12:00:00Z")
        .env("PATH", "/nonexistent")
        .output()
        .unwrap()
}

/// What the commands print on a tree: inventory, features, cdi, preflight (with exit codes).
fn views(root: &Path) -> Vec<(Option<i32>, Vec<u8>)> {
    ["inventory", "features", "cdi", "preflight"]
        .iter()
        .map(|cmd| {
            let o = nodefabric(root, &[cmd]);
            (o.status.code(), o.stdout)
        })
        .collect()
}

/// The archive's member names (without the top folder).
fn members(archive: &Path) -> BTreeSet<String> {
    let gz = flate2::read::GzDecoder::new(fs::File::open(archive).unwrap());
    tar::Archive::new(gz)
        .entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().to_string_lossy().trim_start_matches("sysfs").trim_start_matches('/').to_string())
        .collect()
}

fn round_trip(name: &str, build: impl FnOnce(&Path)) {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("sys");
    build(&root);
    let archive = tmp.path().join("node.tar.gz");
    let o = nodefabric(&root, &["capture", "--out", archive.to_str().unwrap()]);
    assert!(o.status.success(), "{name}: {}", String::from_utf8_lossy(&o.stderr));
    let live = views(&root);
    let replay = views(&archive);
    for (i, cmd) in ["inventory", "features", "cdi", "preflight"].iter().enumerate() {
        assert_eq!(
            String::from_utf8_lossy(&live[i].1),
            String::from_utf8_lossy(&replay[i].1),
            "{name}: `{cmd}` differs on replay"
        );
        assert_eq!(live[i].0, replay[i].0, "{name}: `{cmd}` exit status differs on replay");
    }
    // Capturing the replayed tree gives the same archive: nothing was lost or added.
    let again = tmp.path().join("again.tar.gz");
    let o = nodefabric(&archive, &["capture", "--out", again.to_str().unwrap()]);
    assert!(o.status.success(), "{name}: {}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(fs::read(&archive).unwrap(), fs::read(&again).unwrap(), "{name}: capture is not stable");
}

#[test]
fn every_fixture_replays_byte_identically() {
    round_trip("gpu8", |d| drop(fixtures::gpu8_switch_paired(d)));
    round_trip("vf_only", |d| drop(fixtures::vf_only(d)));
    round_trip("active_defer", |d| drop(fixtures::single_port(d, ("2: INIT", "5: LinkUp"))));
    round_trip("all_ports_down", |d| drop(fixtures::all_ports_down(d, true)));
    round_trip("unreadable_port", |d| drop(fixtures::unreadable_port(d)));
    round_trip("no_accelerator", |d| drop(fixtures::no_accelerator(d)));
    round_trip("blank_numa", |d| drop(fixtures::blank_numa(d)));
    round_trip("nested_switches", |d| drop(fixtures::nested_switches(d)));
    round_trip("non_pci", |d| drop(fixtures::non_pci(d)));
    round_trip("hostile", |d| drop(fixtures::hostile(d)));
    round_trip("large", |d| drop(fixtures::large(d, 64)));
    round_trip("amd_hives", |d| drop(fixtures::amd_hives(d, &[Some("77"), None, Some("0")])));
    round_trip("rail_names", |d| drop(fixtures::gpu8_named(d, |i, _| format!("eth_r{}_p{}", i / 2, i % 2))));
}

#[test]
fn the_archive_holds_only_what_discovery_read() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("sys");
    let t = fixtures::single_port(&root, ("4: ACTIVE", "5: LinkUp"));
    // Host data discovery never reads: a device attribute, a file elsewhere, a whole folder.
    let nic = t.pci(&[&fixtures::addr(0x00, 1, 0), &fixtures::addr(0x01, 0, 0), &fixtures::addr(0x02, 1, 0), &fixtures::addr(0x04, 0, 0)], 0x15b3, 0x1021, 0x020000, 0);
    t.write(&format!("{nic}/vpd"), "SERIAL-NUMBER-1234");
    t.write("kernel/secret", "do not copy");
    t.write("firmware/acpi/tables/DSDT", "tables");
    let archive = tmp.path().join("node.tar.gz");
    let o = nodefabric(&root, &["capture", "--out", archive.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let names = members(&archive);
    assert!(names.iter().all(|n| !n.contains("vpd") && !n.starts_with("kernel") && !n.starts_with("firmware")), "{names:#?}");
    // What it does hold: the links followed and the attributes read.
    assert!(names.contains("class/net/enp4s0np0"));
    assert!(names.iter().any(|n| n.ends_with("infiniband/mlx5_0/ports/1/state")));
    let bytes = fs::read(&archive).unwrap();
    assert!(!String::from_utf8_lossy(&flate2_decode(&bytes)).contains("SERIAL-NUMBER-1234"));
}

fn flate2_decode(gz: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(gz), &mut out).unwrap();
    out
}

#[test]
fn a_file_that_is_not_a_capture_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let bogus = tmp.path().join("notes.txt");
    fs::write(&bogus, "hello").unwrap();
    let o = nodefabric(&bogus, &["inventory"]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("notes.txt") && err.contains("not a tar.gz capture"), "{err}");
}
