//! The interval publisher (`publish --interval`) in a cluster: unready while
//! its record cannot be written, each pass bounded by the API timeout, and
//! a record lost on the server side written again within an interval.

use super::support::cluster::NS;
use super::support::os::free_port;
use super::support::wait;
use super::{failed, patches, probe, spawn_publisher, World, CM, NRR_PATH, RAIL_ARGS};
use serde_json::{json, Value};
use std::fs;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// `publish --interval 1s` for node-a under the broker's account, with
/// --health-addr on `port` and the cluster flags `target`.
fn interval_publisher(w: &World, port: u16, target: &[&str]) -> Child {
    spawn_publisher(w, "node-a", "", "1s", Some(port), target)
}

#[test]
fn interval_publisher_is_unready_while_its_publication_fails_and_ready_after() {
    let w = World::new();
    w.api.add_node("node-a");
    let port = free_port();
    // The namespace is the account's (the kubeconfig context's).
    let mut publisher = interval_publisher(&w, port, &["--rails-configmap", CM]);
    wait::until(
        "the publisher answers probes",
        || probe(port, "/livez"),
        |code| *code == Some(200),
    );
    // No ConfigMap yet: every pass fails, the labels are still written.
    wait::until(
        "a pass failed",
        || patches(&w.api),
        |sent| sent.iter().any(|p| p.status == 404),
    );
    assert_eq!(probe(port, "/readyz"), Some(503));
    assert!(
        w.dir.join("f/nodefabric").exists(),
        "labels do not wait for the cluster"
    );
    w.owned_configmap(json!({}));
    wait::until(
        "the record is published",
        || w.api.data(NS, CM),
        |d| d.as_ref().is_some_and(|d| d.contains_key("node-a")),
    );
    wait::until(
        "the publisher is ready",
        || probe(port, "/readyz"),
        |code| *code == Some(200),
    );
    publisher.kill().unwrap();
    publisher.wait().unwrap();
}

#[test]
fn interval_publisher_of_a_node_rail_record_is_unready_until_the_crd_exists() {
    let w = World::new();
    let uid = w.api.add_node("node-a");
    let port = free_port();
    let mut publisher = interval_publisher(&w, port, &["--rails-record", "custom-resource"]);
    wait::until(
        "the publisher answers probes",
        || probe(port, "/livez"),
        |code| *code == Some(200),
    );
    wait::until(
        "a pass failed",
        || w.api.log(),
        |log| {
            log.iter()
                .any(|l| l.path.starts_with(NRR_PATH) && l.status == 404)
        },
    );
    assert_eq!(probe(port, "/readyz"), Some(503));
    assert!(
        w.dir.join("f/nodefabric").exists(),
        "labels do not wait for the cluster"
    );
    w.api.install_crd();
    wait::until("the record is applied", || w.nrr("node-a"), Option::is_some);
    wait::until(
        "the publisher is ready",
        || probe(port, "/readyz"),
        |code| *code == Some(200),
    );
    assert_eq!(w.nrr("node-a").unwrap()["spec"]["nodeUID"], uid.as_str());
    // Later passes (one a second) find the record unchanged: neither the
    // Node nor the record is asked for again within the refresh time.
    let count = |w: &World| {
        let log = w.api.log();
        let applies = log
            .iter()
            .filter(|l| l.method == "PATCH" && l.path.starts_with(NRR_PATH) && l.status < 300)
            .count();
        let node_reads = log
            .iter()
            .filter(|l| l.path == "/api/v1/nodes/node-a")
            .count();
        (applies, node_reads)
    };
    let before = count(&w);
    // Three more passes: each reads the record back to see it unchanged
    // (once the fourth has, the third is over).
    let read_back = |w: &World| {
        let path = format!("{NRR_PATH}/node-a");
        let log = w.api.log();
        log.iter()
            .filter(|l| l.method == "GET" && l.path == path)
            .count()
    };
    let reads = read_back(&w);
    wait::until("three more passes", || read_back(&w), |&n| n > reads + 3);
    assert_eq!(
        count(&w),
        before,
        "an unchanged record is not sent again every pass"
    );
    assert_eq!(before.1, 1, "the Node's UID was read once");
    publisher.kill().unwrap();
    publisher.wait().unwrap();
}

// ---- issue 31: faults that lost records ----------------------------------------

/// The broker's kubeconfig with its credential from an `exec` plugin that
/// never returns (a hung cloud CLI).
fn hung_credential_kubeconfig(w: &World) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let script = w.dir.join("hung-credential.sh");
    fs::write(&script, "#!/bin/sh\nPATH=/usr/bin:/bin exec sleep 600\n").unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
    let mut config: Value =
        serde_json::from_slice(&fs::read(&w.broker_kubeconfig).unwrap()).unwrap();
    config["users"][0]["user"] = json!({"exec": {
        "apiVersion": "client.authentication.k8s.io/v1beta1",
        "command": script,
        "interactiveMode": "Never",
    }});
    let path = w.dir.join("kubeconfig-hung-credential");
    fs::write(&path, serde_json::to_vec(&config).unwrap()).unwrap();
    path
}

/// Runs `c` to its end, or kills it and fails once `limit` has passed.
fn output_within(c: &mut Command, limit: Duration) -> Output {
    let child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output().unwrap()));
    match rx.recv_timeout(limit) {
        Ok(o) => o,
        Err(_) => {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            panic!("still running after {limit:?}");
        }
    }
}

#[test]
fn hung_credential_command_fails_the_pass_within_the_api_timeout_and_the_next_interval_runs() {
    let w = World::holding(json!({"node-a": "previous"}));
    let hung = hung_credential_kubeconfig(&w);
    // A one-shot broker: the Node read waits on the credential command; the
    // API timeout bounds it, credential command included.
    let started = Instant::now();
    let o = output_within(
        w.broker("node-a", "lldp.json")
            .env("KUBECONFIG", &hung)
            .args(["--api-timeout", "1s"]),
        Duration::from_secs(60),
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    let e = failed(o);
    let lines: Vec<&str> = e.lines().filter(|l| l.contains("API timeout")).collect();
    assert_eq!(lines.len(), 1, "one line names the timeout: {e}");
    assert!(
        lines[0].contains("1s") && lines[0].contains("Node node-a"),
        "{e}"
    );
    assert_eq!(w.data()["node-a"], "previous");

    // An interval publisher: each pass fails within the timeout, the next
    // one runs, the labels are written (they never wait for the API), and
    // the passes completing keep it live.
    let port = free_port();
    let log = fs::File::create(w.dir.join("publisher.log")).unwrap();
    let mut c = w.publish_as(&hung, "");
    c.args(["--interval", "1s", "--api-timeout", "1s", "--health-addr"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--lldp-json")
        .arg(w.dir.join("lldp.json"))
        .args(RAIL_ARGS)
        .args(["--node-name", "node-a", "--rails-configmap", CM]);
    let mut publisher = c.stdout(Stdio::null()).stderr(log).spawn().unwrap();
    wait::until(
        "three passes failed on the API timeout",
        || w.read_log("publisher.log"),
        |log| {
            log.lines()
                .filter(|l| l.contains("publish pass failed") && l.contains("API timeout"))
                .count()
                >= 3
        },
    );
    assert!(
        w.dir.join("f/nodefabric").exists(),
        "labels do not wait for the API"
    );
    assert_eq!(probe(port, "/livez"), Some(200), "passes complete");
    assert_eq!(probe(port, "/readyz"), Some(503), "passes fail");
    assert_eq!(w.data()["node-a"], "previous");
    publisher.kill().unwrap();
    publisher.wait().unwrap();
}

#[test]
fn server_side_loss_of_the_configmap_record_is_restored_within_an_interval_not_hidden_for_ten_minutes(
) {
    let w = World::new();
    w.api.add_node("node-a");
    w.owned_configmap(json!({}));
    let port = free_port();
    let mut publisher = interval_publisher(&w, port, &["--rails-configmap", CM]);
    let held = |w: &World| w.api.data(NS, CM).and_then(|d| d.get("node-a").cloned());
    wait::until(
        "the record is published",
        || w.api.data(NS, CM),
        |d| d.as_ref().is_some_and(|d| d.contains_key("node-a")),
    );
    let published = w.data()["node-a"].clone();
    wait::until(
        "the publisher is ready",
        || probe(port, "/readyz"),
        |code| *code == Some(200),
    );
    // The key edited by hand.
    w.api
        .with(|s| s.set_configmap_key(NS, CM, "node-a", "edited by hand"));
    wait::until(
        "the hand edit is overwritten",
        || held(&w),
        |v| v.as_ref() == Some(&published),
    );
    // The ConfigMap deleted: the record cannot be written, and readiness says so.
    w.api.delete_configmap(NS, CM);
    wait::until(
        "the publisher is unready",
        || probe(port, "/readyz"),
        |code| *code == Some(503),
    );
    // Created again, empty (as the observer does): the record comes back.
    w.owned_configmap(json!({}));
    wait::until(
        "the record is restored",
        || held(&w),
        |v| v.as_ref() == Some(&published),
    );
    wait::until(
        "the publisher is ready again",
        || probe(port, "/readyz"),
        |code| *code == Some(200),
    );
    // The Node re-created under a new UID; its old record removed (as the
    // observer does): the broker reads the new UID and writes it.
    let new_uid = w.api.add_node("node-a");
    w.owned_configmap(json!({}));
    wait::until(
        "the record carries the new UID",
        || held(&w),
        |v| {
            v.as_ref().is_some_and(|v| {
                serde_json::from_str::<Value>(v).unwrap()["nodeUID"] == new_uid.as_str()
            })
        },
    );
    publisher.kill().unwrap();
    publisher.wait().unwrap();
}

#[test]
fn server_side_loss_of_a_node_rail_record_is_restored_within_an_interval_not_hidden_for_ten_minutes(
) {
    let w = World::new();
    w.api.add_node("node-a");
    w.api.install_crd();
    let port = free_port();
    let mut publisher = interval_publisher(&w, port, &["--rails-record", "custom-resource"]);
    wait::until("the record is applied", || w.nrr("node-a"), Option::is_some);
    let spec = w.nrr("node-a").unwrap()["spec"].clone();
    // Deleted (or gone with a re-installed CRD): applied again.
    w.api.delete_record("node-a");
    wait::until(
        "the record is applied again",
        || w.nrr("node-a"),
        |r| r.as_ref().is_some_and(|r| r["spec"] == spec),
    );
    // Its spec edited by hand: put back.
    assert!(
        w.api.with(|s| s.edit_record(
            "node-a",
            "kubectl-edit",
            json!({"spec": {"railSource": "interface-name"}})
        )) < 300
    );
    wait::until(
        "the hand edit is undone",
        || w.nrr("node-a"),
        |r| r.as_ref().is_some_and(|r| r["spec"] == spec),
    );
    // The Node re-created: the garbage collector takes the record, and the
    // broker applies it again owned by the new Node.
    let new_uid = w.api.add_node("node-a");
    w.api.with(|s| s.collect_garbage());
    wait::until(
        "the record is owned by the new Node",
        || w.nrr("node-a"),
        |r| {
            r.as_ref().is_some_and(|r| {
                r["metadata"]["ownerReferences"][0]["uid"] == new_uid.as_str()
                    && r["spec"]["nodeUID"] == new_uid.as_str()
            })
        },
    );
    wait::until(
        "the publisher is ready",
        || probe(port, "/readyz"),
        |code| *code == Some(200),
    );
    publisher.kill().unwrap();
    publisher.wait().unwrap();
}

/// After `helm upgrade` (which leaves CRDs as they are) the server's
/// NodeRailRecord CRD may be older than the publisher and prune `railIndex`
/// from what it keeps. The publisher says so once, naming the field and the
/// fix, and compares later passes with what the server kept: it does not
/// apply again, read its Node again and warn on every pass.
#[test]
fn an_older_crd_that_prunes_rail_index_is_named_once_not_reapplied_every_pass() {
    let w = World::new();
    w.api.add_node("node-a");
    w.api.install_crd_without("railIndex");
    let mut c = w.publish_as(&w.broker_kubeconfig, "");
    c.args([
        "--interval",
        "1s",
        "--health-addr",
        &format!("127.0.0.1:{}", free_port()),
    ]);
    c.arg("--lldp-json").arg(w.dir.join("lldp.json"));
    c.args(RAIL_ARGS)
        .args(["--node-name", "node-a", "--rails-record", "custom-resource"]);
    let mut publisher = w.spawn_logged(&mut c, "publisher.log");
    wait::until("the record is applied", || w.nrr("node-a"), Option::is_some);
    let applies = || {
        w.api
            .log()
            .into_iter()
            .filter(|l| l.method == "PATCH" && l.path == format!("{NRR_PATH}/node-a"))
            .collect::<Vec<_>>()
    };
    let first = applies();
    assert_eq!(first.len(), 1);
    assert!(
        first[0].body.contains("railIndex"),
        "the record sent has rail indices: {}",
        first[0].body
    );
    assert!(
        w.nrr("node-a").unwrap()["spec"].get("railIndex").is_none(),
        "the server pruned them"
    );
    // Three more passes.
    let log = w.dir.join("publisher.log");
    wait::until(
        "three more passes",
        || fs::read_to_string(&log).unwrap_or_default(),
        |t| {
            t.lines()
                .filter(|l| l.contains("publish pass") && l.ends_with("finished"))
                .count()
                >= 4
        },
    );
    publisher.kill().unwrap();
    publisher.wait().unwrap();
    assert_eq!(applies().len(), 1, "applied again although nothing changed");
    let text = fs::read_to_string(&log).unwrap();
    let warnings: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("NodeRailRecord"))
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    assert!(
        warnings[0].contains("without railIndex") && warnings[0].contains("CRD is older"),
        "{}",
        warnings[0]
    );
}
