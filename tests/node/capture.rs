//! `nodefabric capture` → `--sysfs-root FILE.tar.gz`: every fixture replays
//! to byte-identical output, and the archive holds only what discovery read.

use crate::support::{archive, fixtures};
use archive::Hostile;
use std::collections::BTreeSet;
use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use tar::EntryType;

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
        .map(|e| {
            e.unwrap()
                .path()
                .unwrap()
                .to_string_lossy()
                .trim_start_matches("sysfs")
                .trim_start_matches('/')
                .to_string()
        })
        .collect()
}

/// Captures the tree (or archive) at `root` into `out`; the capture must
/// succeed, or the failure is reported under `name`.
fn capture(name: &str, root: &Path, out: &Path) {
    let o = nodefabric(root, &["capture", "--out", out.to_str().unwrap()]);
    assert!(
        o.status.success(),
        "{name}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn round_trip(name: &str, build: impl FnOnce(&Path)) {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("sys");
    build(&root);
    let archive = tmp.path().join("node.tar.gz");
    capture(name, &root, &archive);
    let live = views(&root);
    let replay = views(&archive);
    for (i, cmd) in ["inventory", "features", "cdi", "preflight"]
        .iter()
        .enumerate()
    {
        assert_eq!(
            String::from_utf8_lossy(&live[i].1),
            String::from_utf8_lossy(&replay[i].1),
            "{name}: `{cmd}` differs on replay"
        );
        assert_eq!(
            live[i].0, replay[i].0,
            "{name}: `{cmd}` exit status differs on replay"
        );
    }
    // Capturing the replayed tree gives the same archive: nothing was lost or added.
    let again = tmp.path().join("again.tar.gz");
    capture(name, &archive, &again);
    assert_eq!(
        fs::read(&archive).unwrap(),
        fs::read(&again).unwrap(),
        "{name}: capture is not stable"
    );
}

#[test]
fn every_fixture_replays_byte_identically() {
    round_trip("gpu8", |d| drop(fixtures::gpu8_switch_paired(d)));
    round_trip("vf_only", |d| drop(fixtures::vf_only(d)));
    round_trip("active_defer", |d| {
        drop(fixtures::single_port(d, ("2: INIT", "5: LinkUp")))
    });
    round_trip("all_ports_down", |d| {
        drop(fixtures::all_ports_down(d, true))
    });
    round_trip("unreadable_port", |d| drop(fixtures::unreadable_port(d)));
    round_trip("no_accelerator", |d| drop(fixtures::no_accelerator(d)));
    round_trip("blank_numa", |d| drop(fixtures::blank_numa(d)));
    round_trip("nested_switches", |d| drop(fixtures::nested_switches(d)));
    round_trip("non_pci", |d| drop(fixtures::non_pci(d)));
    round_trip("hostile", |d| drop(fixtures::hostile(d)));
    round_trip("large", |d| drop(fixtures::large(d, 64)));
    round_trip("amd_hives", |d| {
        drop(fixtures::amd_hives(d, &[Some("77"), None, Some("0")]))
    });
    round_trip("rail_names", |d| {
        drop(fixtures::gpu8_named(d, |i, _| {
            format!("eth_r{}_p{}", i / 2, i % 2)
        }))
    });
}

#[test]
fn the_archive_holds_only_what_discovery_read() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("sys");
    let t = fixtures::single_port(&root, ("4: ACTIVE", "5: LinkUp"));
    // Host data discovery never reads: a device attribute, a file elsewhere, a whole folder.
    let nic = t.pci(
        &[
            &fixtures::addr(0x00, 1, 0),
            &fixtures::addr(0x01, 0, 0),
            &fixtures::addr(0x02, 1, 0),
            &fixtures::addr(0x04, 0, 0),
        ],
        0x15b3,
        0x1021,
        0x020000,
        0,
    );
    t.write(&format!("{nic}/vpd"), "SERIAL-NUMBER-1234");
    t.write("kernel/secret", "do not copy");
    t.write("firmware/acpi/tables/DSDT", "tables");
    let archive = tmp.path().join("node.tar.gz");
    capture("the archive", &root, &archive);
    let names = members(&archive);
    assert!(
        names
            .iter()
            .all(|n| !n.contains("vpd") && !n.starts_with("kernel") && !n.starts_with("firmware")),
        "{names:#?}"
    );
    // What it does hold: the links followed and the attributes read.
    assert!(names.contains("class/net/enp4s0np0"));
    assert!(names
        .iter()
        .any(|n| n.ends_with("infiniband/mlx5_0/ports/1/state")));
    // A PCI function's class only where its vendor makes accelerators: the
    // GPU's, not the NIC's, whose vendor is answer enough.
    assert!(
        names.contains(&format!("{nic}/vendor")) && !names.contains(&format!("{nic}/class")),
        "{names:#?}"
    );
    assert!(
        names.iter().any(|n| n.ends_with("0000:03:00.0/class")),
        "{names:#?}"
    );
    let bytes = fs::read(&archive).unwrap();
    assert!(!String::from_utf8_lossy(&flate2_decode(&bytes)).contains("SERIAL-NUMBER-1234"));
}

/// A netdev named with bytes that are not UTF-8 is archived under those
/// bytes (and its links' targets with them), and the replay reads the same
/// NICs as the host: both of `byte_names`, by the text of their names.
#[test]
fn a_capture_of_a_netdev_named_in_bytes_replays_to_the_same_record() {
    round_trip("byte_names", |d| drop(fixtures::byte_names(d)));
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("sys");
    drop(fixtures::byte_names(&root));
    let archive = tmp.path().join("node.tar.gz");
    capture("byte_names", &root, &archive);
    let gz = flate2::read::GzDecoder::new(fs::File::open(&archive).unwrap());
    let mut links = BTreeSet::new();
    for e in tar::Archive::new(gz).entries().unwrap() {
        let e = e.unwrap();
        if let Some(target) = e.link_name_bytes() {
            links.insert((e.path_bytes().into_owned(), target.into_owned()));
        }
    }
    for (name, _) in fixtures::BYTE_NAMES {
        let link = [&b"sysfs/class/net/"[..], name].concat();
        let (_, target) = links
            .iter()
            .find(|(l, _)| *l == link)
            .unwrap_or_else(|| panic!("no link {:?} in {links:?}", String::from_utf8_lossy(&link)));
        assert!(
            target.ends_with(&[&b"/net/"[..], name].concat()),
            "{target:?}"
        );
    }
    let o = nodefabric(&archive, &["inventory"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let record: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let names: Vec<_> = record["spec"]["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["name"].as_str().unwrap(),
                i["rdmaDevice"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(names, [(r"eth\\xff0", "mlx5_1"), (r"eth\xff0", "mlx5_0")]);
}

/// The member names of a capture of the tree `build` makes.
fn captured(build: impl FnOnce(&Path)) -> BTreeSet<String> {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("sys");
    build(&root);
    let archive = tmp.path().join("node.tar.gz");
    capture("captured", &root, &archive);
    members(&archive)
}

#[test]
fn a_vf_known_from_both_sides_is_not_asked_its_vendor() {
    let names = captured(|root| drop(fixtures::vf_only(root)));
    // The PF answers for its VFs with netdevs (0000:04:00.2-.4); the VF
    // without one (0000:04:00.5) is known from its PF's side only, so it is
    // read as any function is.
    assert!(
        names.iter().any(|n| n.ends_with("0000:04:00.0/vendor")),
        "{names:#?}"
    );
    for vf in ["0000:04:00.2", "0000:04:00.3", "0000:04:00.4"] {
        assert!(
            !names.iter().any(|n| n.ends_with(&format!("{vf}/vendor"))),
            "{vf}: {names:#?}"
        );
    }
    assert!(
        names.iter().any(|n| n.ends_with("0000:04:00.5/vendor")),
        "{names:#?}"
    );
}

#[test]
fn a_pci_functions_cpu_list_is_read_once_per_numa_node() {
    let names = captured(|root| drop(fixtures::vf_only(root)));
    let read = |f: &str| {
        names
            .iter()
            .any(|n| n.ends_with(&format!("{f}/local_cpulist")))
    };
    // The kernel prints it from the node alone: the PF reads node 1's, VF
    // 0000:04:00.2 node -1's (every online CPU); the other VFs are on one
    // of those and read nothing. Every node's number is still read.
    assert!(read("0000:04:00.0") && read("0000:04:00.2"), "{names:#?}");
    for vf in ["0000:04:00.3", "0000:04:00.4", "0000:04:00.5"] {
        assert!(!read(vf), "{vf}: {names:#?}");
        assert!(
            names
                .iter()
                .any(|n| n.ends_with(&format!("{vf}/numa_node"))),
            "{vf}: {names:#?}"
        );
    }
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
    assert!(
        err.contains("notes.txt") && err.contains("not a tar.gz capture"),
        "{err}"
    );
}

// Hostile archives. Each is replayed from a scratch folder whose `tmp/` is the
// replay's TMPDIR, so the unpack folder sits two levels below the scratch
// folder and `sysfs/../../../x` would land in it: the scratch folder must be
// exactly as it was afterwards, the temp folder included.

/// Every path under `dir`, links not followed.
fn listing(dir: &Path) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if fs::symlink_metadata(&p).unwrap().is_dir() {
                todo.push(p.clone());
            }
            out.insert(p);
        }
    }
    out
}

/// The names directly in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// A scratch folder holding `archive` as `node.tar.gz` and an empty `tmp/`.
fn scratch(archive: &[u8]) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().join("tmp");
    fs::create_dir(&tmp).unwrap();
    let path = dir.path().join("node.tar.gz");
    fs::write(&path, archive).unwrap();
    (dir, path, tmp)
}

/// `nodefabric` with the replay's temp folder pointed at `tmp`.
fn replay(archive: &Path, tmp: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_nodefabric"));
    c.arg("--sysfs-root")
        .arg(archive)
        .args(args)
        .env("TMPDIR", tmp)
        .env("NODEFABRIC_NOW", "2026-03-01T12:00:00Z")
        .env("PATH", "/nonexistent");
    c
}

/// Replays `archive` (with `args` before `inventory`), expects a refusal
/// that names the archive and leaves nothing behind; returns the error text.
fn refused(archive: Vec<u8>, args: &[&str]) -> String {
    let (dir, path, tmp) = scratch(&archive);
    let before = listing(dir.path());
    let o = replay(&path, &tmp, &[args, &["inventory"]].concat())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(1), "not refused: {err}");
    assert!(
        o.stdout.is_empty(),
        "printed a record: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert_eq!(
        listing(dir.path()),
        before,
        "the replay left something behind or outside its folder; {err}"
    );
    assert!(
        err.contains("node.tar.gz"),
        "the error does not name the archive: {err}"
    );
    err
}

/// A minimal valid start: the top folder and one subfolder.
fn top() -> Hostile {
    Hostile::new().dir("sysfs/").dir("sysfs/class/")
}

#[test]
fn a_top_folder_that_is_a_link_to_the_live_sys_is_refused() {
    let err = refused(Hostile::new().symlink("sysfs", "/sys").finish(), &[]);
    assert!(
        err.contains(r#"entry "sysfs""#) && err.contains(r#""/sys" is absolute"#),
        "{err}"
    );
    let err = refused(
        Hostile::new()
            .symlink("sysfs", "..")
            .dir("sysfs/class/")
            .finish(),
        &[],
    );
    assert!(
        err.contains(r#"entry "sysfs""#) && err.contains("must be a folder"),
        "{err}"
    );
}

#[test]
fn dot_dot_and_absolute_entry_names_are_refused() {
    let err = refused(top().file("sysfs/../../../escaped", "x").finish(), &[]);
    assert!(
        err.contains(r#"entry "sysfs/../../../escaped""#)
            && err.contains("not a plain relative path"),
        "{err}"
    );
    let err = refused(
        top().file("sysfs/class/../../../../escaped", "x").finish(),
        &[],
    );
    assert!(err.contains("not a plain relative path"), "{err}");
    // An absolute name aimed at the scratch folder itself.
    let (dir, _, _) = scratch(b"");
    let aim = format!("{}/escaped", dir.path().display());
    let err = refused(top().file(&aim, "x").finish(), &[]);
    assert!(
        err.contains(&aim) && err.contains("not a plain relative path"),
        "{err}"
    );
    assert!(!dir.path().join("escaped").exists());
    let err = refused(top().file("elsewhere/file", "x").finish(), &[]);
    assert!(
        err.contains(r#"entry "elsewhere/file""#)
            && err.contains("outside the folders a capture holds (sysfs/, vendor/)"),
        "{err}"
    );
}

#[test]
fn link_targets_that_climb_out_of_the_unpack_folder_are_refused() {
    let err = refused(
        top()
            .symlink("sysfs/class/evil", "../../../../escaped")
            .finish(),
        &[],
    );
    assert!(
        err.contains(r#"entry "sysfs/class/evil""#) && err.contains("climbs above"),
        "{err}"
    );
    // Lexically inside (`d/e/x`), really outside: `up` is the unpack folder.
    let through = top()
        .symlink("sysfs/class/up", "../..")
        .symlink("sysfs/class/l", "up/../x")
        .finish();
    let err = refused(through, &[]);
    assert!(
        err.contains(r#"entry "sysfs/class/l""#) && err.contains(r#""up/../x""#),
        "{err}"
    );
}

#[test]
fn an_entry_written_through_a_link_is_refused_before_it_is_written() {
    // `out` leads to the scratch folder; `out/escaped` would land there if
    // written before the links are checked.
    let err = refused(
        top()
            .symlink("sysfs/out", "../../..")
            .file("sysfs/out/escaped", "x")
            .finish(),
        &[],
    );
    assert!(
        err.contains(r#"entry "sysfs/out/escaped""#) && err.contains(r#"under "sysfs/out""#),
        "{err}"
    );
    let err = refused(
        top()
            .file("sysfs/class/f", "x")
            .file("sysfs/class/f/g", "y")
            .finish(),
        &[],
    );
    assert!(err.contains("not a folder"), "{err}");
}

#[test]
fn absolute_link_targets_are_refused() {
    let err = refused(
        top().symlink("sysfs/class/net", "/sys/class/net").finish(),
        &[],
    );
    assert!(
        err.contains(r#"entry "sysfs/class/net""#)
            && err.contains(r#""/sys/class/net" is absolute"#),
        "{err}"
    );
}

#[test]
fn hard_links_are_refused() {
    let err = refused(
        top()
            .file("sysfs/class/a", "x")
            .hardlink("sysfs/class/b", "sysfs/class/a")
            .finish(),
        &[],
    );
    assert!(
        err.contains(r#"entry "sysfs/class/b""#) && err.contains("hard link"),
        "{err}"
    );
    let err = refused(
        top().hardlink("sysfs/class/shadow", "/etc/shadow").finish(),
        &[],
    );
    assert!(
        err.contains("hard link") && err.contains("/etc/shadow"),
        "{err}"
    );
}

#[test]
fn device_nodes_fifos_and_other_kinds_are_refused() {
    for (kind, words) in [
        (EntryType::Char, "character device"),
        (EntryType::Block, "block device"),
        (EntryType::Fifo, "FIFO"),
        (EntryType::Continuous, "contiguous file"),
        (EntryType::new(b'Z'), "type 'Z'"),
    ] {
        let err = refused(
            top()
                .entry(kind, "sysfs/class/odd", "", 0, std::io::empty())
                .finish(),
            &[],
        );
        assert!(
            err.contains(r#"entry "sysfs/class/odd""#) && err.contains(words),
            "{kind:?}: {err}"
        );
    }
}

#[test]
fn a_name_that_appears_twice_is_refused() {
    let err = refused(
        top()
            .file("sysfs/class/a", "x")
            .file("sysfs/class/a", "y")
            .finish(),
        &[],
    );
    assert!(err.contains("appears twice"), "{err}");
}

#[test]
fn a_gzip_bomb_over_the_byte_cap_is_refused() {
    let bomb = top().zeros("sysfs/class/big", 4 << 20).finish();
    assert!(bomb.len() < 64 * 1024, "the bomb is {} bytes", bomb.len());
    let err = refused(bomb, &["--replay-max-bytes", "1MiB"]);
    assert!(
        err.contains(r#"entry "sysfs/class/big""#)
            && err.contains("past 1048576 bytes")
            && err.contains("--replay-max-bytes"),
        "{err}"
    );
    // Many files, each under the cap, together over it.
    let mut many = top();
    for i in 0..8 {
        many = many.zeros(&format!("sysfs/class/part{i}"), 200 * 1024);
    }
    let err = refused(many.finish(), &["--replay-max-bytes", "1MiB"]);
    assert!(err.contains(r#"entry "sysfs/class/part5""#), "{err}");
}

#[test]
fn an_oversized_long_name_header_is_refused_before_it_is_buffered() {
    let err = refused(
        top().long_name(8 << 20).file("sysfs/class/x", "x").finish(),
        &[],
    );
    assert!(
        err.contains("header after entry \"sysfs/class/\"") && err.contains("65536 bytes"),
        "{err}"
    );
}

#[test]
fn too_many_entries_are_refused() {
    let mut many = top();
    for i in 0..20 {
        many = many.file(&format!("sysfs/class/f{i}"), "1");
    }
    let err = refused(many.finish(), &["--replay-max-entries", "10"]);
    assert!(
        err.contains("more than 10 entries")
            && err.contains(r#""sysfs/class/f8""#)
            && err.contains("--replay-max-entries"),
        "{err}"
    );
}

#[test]
fn a_real_capture_replays_at_exactly_its_entry_count_and_not_one_below() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("sys");
    drop(fixtures::gpu8_switch_paired(&root));
    let archive = tmp.path().join("node.tar.gz");
    capture("the tree", &root, &archive);
    let n = members(&archive).len();
    let scratch_tmp = tmp.path().join("tmp");
    fs::create_dir(&scratch_tmp).unwrap();
    let at = replay(
        &archive,
        &scratch_tmp,
        &["--replay-max-entries", &n.to_string(), "inventory"],
    )
    .output()
    .unwrap();
    assert!(
        at.status.success(),
        "{}",
        String::from_utf8_lossy(&at.stderr)
    );
    assert_eq!(at.stdout, nodefabric(&root, &["inventory"]).stdout);
    let below = replay(
        &archive,
        &scratch_tmp,
        &["--replay-max-entries", &(n - 1).to_string(), "inventory"],
    )
    .output()
    .unwrap();
    assert_eq!(below.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&below.stderr).contains(&format!("more than {} entries", n - 1))
    );
    assert!(
        names(&scratch_tmp).is_empty(),
        "replay folders left behind: {:?}",
        names(&scratch_tmp)
    );
}

#[test]
fn out_of_range_replay_caps_are_usage_errors_naming_the_flag() {
    let tmp = tempfile::tempdir().unwrap();
    for (flag, value) in [
        ("--replay-max-entries", "0"),
        ("--replay-max-entries", "many"),
        ("--replay-max-bytes", "0"),
        ("--replay-max-bytes", "1PiB"),
        ("--replay-max-bytes", "99999999999999999999GiB"),
    ] {
        let o = replay(tmp.path(), tmp.path(), &[flag, value, "inventory"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{flag} {value}: {err}");
        assert!(
            err.contains(flag) && err.contains(value),
            "{flag} {value}: {err}"
        );
    }
    let help = replay(tmp.path(), tmp.path(), &["--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("--replay-max-entries")
            && help.contains("1000000")
            && help.contains("--replay-max-bytes")
            && help.contains("256MiB"),
        "{help}"
    );
}

#[test]
fn a_link_leaving_the_captured_tree_is_archived_as_a_link_out_of_sysfs() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("sys");
    drop(fixtures::hostile(&root));
    let archive = tmp.path().join("node.tar.gz");
    capture("the tree", &root, &archive);
    let gz = flate2::read::GzDecoder::new(fs::File::open(&archive).unwrap());
    let mut ar = tar::Archive::new(gz);
    let evil = ar
        .entries()
        .unwrap()
        .map(|e| e.unwrap())
        .find(|e| e.path().unwrap() == Path::new("sysfs/class/net/evil"))
        .expect("the link is archived");
    // Up to the archive's top: inside the unpack folder, outside the sysfs root.
    assert_eq!(evil.link_name().unwrap().unwrap(), Path::new("../../.."));
}

/// Lets the blocked `nvidia-smi` stand-in finish, however the test ends.
struct Release(PathBuf);

impl Drop for Release {
    fn drop(&mut self) {
        let _ = fs::write(&self.0, "");
    }
}

/// Starts a replay whose `nvidia-smi -q` blocks until the test lets it go,
/// sends `signal` once it runs (the tree is unpacked by then) and checks that
/// the process ends by that signal and leaves no replay folder behind.
fn signal_during_a_slow_replay(signal: i32) {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("sys");
    drop(fixtures::gpu8_switch_paired(&root));
    let archive = tmp.path().join("node.tar.gz");
    capture("the tree", &root, &archive);
    let replay_tmp = tmp.path().join("tmp");
    fs::create_dir(&replay_tmp).unwrap();
    let started = tmp.path().join("started");
    let release = tmp.path().join("release");
    let smi = tmp.path().join("nvidia-smi");
    // Shell built-ins and absolute paths only: PATH is /nonexistent. The
    // loop gives up by itself after a few minutes should the test die first.
    fs::write(&smi, format!("#!/bin/sh\n: > '{}'\ni=0\nwhile [ ! -e '{}' ] && [ $i -lt 5000 ]; do /bin/sleep 0.05; i=$((i+1)); done\n", started.display(), release.display())).unwrap();
    let _release = Release(release);
    fs::set_permissions(&smi, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut child = replay(
        &archive,
        &replay_tmp,
        &["--nvidia-smi", smi.to_str().unwrap(), "inventory"],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    // Wait for the blocked nvidia-smi, or for the replay to end without it.
    while !started.exists() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "replay ended ({status}) before running nvidia-smi: {}",
                String::from_utf8_lossy(&child.wait_with_output().unwrap().stderr)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let folders = names(&replay_tmp);
    assert!(
        folders.len() == 1 && folders[0].starts_with("nodefabric-replay."),
        "{folders:?}"
    );
    assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.signal(),
        Some(signal),
        "{:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        names(&replay_tmp).is_empty(),
        "left behind: {:?}",
        names(&replay_tmp)
    );
}

#[test]
fn sigterm_during_a_slow_replay_leaves_no_replay_folder() {
    signal_during_a_slow_replay(libc::SIGTERM);
}

#[test]
fn sigint_during_a_slow_replay_leaves_no_replay_folder() {
    signal_during_a_slow_replay(libc::SIGINT);
}

#[test]
fn sighup_during_a_slow_replay_leaves_no_replay_folder() {
    signal_during_a_slow_replay(libc::SIGHUP);
}

// Vendor answers: a capture stores what the pass asked nvidia-smi (or NVML,
// or the Ascend file), so its replay reproduces the fabric labels on a
// machine with no GPU and no vendor tool.

#[test]
fn a_replay_reproduces_the_fabric_labels_from_the_captured_vendor_answers() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("sys");
    fixtures::gpu8_switch_paired(&root);
    let q = tmp.path().join("q.txt");
    fs::write(
        &q,
        fixtures::nvsmi_q(|_| {
            (
                "Completed",
                "Success",
                "3",
                "5b0e1122-3344-5566-7788-99aabbccddef",
            )
        }),
    )
    .unwrap();
    let live = nodefabric(&root, &["features", "--nvidia-smi-q", q.to_str().unwrap()]);
    let live = String::from_utf8(live.stdout).unwrap();
    assert!(
        live.contains("fabric.domain=nvlink-5b0e112233445566778899aabbccddef-3"),
        "{live}"
    );
    let archive = tmp.path().join("node.tar.gz");
    let o = nodefabric(
        &root,
        &[
            "capture",
            "--out",
            archive.to_str().unwrap(),
            "--nvidia-smi-q",
            q.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        members(&archive).contains("vendor/fabric.json"),
        "{:?}",
        members(&archive)
    );
    fs::remove_file(&q).unwrap();
    // No vendor input at all on replay: the captured answer speaks.
    let replayed = nodefabric(&archive, &["features"]);
    assert_eq!(String::from_utf8(replayed.stdout).unwrap(), live);
    // A fabric input named on the command line wins over the captured one.
    let o = nodefabric(
        &archive,
        &["features", "--nvidia-smi", "/nonexistent/nvidia-smi"],
    );
    assert!(!String::from_utf8(o.stdout)
        .unwrap()
        .contains("fabric.domain"));
}

#[test]
fn a_captured_unreadable_answer_replays_as_the_same_note() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("sys");
    fixtures::gpu8_switch_paired(&root);
    let archive = tmp.path().join("node.tar.gz");
    let args = ["--nvidia-smi", "/opt/vendor/bin/nvidia-smi"];
    let live = nodefabric(&root, &[&["preflight"][..], &args].concat());
    let o = nodefabric(
        &root,
        &[&["capture", "--out", archive.to_str().unwrap()][..], &args].concat(),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let replayed = nodefabric(&archive, &["preflight"]);
    let live = String::from_utf8(live.stdout).unwrap();
    assert!(live.contains("/opt/vendor/bin/nvidia-smi -q"), "{live}");
    assert_eq!(String::from_utf8(replayed.stdout).unwrap(), live);
}

#[test]
fn a_vendor_answer_file_that_is_not_one_is_refused() {
    let a = top()
        .dir("vendor/")
        .file("vendor/fabric.json", "{\"nvidia\": 7}")
        .finish();
    let err = refused(a, &[]);
    assert!(err.contains("vendor/fabric.json"), "{err}");
    let err = refused(
        top()
            .dir("vendor/")
            .file("vendor/other.txt", "x")
            .file("vendor/fabric.json", "{\"surprise\": {}}")
            .finish(),
        &[],
    );
    assert!(
        err.contains("vendor/fabric.json") && err.contains("surprise"),
        "{err}"
    );
}

/// A real capture of the 8-GPU fixture, as bytes.
fn gpu8_capture() -> Vec<u8> {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("sys");
    drop(fixtures::gpu8_switch_paired(&root));
    let archive = tmp.path().join("node.tar.gz");
    capture("the tree", &root, &archive);
    fs::read(&archive).unwrap()
}

fn gzip(tar: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut gz, tar).unwrap();
    gz.finish().unwrap()
}

#[test]
fn a_capture_cut_at_an_entry_boundary_replays_silently_as_another_node() {
    let whole = gpu8_capture();
    let tar = flate2_decode(&whole);
    // Where each entry ends in the uncompressed stream (a long name's own
    // header block comes before its entry's, so ends, not starts, are the
    // boundaries).
    let ends: Vec<u64> = tar::Archive::new(tar.as_slice())
        .entries()
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            e.raw_header_position() + 512 + e.size().div_ceil(512) * 512
        })
        .collect();
    assert!(ends.len() > 20, "{} entries", ends.len());
    // Cut at an entry boundary, then compressed whole: a well-formed gzip of
    // a tar that simply stops, as a copy cut short by a full disk would be.
    let cut = usize::try_from(ends[ends.len() / 2]).unwrap();
    let err = refused(gzip(&tar[..cut]), &[]);
    assert!(err.contains("truncated"), "{err}");
    // The end-of-archive marker is two zero blocks, not one.
    let err = refused(gzip(&[&tar[..cut], &[0u8; 512][..]].concat()), &[]);
    assert!(err.contains("truncated"), "{err}");
    // Every entry but without the end marker at all.
    let end = usize::try_from(*ends.last().unwrap()).unwrap();
    let err = refused(gzip(&tar[..end]), &[]);
    assert!(err.contains("truncated"), "{err}");
    // The compressed stream itself cut short, at several points.
    for n in [whole.len() - 4, whole.len() - 9, whole.len() * 2 / 3] {
        let err = refused(whole[..n].to_vec(), &[]);
        assert!(
            err.contains("truncated"),
            "cut at {n} of {}: {err}",
            whole.len()
        );
    }
}

/// A temp folder in memory where the machine has one (sysfs is in memory
/// too): a 10,000-interface tree and its replay written to and removed from
/// a busy disk took most of the test command's time.
fn in_memory_tempdir() -> tempfile::TempDir {
    tempfile::tempdir_in("/dev/shm").unwrap_or_else(|_| tempfile::tempdir().unwrap())
}

#[test]
fn the_tools_own_capture_of_a_10k_interface_node_exceeds_its_default_replay_cap() {
    let tmp = in_memory_tempdir();
    let root = tmp.path().join("sys");
    drop(fixtures::large(&root, 10_000));
    let archive = tmp.path().join("node.tar.gz");
    let o = nodefabric(&root, &["capture", "--out", archive.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let entries = members(&archive).len();
    let bytes: u64 = {
        let gz = flate2::read::GzDecoder::new(fs::File::open(&archive).unwrap());
        tar::Archive::new(gz)
            .entries()
            .unwrap()
            .map(|e| e.unwrap().size())
            .sum()
    };
    eprintln!("10k interfaces: {entries} entries, {bytes} bytes");
    // The defaults replay it, with the room a larger node needs besides.
    let scratch_tmp = tmp.path().join("tmp");
    fs::create_dir(&scratch_tmp).unwrap();
    let at = replay(&archive, &scratch_tmp, &["inventory"])
        .output()
        .unwrap();
    assert!(
        at.status.success(),
        "{entries} entries, {bytes} bytes: {}",
        String::from_utf8_lossy(&at.stderr)
    );
    assert_eq!(at.stdout, nodefabric(&root, &["inventory"]).stdout);
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains("--replay-max"),
        "a capture the defaults replay warned: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}
