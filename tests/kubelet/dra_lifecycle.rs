//! The DRA driver across its life on a node: claims whose pods went away
//! while nobody unprepared them, a second copy of the driver on the same
//! state folder, a checkpoint written by an older or a newer version, and
//! sockets that stop answering while their files stay in place.

use crate::dra_faults::{claim, devices, name, prepare, started, unprepare};
use crate::support::apiserver::Action;
use crate::support::dra::{Driver, Setup, DRIVER};
use crate::support::os::http_get;
use crate::support::wait;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

const NODE: &str = "node-a";

pub(crate) fn checkpoint(s: &Setup) -> PathBuf {
    s.place.state_dir.join("dra-checkpoint.json")
}

/// The checkpoint as JSON, `Null` while it is absent or being replaced.
pub(crate) fn checkpoint_json(s: &Setup) -> Value {
    std::fs::read(checkpoint(s))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null)
}

pub(crate) fn claim_spec(s: &Setup, uid: &str) -> PathBuf {
    s.dirs.cdi().join(format!("nodefabric-claim-{uid}.json"))
}

/// Waits (bounded) for the driver to exit on its own.
fn exit_of(driver: &mut Driver, within: Duration) -> ExitStatus {
    wait::until_by(
        within,
        "the driver to exit on its own",
        || driver.child.try_wait().unwrap(),
        Option::is_some,
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_claims_are_swept_and_a_claim_whose_read_fails_is_left_alone() {
    let s = Setup::new(NODE);
    let driver = started(&s, &["--sweep-interval", "1s"]);
    let pool = devices(&s);
    let names = ["gone", "replaced", "moved", "kept", "unreadable"];
    let mut uids = Vec::new();
    for (i, n) in names.iter().enumerate() {
        let uid = s
            .cluster
            .api
            .with(|st| st.put_claim("team", n, &[(DRIVER, NODE, &name(&pool[i]), "nic")]));
        uids.push(uid);
    }
    let claims: Vec<_> = names
        .iter()
        .zip(&uids)
        .map(|(n, u)| claim("team", n, u))
        .collect();
    let answer = prepare(&driver, claims).await;
    assert!(answer.values().all(|a| a.error.is_empty()), "{answer:?}");
    let [gone, replaced, moved, kept, unreadable] = [0, 1, 2, 3, 4].map(|i| uids[i].clone());

    // The unreadable claim's next two reads fail (a server error is no
    // proof the claim is gone).
    for _ in 0..2 {
        s.cluster.api.fault(
            "GET",
            "/apis/resource.k8s.io/v1/namespaces/team/resourceclaims/unreadable",
            Action::Respond(500),
        );
    }
    let moved_device = name(&pool[2]);
    s.cluster.api.with(|st| {
        st.delete_claim("team", "gone");
        st.delete_claim("team", "replaced");
        st.put_claim(
            "team",
            "replaced",
            &[(DRIVER, NODE, &name(&pool[1]), "nic")],
        );
        st.reallocate_claim("team", "moved", &[(DRIVER, "node-b", &moved_device, "nic")]);
        st.delete_claim("team", "unreadable");
    });
    let held = |uid: &str| checkpoint_json(&s)["claims"].get(uid).is_some();
    wait::until(
        "the stale claims dropped from the checkpoint",
        || checkpoint_json(&s)["claims"].clone(),
        |claims| {
            [&gone, &replaced, &moved]
                .iter()
                .all(|u| claims.get(u).is_none())
        },
    );
    for uid in [&gone, &replaced, &moved] {
        assert!(!claim_spec(&s, uid).exists(), "{uid}'s CDI spec remains");
    }
    assert!(held(&kept) && claim_spec(&s, &kept).exists());
    assert!(
        held(&unreadable) && claim_spec(&s, &unreadable).exists(),
        "swept on a failed read"
    );
    // Each is logged once its checkpoint write is done: wait for the lines.
    for n in ["team/gone", "team/replaced", "team/moved"] {
        wait::until(
            &format!("{n} logged as swept"),
            || driver.log_lines(),
            |log| log.iter().any(|l| l.contains(n) && l.contains("swept")),
        );
    }
    // Once its read succeeds, the deleted claim goes too; the live one stays.
    wait::until(
        "the unreadable claim swept once read",
        || checkpoint_json(&s)["claims"].clone(),
        |claims| claims.get(&unreadable).is_none(),
    );
    assert!(!claim_spec(&s, &unreadable).exists());
    assert!(held(&kept) && claim_spec(&s, &kept).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_driver_on_the_same_state_dir_exits_naming_the_holder_or_waits_its_turn() {
    let s = Setup::new(NODE);
    let first = started(&s, &[]);
    let nic = name(&devices(&s)[0]);
    let uid = s
        .cluster
        .api
        .with(|st| st.put_claim("team", "job", &[(DRIVER, NODE, &nic, "nic")]));
    let answer = prepare(&first, vec![claim("team", "job", &uid)]).await;
    assert_eq!(answer[&uid].error, "");
    let saved = std::fs::read(checkpoint(&s)).unwrap();

    // A hand-started copy that waits one second: it exits, naming the holder.
    let mut second = Driver::start(&s.place, &["--interval", "1h", "--lock-wait", "1s"]);
    let status = exit_of(&mut second, Duration::from_secs(15));
    assert!(!status.success());
    let log = second.log_lines().join("\n");
    let lock = s.place.state_dir.join("dra.lock");
    assert!(
        log.contains(&lock.display().to_string())
            && log.contains(&format!("pid {}", first.child.id())),
        "{log}"
    );
    assert_eq!(std::fs::read(checkpoint(&s)).unwrap(), saved);
    // The first still serves.
    assert_eq!(
        prepare(&first, vec![claim("team", "job", &uid)]).await[&uid].error,
        ""
    );

    // A rolling update's new pod waits, serving nothing, until the old one
    // has gone; then it answers from the same checkpoint.
    let third = Driver::start(&s.place, &["--interval", "1h", "--lock-wait", "60s"]);
    wait::until(
        "the third to wait for the lock",
        || third.log_lines(),
        |log| log.iter().any(|l| l.contains("waiting")),
    );
    let (status, _) = first.terminate();
    assert!(status.success());
    wait::until(
        "the third to serve",
        || third.log_lines(),
        |log| log.iter().any(|l| l.contains("serving")),
    );
    assert_eq!(
        unprepare(&third, vec![claim("team", "job", &uid)]).await,
        [(uid.clone(), String::new())]
    );
    assert!(!claim_spec(&s, &uid).exists());
    assert!(checkpoint_json(&s)["claims"].get(&uid).is_none());
}

/// A UID in the checked-in v1 checkpoint (tests/data/dra/checkpoint-v1.json).
const V1_UID: &str = "0b6c7d8e-1111-4222-8333-444455556666";

fn data(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/dra")
        .join(file)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v1_checkpoint_is_upgraded_in_place_and_its_claims_are_kept() {
    let s = Setup::new(NODE);
    std::fs::create_dir_all(&s.place.state_dir).unwrap();
    std::fs::copy(data("checkpoint-v1.json"), checkpoint(&s)).unwrap();
    let v1: Value = serde_json::from_slice(&std::fs::read(checkpoint(&s)).unwrap()).unwrap();
    let device = v1["claims"][V1_UID]["devices"][0]["deviceName"]
        .as_str()
        .unwrap()
        .to_string();
    s.cluster
        .api
        .with(|st| st.put_claim_as("team", "legacy", V1_UID, &[(DRIVER, NODE, &device, "nic")]));
    let driver = started(&s, &["--sweep-interval", "1s"]);
    wait::until(
        "the checkpoint rewritten as v2",
        || checkpoint_json(&s),
        |c| c["format"] == "dra.nodefabric.gpustack.ai/v2",
    );
    let v2 = checkpoint_json(&s);
    assert_eq!(v2["claims"][V1_UID]["driver"], DRIVER, "{v2}");
    assert_eq!(
        v2["claims"][V1_UID]["devices"], v1["claims"][V1_UID]["devices"],
        "{v2}"
    );
    let log = driver.log_lines().join("\n");
    assert!(log.contains("upgraded") && log.contains("v1"), "{log}");
    // Answered from the checkpoint, as before the upgrade.
    let again = prepare(&driver, vec![claim("team", "legacy", V1_UID)]).await;
    assert_eq!(again[V1_UID].error, "");
    assert_eq!(again[V1_UID].devices[0].device_name, device);
    assert!(checkpoint_json(&s)["claims"].get(V1_UID).is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_of_a_newer_format_stops_the_start_naming_the_file() {
    let s = Setup::new(NODE);
    std::fs::create_dir_all(&s.place.state_dir).unwrap();
    let newer = br#"{"format":"dra.nodefabric.gpustack.ai/v9","claims":{"x":{"future":true}}}"#;
    std::fs::write(checkpoint(&s), newer).unwrap();
    let mut driver = Driver::start(&s.place, &["--interval", "1h"]);
    let status = exit_of(&mut driver, Duration::from_secs(15));
    assert!(!status.success());
    let log = driver.log_lines().join("\n");
    assert!(
        log.contains(&checkpoint(&s).display().to_string()) && log.contains("v9"),
        "{log}"
    );
    // Not set aside: its claims are not forgotten.
    assert_eq!(std::fs::read(checkpoint(&s)).unwrap(), newer);
    assert!(!s
        .place
        .state_dir
        .join("dra-checkpoint.json.unreadable")
        .exists());
}

/// Shuts down the driver's listening socket at `socket` from outside, as a
/// server task that died would leave it: the file stays, the same inode,
/// and nothing accepts on it any more.
fn shut_listener(pid: u32, socket: &Path) {
    let table = std::fs::read_to_string("/proc/net/unix").unwrap();
    let path = socket.display().to_string();
    let inode = table
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.len() >= 8 && f[7] == path && f[3] == "00010000")
        .map(|f| f[6].to_string())
        .unwrap_or_else(|| panic!("no listener on {path} in /proc/net/unix"));
    let wanted = format!("socket:[{inode}]");
    let fd = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .find(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy() == wanted))
        .map(|e| e.file_name().to_string_lossy().parse::<i32>().unwrap())
        .unwrap_or_else(|| panic!("driver {pid} holds no {wanted}"));
    // SAFETY: plain syscalls on descriptors this function owns and closes.
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) as i32;
        assert!(
            pidfd >= 0,
            "pidfd_open: {}",
            std::io::Error::last_os_error()
        );
        let ours = libc::syscall(libc::SYS_pidfd_getfd, pidfd, fd, 0) as i32;
        assert!(
            ours >= 0,
            "pidfd_getfd: {}",
            std::io::Error::last_os_error()
        );
        assert_eq!(libc::shutdown(ours, libc::SHUT_RDWR), 0);
        libc::close(ours);
        libc::close(pidfd);
    }
}

fn a_socket_that_stops_answering_fails_liveness(which: fn(&Driver) -> PathBuf) {
    let s = Setup::new(NODE);
    let probes = crate::support::os::free_addr();
    let driver = started(
        &s,
        &["--metrics-addr", &probes, "--socket-check-interval", "1s"],
    );
    wait::until(
        "/healthz 200",
        || http_get(&probes, "/healthz"),
        |r| r.0 == 200,
    );
    let socket = which(&driver);
    shut_listener(driver.child.id(), &socket);
    wait::until(
        "/healthz 503",
        || http_get(&probes, "/healthz"),
        |r| r.0 == 503,
    );
    let (_, why) = http_get(&probes, "/healthz");
    assert!(why.contains(&socket.display().to_string()), "{why}");
    // The file is still in place: only a dial tells.
    assert!(socket.exists());
}

#[test]
fn a_dra_socket_that_stops_answering_fails_liveness() {
    a_socket_that_stops_answering_fails_liveness(|d| d.place.service());
}

#[test]
fn a_registration_socket_that_stops_answering_fails_liveness() {
    a_socket_that_stops_answering_fails_liveness(|d| d.place.registration());
}
