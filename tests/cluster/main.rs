//! The cluster-wide rail record, end to end: the real `nodefabric` binary as
//! broker (`rails`/`publish` with --rails-configmap) and as Node Observer
//! (`observe`), against the in-test API server (tests/support/apiserver.rs)
//! over TLS with a bearer token. Seed 001's list: concurrent publication,
//! observer restart, ownership conflicts, Node-name reuse; plus the faults
//! a broker must survive without changing the ConfigMap.

#[path = "../support/mod.rs"]
mod support;

mod configmap_restore;
mod gpu_exec;
mod kubectl;

use apiserver::{Action, ApiServer, TOKEN};
use serde_json::{json, Value};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};
use support::cluster::{Cluster, NS, OWNER};
use support::os::{free_port, make_fifo};
use support::{apiserver, fixtures, host};

// The names deploy/ uses: the RBAC there grants exactly these.
const CM: &str = "nodefabric-rails";
const CM_PATH: &str = "/api/v1/namespaces/nodefabric/configmaps/nodefabric-rails";
const RAIL_PORTS: [&str; 8] = [
    "eth_r0_p0",
    "eth_r0_p1",
    "eth_r1_p0",
    "eth_r1_p1",
    "eth_r2_p0",
    "eth_r2_p1",
    "eth_r3_p0",
    "eth_r3_p1",
];

/// A test's world: an API server, a fixture node tree, a kubeconfig.
struct World {
    api: ApiServer,
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    root: PathBuf,
    /// The administrator (any request).
    kubeconfig: PathBuf,
    /// The publisher DaemonSet's ServiceAccount, under deploy/'s RBAC.
    broker_kubeconfig: PathBuf,
    /// The observer Deployment's ServiceAccount, under deploy/'s RBAC.
    observer_kubeconfig: PathBuf,
}

impl World {
    fn new() -> World {
        World::with_cluster(Cluster::start)
    }

    /// A world on the cluster `start` makes in the test's folder.
    fn with_cluster(start: impl FnOnce(&Path) -> Cluster) -> World {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let root = dir.join("sys");
        fixtures::gpu8_named(&root, |i, _| format!("eth_r{}_p{}", i / 2, i % 2));
        let Cluster {
            api,
            kubeconfig,
            broker_kubeconfig,
            observer_kubeconfig,
            ..
        } = start(&dir);
        let w = World {
            api,
            _tmp: tmp,
            dir,
            root,
            kubeconfig,
            broker_kubeconfig,
            observer_kubeconfig,
        };
        w.lldp("lldp.json", &RAIL_PORTS);
        w.lldp("none.json", &[]);
        w
    }

    /// An lldpctl-shaped neighbour table listing `ifaces`.
    fn lldp(&self, name: &str, ifaces: &[&str]) -> PathBuf {
        let list: Vec<Value> = ifaces
            .iter()
            .map(|i| json!({ *i: {"via": "LLDP", "rid": "1"} }))
            .collect();
        let p = self.dir.join(name);
        fs::write(
            &p,
            serde_json::to_vec(&json!({"lldp": {"interface": list}})).unwrap(),
        )
        .unwrap();
        p
    }

    fn nodefabric(&self) -> Command {
        self.nodefabric_as(&self.kubeconfig)
    }

    fn nodefabric_as(&self, kubeconfig: &Path) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_nodefabric"));
        c.env("KUBECONFIG", kubeconfig)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("NODE_NAME")
            .env_remove("NODEFABRIC_NODE_UID")
            .env("NODEFABRIC_NOW", "2026-03-01T12:00:00Z")
            .env("PATH", "/nonexistent");
        c
    }

    /// `nodefabric rails` for node `node` with the given LLDP table, under the broker's account.
    fn rails(&self, node: &str, lldp: &str) -> Command {
        let mut c = self.nodefabric_as(&self.broker_kubeconfig);
        c.args(["rails", "-o", "json", "--sysfs-root"])
            .arg(&self.root)
            .arg("--lldp-json")
            .arg(self.dir.join(lldp));
        c.args([
            "--interface-regex",
            "^eth_r([0-9]+)_p[0-9]+$",
            "--rail-id",
            "rail$1",
            "--sysfs-paths",
            "--node-name",
            node,
        ]);
        c
    }

    /// The same as node `node`'s broker.
    fn broker(&self, node: &str, lldp: &str) -> Command {
        let mut c = self.rails(node, lldp);
        c.args(["--rails-configmap", &format!("{NS}/{CM}")]);
        c
    }

    fn observer(&self, log: &str) -> Child {
        let stderr = fs::File::create(self.dir.join(log)).unwrap();
        self.observe()
            .args(["--log-level", "debug"])
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap()
    }

    /// The observer (logging to observer.log) once past its first
    /// reconciliation.
    fn synced_observer(&self) -> Child {
        let obs = self.observer("observer.log");
        eventually("the observer synced", || {
            self.read_log("observer.log")
                .contains("reconciling every record")
        });
        obs
    }

    /// `nodefabric observe` under the observer's account.
    fn observe(&self) -> Command {
        let mut c = self.nodefabric_as(&self.observer_kubeconfig);
        c.args([
            "observe",
            "--rails-configmap",
            &format!("{NS}/{CM}"),
            "--owner-deployment",
            OWNER,
        ]);
        c
    }

    /// A world with the CRD installed and Node `node-a`'s record applied by
    /// its broker, as the custom-resource tests start.
    fn with_applied_record() -> World {
        let w = World::new();
        w.api.install_crd();
        w.api.add_node("node-a");
        ok(w.cr_broker("node-a", "lldp.json").output().unwrap());
        w
    }

    /// Node `node`'s broker writing its own NodeRailRecord.
    fn cr_broker(&self, node: &str, lldp: &str) -> Command {
        let mut c = self.rails(node, lldp);
        c.args(["--rails-record", "custom-resource"]);
        c
    }

    /// `nodefabric observe --rails-record custom-resource` under the
    /// observer's account, resyncing every `resync`.
    fn cr_observer(&self, log: &str, resync: &str) -> Child {
        let stderr = fs::File::create(self.dir.join(log)).unwrap();
        self.nodefabric_as(&self.observer_kubeconfig)
            .args([
                "observe",
                "--rails-record",
                "custom-resource",
                "--resync",
                resync,
                "--log-level",
                "debug",
            ])
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap()
    }

    /// The CRD installed, Nodes `names` each with its current record, and
    /// the custom-resource observer (resync `resync`) past its first pass.
    fn observed_records(&self, names: &[&str], resync: &str) -> Child {
        self.api.install_crd();
        for name in names {
            let uid = self.api.add_node(name);
            self.api
                .with(|s| drop(s.put_record(name, &uid, spec(&uid))));
        }
        let obs = self.cr_observer("observer.log", resync);
        eventually("the observer synced", || {
            self.read_log("observer.log")
                .contains("reconciling every record")
        });
        obs
    }

    /// A stored NodeRailRecord, whole.
    fn nrr(&self, node: &str) -> Option<Value> {
        self.api.with(|s| s.record(node).cloned())
    }

    fn read_log(&self, log: &str) -> String {
        fs::read_to_string(self.dir.join(log)).unwrap_or_default()
    }

    /// A ConfigMap owned by Deployment observer, as the observer makes it.
    fn owned_configmap(&self, data: Value) {
        let uid = self.api.add_deployment(NS, OWNER);
        let refs = json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": OWNER, "uid": uid, "controller": true}]);
        self.api.put_configmap(
            NS,
            CM,
            json!({"metadata": {"ownerReferences": refs}, "data": data}),
        );
    }

    fn data(&self) -> std::collections::BTreeMap<String, String> {
        self.api.data(NS, CM).expect("the ConfigMap exists")
    }

    fn record_uid(&self, node: &str) -> Option<String> {
        let v: Value = serde_json::from_str(self.data().get(node)?).unwrap();
        Some(v["nodeUID"].as_str().unwrap().to_string())
    }
}

/// A printed record as the ConfigMap stores it: compact, keys sorted.
fn compact(printed: &str) -> String {
    let v: Value = serde_json::from_str(printed).unwrap();
    let s = serde_json::to_string(&v).unwrap();
    assert!(!s.contains('\n') && s.len() < printed.len());
    s
}

fn ok(o: Output) -> String {
    assert!(
        o.status.success(),
        "exit {:?}: {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

fn failed(o: Output) -> String {
    assert!(
        !o.status.success(),
        "expected a failure: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Waits for `cond` (the observer works asynchronously); fails naming `what`
/// after a generous deadline, which is a hang guard, not a measurement.
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn sigterm(child: &mut Child) -> std::process::ExitStatus {
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    child.wait().unwrap()
}

fn patches(api: &ApiServer) -> Vec<apiserver::Logged> {
    api.log()
        .into_iter()
        .filter(|l| l.method == "PATCH" && l.path == CM_PATH)
        .collect()
}

// ---- the Node read ----------------------------------------------------------

#[test]
fn node_uid_comes_from_the_node_through_kubeconfig_or_the_service_account() {
    let w = World::new();
    let uid = w.api.add_node("node-a");
    let rails = |extra: &[&str], env: &[(&str, String)]| {
        let mut c = w.nodefabric();
        c.args(["rails", "-o", "json", "--sysfs-root"])
            .arg(&w.root)
            .arg("--lldp-json")
            .arg(w.dir.join("lldp.json"));
        c.args([
            "--interface-regex",
            "^eth_r([0-9]+)_p[0-9]+$",
            "--rail-id",
            "rail$1",
            "--sysfs-paths",
        ])
        .args(extra);
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    let r: Value = serde_json::from_str(&ok(rails(&["--node-name", "node-a"], &[]))).unwrap();
    assert_eq!(r["nodeUID"], uid.as_str());

    // In a pod: no KUBECONFIG, the service-account folder and the service variables.
    let sa = w.dir.join("sa");
    fs::create_dir(&sa).unwrap();
    fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tls/ca.crt"),
        sa.join("ca.crt"),
    )
    .unwrap();
    fs::write(sa.join("token"), TOKEN).unwrap(); // as kubelet mounts it: no newline
    let pod = [
        ("KUBECONFIG", String::new()),
        ("KUBERNETES_SERVICE_HOST", "127.0.0.1".into()),
        ("KUBERNETES_SERVICE_PORT", w.api.port.to_string()),
    ];
    let sa_flag = ["--service-account-dir", sa.to_str().unwrap()];
    let r: Value = serde_json::from_str(&ok(rails(
        &[&sa_flag[..], &["--node-name", "node-a"]].concat(),
        &pod,
    )))
    .unwrap();
    assert_eq!(r["nodeUID"], uid.as_str());

    // A Node the API does not know: the pass fails and says what to check.
    let e = failed(rails(&["--node-name", "node-b"], &[]));
    assert!(
        e.contains("no Node named \"node-b\"") && e.contains("spec.nodeName"),
        "{e}"
    );
    // A token the API refuses.
    fs::write(sa.join("token"), "wrong").unwrap();
    let e = failed(rails(
        &[&sa_flag[..], &["--node-name", "node-a"]].concat(),
        &pod,
    ));
    assert!(e.contains("Node node-a") && e.contains("401"), "{e}");
    // --node-uid wins and asks nothing.
    let before = w.api.log().len();
    let r: Value = serde_json::from_str(&ok(rails(
        &["--node-name", "node-a", "--node-uid", "given"],
        &[],
    )))
    .unwrap();
    assert_eq!(
        (r["nodeUID"].as_str(), w.api.log().len()),
        (Some("given"), before)
    );
}

// ---- the broker -------------------------------------------------------------

#[test]
fn concurrent_publication_every_broker_key_lands_none_lost() {
    let w = World::new();
    w.owned_configmap(json!({}));
    let nodes: Vec<(String, String)> = (0..12)
        .map(|i| format!("gpu-{i:02}"))
        .map(|n| (n.clone(), w.api.add_node(&n)))
        .collect();
    let children: Vec<_> = nodes
        .iter()
        .map(|(n, _)| {
            w.broker(n, "lldp.json")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let printed: Vec<String> = children
        .into_iter()
        .map(|c| ok(c.wait_with_output().unwrap()))
        .collect();
    let data = w.data();
    assert_eq!(
        data.keys().cloned().collect::<Vec<_>>(),
        nodes.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>()
    );
    for ((node, uid), out) in nodes.iter().zip(&printed) {
        assert_eq!(
            data[node],
            compact(out),
            "the key holds what `rails` prints, as compact JSON"
        );
        assert_eq!(w.record_uid(node).as_deref(), Some(uid.as_str()));
    }
    // Each broker sent one merge patch of its own key and never read or rewrote the object.
    let sent = patches(&w.api);
    assert_eq!(sent.len(), nodes.len());
    for p in &sent {
        assert_eq!(p.content_type, "application/merge-patch+json");
        let body: Value = serde_json::from_str(&p.body).unwrap();
        assert_eq!(
            body.as_object().unwrap().keys().collect::<Vec<_>>(),
            ["data"]
        );
        assert_eq!(body["data"].as_object().unwrap().len(), 1);
    }
    assert!(
        !w.api
            .log()
            .iter()
            .any(|l| l.path == CM_PATH && l.method != "PATCH"),
        "no GET/PUT of the ConfigMap"
    );
}

#[test]
fn missing_configmap_fails_the_broker_and_names_the_observer() {
    let w = World::new();
    w.api.add_node("node-a");
    let e = failed(w.broker("node-a", "lldp.json").output().unwrap());
    assert!(
        e.contains("ConfigMap nodefabric/nodefabric-rails does not exist")
            && e.contains("nodefabric observe"),
        "{e}"
    );
    assert!(w.api.data(NS, CM).is_none(), "the broker never creates it");
}

#[test]
fn injected_500_on_the_patch_keeps_the_previous_record_and_fails_the_pass() {
    let w = World::new();
    w.owned_configmap(json!({"node-a": "previous", "node-b": "other"}));
    w.api.add_node("node-a");
    w.api.fault("PATCH", CM_PATH, Action::Respond(500));
    let e = failed(w.broker("node-a", "lldp.json").output().unwrap());
    assert!(
        e.contains("PATCH ConfigMap nodefabric/nodefabric-rails key node-a") && e.contains("500"),
        "{e}"
    );
    assert_eq!(w.data()["node-a"], "previous");
    assert_eq!(w.data()["node-b"], "other");
    // The next pass succeeds.
    ok(w.broker("node-a", "lldp.json").output().unwrap());
    assert_ne!(w.data()["node-a"], "previous");
}

#[test]
fn discovery_error_changes_nothing_in_the_configmap() {
    let w = World::new();
    w.owned_configmap(json!({"node-a": "previous"}));
    w.api.add_node("node-a");
    fs::write(w.dir.join("broken.json"), "{\"lldp\": ").unwrap();
    failed(w.broker("node-a", "broken.json").output().unwrap());
    assert_eq!(w.data()["node-a"], "previous");
    assert!(patches(&w.api).is_empty());
}

#[test]
fn empty_rail_result_removes_the_key_and_an_absent_key_is_fine() {
    let w = World::new();
    w.owned_configmap(json!({"node-a": "previous", "node-b": "other"}));
    w.api.add_node("node-a");
    let printed: Value =
        serde_json::from_str(&ok(w.broker("node-a", "none.json").output().unwrap())).unwrap();
    assert_eq!(printed["nics"], json!({}));
    assert_eq!(w.data().keys().collect::<Vec<_>>(), ["node-b"]);
    ok(w.broker("node-a", "none.json").output().unwrap());
    // The last key going leaves no `data` at all (the real server stores no empty map).
    w.api.with(|s| s.set_configmap_key(NS, CM, "node-b", "x"));
    w.api.add_node("node-b");
    ok(w.broker("node-b", "none.json").output().unwrap());
    ok(w.broker("node-a", "lldp.json").output().unwrap());
    assert_eq!(
        w.data().keys().collect::<Vec<_>>(),
        ["node-a"],
        "a key can be added again to a ConfigMap without data"
    );
}

#[test]
fn record_refused_for_size_names_the_limit_and_the_record_size() {
    let w = World::new();
    let filler = "x".repeat(apiserver::LIMIT - 200);
    w.owned_configmap(json!({ "filler": filler }));
    w.api.add_node("node-a");
    let e = failed(w.broker("node-a", "lldp.json").output().unwrap());
    let size =
        "node-a".len() + compact(&ok(w.rails("node-a", "lldp.json").output().unwrap())).len();
    assert!(
        e.contains("1048576 bytes (1 MiB)")
            && e.contains(&format!("Node node-a ({size} bytes)"))
            && e.contains("previous record is kept"),
        "{e}"
    );
    assert!(!w.data().contains_key("node-a"));
    assert_eq!(w.data()["filler"].len(), filler.len());
}

// ---- the Node Observer -------------------------------------------------------

/// A record as a broker of Node `uid` would write it (only nodeUID matters to the observer).
fn record(uid: &str) -> String {
    format!("{{\"nodeUID\":\"{uid}\",\"version\":\"rails.nodefabric.gpustack.ai/v1\"}}")
}

#[test]
fn observer_creates_the_configmap_with_a_controller_owner_reference_and_exits_0_on_sigterm() {
    let w = World::new();
    let uid = w.api.add_deployment(NS, OWNER);
    let mut obs = w.observer("observer.log");
    eventually("the observer created the ConfigMap", || {
        w.api.configmap(NS, CM).is_some()
    });
    let cm = w.api.configmap(NS, CM).unwrap();
    assert_eq!(
        cm["metadata"]["ownerReferences"],
        json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": OWNER, "uid": uid, "controller": true}])
    );
    assert!(cm.get("data").is_none());
    // A broker can publish into it straight away.
    w.api.add_node("node-a");
    ok(w.broker("node-a", "lldp.json").output().unwrap());
    let status = sigterm(&mut obs);
    assert!(
        status.success(),
        "{status:?}: {}",
        w.read_log("observer.log")
    );
    // A restart adopts its own ConfigMap and changes nothing.
    let before = w.api.configmap(NS, CM).unwrap();
    let mut obs = w.observer("observer2.log");
    eventually("the restarted observer synced", || {
        w.read_log("observer2.log")
            .contains("reconciling every record")
    });
    assert_eq!(w.api.configmap(NS, CM).unwrap(), before);
    assert!(sigterm(&mut obs).success());
}

#[test]
fn ownership_conflict_an_unrelated_same_named_configmap_is_not_adopted() {
    let w = World::new();
    w.api.add_deployment(NS, OWNER);
    w.api.add_node("node-a");
    w.api.put_configmap(NS, CM, json!({"metadata": {"labels": {"app": "someone-else"}}, "data": {"node-gone": record("u-x")}}));
    let before = w.api.configmap(NS, CM).unwrap();
    let o = w.observe().output().unwrap();
    let e = failed(o);
    assert!(e.contains("ConfigMap nodefabric/nodefabric-rails exists and is not controlled by Deployment nodefabric/nodefabric-observer") && e.contains("refusing to adopt"), "{e}");
    assert_eq!(w.api.configmap(NS, CM).unwrap(), before, "nothing modified");
    assert!(!w.api.log().iter().any(|l| l.method != "GET"), "only reads");

    // Controlled by another Deployment (or an earlier one of the same name): refused too.
    w.api.put_configmap(NS, CM, json!({"metadata": {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": OWNER, "uid": "old-uid", "controller": true}]}}));
    let e = failed(w.observe().output().unwrap());
    assert!(
        e.contains("its controller is Deployment nodefabric-observer (uid old-uid)"),
        "{e}"
    );
}

#[test]
fn observer_without_its_deployment_fails_naming_it() {
    let w = World::new();
    let e = failed(w.observe().output().unwrap());
    assert!(
        e.contains("Deployment nodefabric/nodefabric-observer") && e.contains("--owner-deployment"),
        "{e}"
    );
    assert!(w.api.configmap(NS, CM).is_none());
}

#[test]
fn observer_removes_records_of_deleted_and_replaced_nodes_seen_on_the_watch() {
    let w = World::new();
    let (a, b, c) = (
        w.api.add_node("a"),
        w.api.add_node("b"),
        w.api.add_node("c"),
    );
    w.owned_configmap(json!({"a": record(&a), "b": record(&b), "c": record(&c)}));
    let mut obs = w.synced_observer();
    assert_eq!(
        w.data().len(),
        3,
        "every record is current: nothing removed"
    );

    w.api.touch_node("a"); // an ordinary update: no reconciliation
    w.api.delete_node("b");
    eventually("b's record is removed", || !w.data().contains_key("b"));
    // c is replaced: a new UID under the same name; its broker has not written yet.
    w.api.add_node("c");
    eventually("c's stale record is removed", || {
        !w.data().contains_key("c")
    });
    assert_eq!(w.data().keys().collect::<Vec<_>>(), ["a"]);
    // Every removal was a test-and-remove of the exact value read.
    let removals: Vec<Value> = patches(&w.api)
        .iter()
        .map(|p| serde_json::from_str(&p.body).unwrap())
        .collect();
    assert_eq!(
        removals[0],
        json!([{"op": "test", "path": "/data/b", "value": record(&b)}, {"op": "remove", "path": "/data/b"}])
    );
    assert!(patches(&w.api)
        .iter()
        .all(|p| p.content_type == "application/json-patch+json"));
    assert!(sigterm(&mut obs).success());
}

#[test]
fn observer_restart_cleans_deletions_missed_while_it_was_down() {
    let w = World::new();
    let (a, b) = (w.api.add_node("a"), w.api.add_node("b"));
    w.owned_configmap(json!({"a": record(&a), "b": record(&b), "never-a-node": record("u-z")}));
    let mut obs = w.observer("observer.log");
    eventually(
        "the first reconciliation removed the record of a Node that does not exist",
        || !w.data().contains_key("never-a-node"),
    );
    assert!(sigterm(&mut obs).success());

    // While it is down: b deleted, a replaced.
    w.api.delete_node("b");
    w.api.add_node("a");
    w.api.compact(); // the history is gone too: only the list tells
    let mut obs = w.observer("observer2.log");
    eventually("both stale records are removed after the restart", || {
        w.data().is_empty()
    });
    assert!(sigterm(&mut obs).success());
}

#[test]
fn node_name_reuse_a_replacement_record_written_before_the_observer_sees_the_deletion_stays() {
    let w = World::new();
    let old = w.api.add_node("x");
    w.owned_configmap(json!({"x": record(&old)}));
    let mut obs = w.synced_observer();

    // The observer sees nothing while x is deleted, re-created and its new broker publishes.
    w.api.pause_watches();
    w.api.delete_node("x");
    let new = w.api.add_node("x");
    ok(w.broker("x", "lldp.json").output().unwrap());
    assert_eq!(w.record_uid("x").as_deref(), Some(new.as_str()));
    w.api.resume_watches();
    // The observer handles the old Node's deletion: it checks Node x as it is now, and keeps the record.
    eventually("the observer judged x's record", || {
        w.read_log("observer.log")
            .contains("Node x is current, record kept")
            || !w.data().contains_key("x")
    });
    assert_eq!(
        w.record_uid("x").as_deref(),
        Some(new.as_str()),
        "the replacement record stays"
    );
    assert!(
        patches(&w.api)
            .iter()
            .all(|p| p.content_type != "application/json-patch+json"),
        "no removal attempted"
    );
    assert!(sigterm(&mut obs).success());
}

#[test]
fn failed_test_a_record_rewritten_between_read_and_removal_stays_and_the_observer_carries_on() {
    let w = World::new();
    let (a, b) = (w.api.add_node("a"), w.api.add_node("b"));
    w.owned_configmap(json!({"a": record(&a), "b": record(&b)}));
    let mut obs = w.synced_observer();
    // Just before the observer's removal lands, someone writes a new value under b.
    w.api.fault(
        "PATCH",
        CM_PATH,
        Action::Before(Box::new(|s| s.set_configmap_key(NS, CM, "b", "rewritten"))),
    );
    w.api.delete_node("b");
    eventually("the removal was refused", || {
        patches(&w.api).iter().any(|p| p.status == 422)
    });
    assert_eq!(
        w.data()["b"],
        "rewritten",
        "the test failed, so nothing was removed"
    );
    // Still running and still working.
    w.api.delete_node("a");
    eventually("a's record is removed", || !w.data().contains_key("a"));
    assert!(
        w.read_log("observer.log")
            .contains("changed since it was read"),
        "{}",
        w.read_log("observer.log")
    );
    assert!(sigterm(&mut obs).success());
}

// ---- RBAC (deploy/) and health ----------------------------------------------

#[test]
fn rbac_the_broker_may_patch_only_the_named_configmap() {
    let w = World::new();
    w.api.add_node("node-a");
    w.api
        .put_configmap(NS, "other", json!({"data": {"keep": "me"}}));
    let mut c = w.rails("node-a", "lldp.json");
    c.args(["--rails-configmap", &format!("{NS}/other")]);
    let e = failed(c.output().unwrap());
    assert!(
        e.contains("forbidden") && e.contains("`patch` on the ConfigMap other"),
        "{e}"
    );
    assert_eq!(w.api.data(NS, "other").unwrap().len(), 1);
    // The observer's account may not patch Nodes' keys as a broker would elsewhere either: a namespace it has no Role in.
    let mut c = w.nodefabric_as(&w.observer_kubeconfig);
    c.args([
        "observe",
        "--rails-configmap",
        "kube-system/rails",
        "--owner-deployment",
        OWNER,
    ]);
    let e = failed(c.output().unwrap());
    assert!(
        e.contains("forbidden") && e.contains("`get` on the Deployment"),
        "{e}"
    );
}

/// `GET path` on a health endpoint: the status code, or `None` while nothing listens.
fn probe(port: u16, path: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.split(' ').nth(1)?.parse().ok()
}

/// `publish --interval 1s` for node-a under the broker's account, with
/// --health-addr on `port` and the cluster flags `target`.
fn interval_publisher(w: &World, port: u16, target: &[&str]) -> Child {
    spawn_publisher(w, "node-a", "", "1s", Some(port), target)
}

/// `publish --interval <interval>` for Node `node` under the broker's
/// account, its output folders named `<prefix>f`, `<prefix>cdi` and
/// `<prefix>s`, with --health-addr on `port` if given and the cluster
/// flags `target`: the one spawn every interval-publisher test uses.
fn spawn_publisher(
    w: &World,
    node: &str,
    prefix: &str,
    interval: &str,
    port: Option<u16>,
    target: &[&str],
) -> Child {
    let mut c = w.nodefabric_as(&w.broker_kubeconfig);
    c.args(["publish", "--sysfs-root"]).arg(&w.root);
    for (flag, dir) in [
        ("--features-dir", "f"),
        ("--cdi-dir", "cdi"),
        ("--state-dir", "s"),
    ] {
        c.arg(flag).arg(w.dir.join(format!("{prefix}{dir}")));
    }
    c.args(["--interval", interval]);
    if let Some(port) = port {
        c.args(["--health-addr", &format!("127.0.0.1:{port}")]);
    }
    c.arg("--lldp-json").arg(w.dir.join("lldp.json"));
    c.args([
        "--interface-regex",
        "^eth_r([0-9]+)_p[0-9]+$",
        "--rail-id",
        "rail$1",
        "--sysfs-paths",
        "--node-name",
        node,
    ]);
    c.args(target);
    c.stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn interval_publisher_is_unready_while_its_publication_fails_and_ready_after() {
    let w = World::new();
    w.api.add_node("node-a");
    let port = free_port();
    // The namespace is the account's (the kubeconfig context's).
    let mut publisher = interval_publisher(&w, port, &["--rails-configmap", CM]);
    eventually("the publisher answers probes", || {
        probe(port, "/livez") == Some(200)
    });
    // No ConfigMap yet: every pass fails, the labels are still written.
    eventually("a pass failed", || {
        patches(&w.api).iter().any(|p| p.status == 404)
    });
    assert_eq!(probe(port, "/readyz"), Some(503));
    assert!(
        w.dir.join("f/nodefabric").exists(),
        "labels do not wait for the cluster"
    );
    w.owned_configmap(json!({}));
    eventually("the record is published", || {
        w.api.data(NS, CM).is_some_and(|d| d.contains_key("node-a"))
    });
    eventually("the publisher is ready", || {
        probe(port, "/readyz") == Some(200)
    });
    publisher.kill().unwrap();
    publisher.wait().unwrap();
}

#[test]
fn interval_publisher_of_a_node_rail_record_is_unready_until_the_crd_exists() {
    let w = World::new();
    let uid = w.api.add_node("node-a");
    let port = free_port();
    let mut publisher = interval_publisher(&w, port, &["--rails-record", "custom-resource"]);
    eventually("the publisher answers probes", || {
        probe(port, "/livez") == Some(200)
    });
    eventually("a pass failed", || {
        w.api
            .log()
            .iter()
            .any(|l| l.path.starts_with(NRR_PATH) && l.status == 404)
    });
    assert_eq!(probe(port, "/readyz"), Some(503));
    assert!(
        w.dir.join("f/nodefabric").exists(),
        "labels do not wait for the cluster"
    );
    w.api.install_crd();
    eventually("the record is applied", || w.nrr("node-a").is_some());
    eventually("the publisher is ready", || {
        probe(port, "/readyz") == Some(200)
    });
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
    std::thread::sleep(Duration::from_secs(3)); // three more passes
    assert_eq!(
        count(&w),
        before,
        "an unchanged record is not sent again every pass"
    );
    assert_eq!(before.1, 1, "the Node's UID was read once");
    publisher.kill().unwrap();
    publisher.wait().unwrap();
}

#[test]
fn observer_is_ready_once_its_first_reconciliation_succeeded() {
    let w = World::new();
    w.api.add_deployment(NS, OWNER);
    let port = free_port();
    let mut obs = w
        .observe()
        .args(["--health-addr", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    eventually("the observer is ready", || {
        probe(port, "/readyz") == Some(200)
    });
    assert_eq!(probe(port, "/livez"), Some(200));
    assert_eq!(probe(port, "/metrics"), Some(404));
    assert!(sigterm(&mut obs).success());
    assert!(
        !w.api.log().iter().any(|l| l.status == 403),
        "deploy/'s RBAC covers every request the observer makes"
    );
}

#[test]
fn values_file_config_map_name_is_the_broker_target_in_a_cluster() {
    let w = World::new();
    w.owned_configmap(json!({}));
    w.api.add_node("node-a");
    let values = w.dir.join("values.yaml");
    let yaml = "nodeMetadata:\n  plugins:\n    gpuNicRailMapping:\n      enabled: true\n      configMapName: nodefabric-rails\n      railSource:\n        name: host-lldp\n        hostLLDP:\n          interfaceRegex: '^eth_r([0-9]+)_p[0-9]+$'\n          railID: 'rail$1'\n      gpuSource:\n        gpuOperatorNamespace: gpu-operator\n        daemonSet: nvidia-device-plugin-daemonset\n";
    fs::write(&values, yaml).unwrap();
    let mut c = w.nodefabric_as(&w.broker_kubeconfig);
    c.args(["rails", "-o", "json", "--sysfs-root"])
        .arg(&w.root)
        .arg("--lldp-json")
        .arg(w.dir.join("lldp.json"));
    c.args(["--sysfs-paths", "--node-name", "node-a", "--rails-config"])
        .arg(&values);
    let printed = ok(c.output().unwrap());
    assert_eq!(w.data()["node-a"], compact(&printed));
    // Without --node-name there is no key to write: refused before anything is sent.
    let mut c = w.nodefabric_as(&w.broker_kubeconfig);
    c.args(["rails", "-o", "json", "--sysfs-root"])
        .arg(&w.root)
        .arg("--lldp-json")
        .arg(w.dir.join("lldp.json"));
    c.args(["--sysfs-paths", "--rails-config"]).arg(&values);
    let e = failed(c.output().unwrap());
    assert!(e.contains("needs --node-name"), "{e}");
}

// ---- hostile API servers ------------------------------------------------------

#[test]
fn hung_api_server_fails_the_broker_within_its_timeout_and_changes_nothing() {
    let w = World::new();
    w.owned_configmap(json!({"node-a": "previous"}));
    w.api.add_node("node-a");
    w.api.fault("PATCH", CM_PATH, Action::Hang);
    let e = failed(
        w.broker("node-a", "lldp.json")
            .args(["--api-timeout", "1s"])
            .output()
            .unwrap(),
    );
    assert!(
        e.contains("PATCH ConfigMap nodefabric/nodefabric-rails key node-a"),
        "{e}"
    );
    assert_eq!(w.data()["node-a"], "previous");
    // A hung Node read fails the pass the same way, before anything is written.
    w.api.fault("GET", "/api/v1/nodes/node-a", Action::Hang);
    let e = failed(
        w.broker("node-a", "lldp.json")
            .args(["--api-timeout", "1s"])
            .output()
            .unwrap(),
    );
    assert!(e.contains("Node node-a"), "{e}");
    assert_eq!(w.data()["node-a"], "previous");
}

#[test]
fn malformed_api_answers_fail_the_pass_naming_the_request() {
    let w = World::new();
    w.owned_configmap(json!({"node-a": "previous"}));
    w.api.add_node("node-a");
    for (body, code) in [
        ("not json at all", 200),
        ("{\"kind\": \"Status\"", 500),
        ("", 502),
        ("{\"metadata\": {}}", 200),
    ] {
        w.api
            .fault("GET", "/api/v1/nodes/node-a", Action::Raw(code, body));
        let o = w.broker("node-a", "lldp.json").output().unwrap();
        assert!(
            !o.status.success(),
            "{code} {body:?} was taken for an answer"
        );
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(e.contains("Node node-a"), "{body:?}: {e}");
        assert_eq!(w.data()["node-a"], "previous", "{body:?}");
    }
    // A 503 (an overloaded server) is retried, as client-go does: one is not a failure.
    w.api
        .fault("GET", "/api/v1/nodes/node-a", Action::Raw(503, ""));
    ok(w.broker("node-a", "lldp.json").output().unwrap());
    assert_ne!(w.data()["node-a"], "previous");
}

#[test]
fn observer_whose_watch_is_too_old_relists_and_cleans_what_it_missed() {
    let w = World::new();
    let (a, b) = (w.api.add_node("a"), w.api.add_node("b"));
    w.owned_configmap(json!({"a": record(&a), "b": record(&b)}));
    let mut obs = w.synced_observer();
    // b's deletion is never delivered: held back, then compacted away, then the watch drops.
    w.api.pause_watches();
    w.api.delete_node("b");
    w.api.compact();
    w.api.resume_watches();
    w.api.drop_watches();
    eventually("the re-list removed b's record", || {
        !w.data().contains_key("b")
    });
    assert!(
        w.api
            .log()
            .iter()
            .any(|l| l.query.contains("watch") && l.status == 200),
        "it watched again"
    );
    assert_eq!(w.data().keys().collect::<Vec<_>>(), ["a"]);
    assert!(sigterm(&mut obs).success());
}

// ---- the stand-in itself ---------------------------------------------------------

/// The stand-in answers as kube-apiserver does on the points the broker's
/// design rests on (why it merge-patches): checked through kube-rs itself.
#[test]
fn stand_in_refuses_json_patch_add_without_data_and_remove_of_an_absent_key_as_the_real_server_does(
) {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Patch, PatchParams};
    let w = World::new();
    w.owned_configmap(json!({}));
    assert!(
        w.api.configmap(NS, CM).unwrap().get("data").is_none(),
        "an empty map is not stored"
    );
    let kubeconfig = kube::config::Kubeconfig::read_from(&w.kubeconfig).unwrap();
    let codes = nodefabric::cluster::client::block_on(async {
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .unwrap();
        let api: kube::Api<ConfigMap> =
            kube::Api::namespaced(kube::Client::try_from(config).unwrap(), NS);
        let mut codes = Vec::new();
        for ops in [
            json!([{"op": "add", "path": "/data/node-a", "value": "r"}]),
            json!([{"op": "remove", "path": "/data/node-a"}]),
        ] {
            let patch: json_patch::Patch = serde_json::from_value(ops).unwrap();
            let r = api
                .patch(CM, &PatchParams::default(), &Patch::<()>::Json(patch))
                .await;
            codes.push(match r {
                Err(kube::Error::Api(s)) => (s.code, s.reason),
                other => panic!("{other:?}"),
            });
        }
        let merged = api
            .patch(
                CM,
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {"node-a": "r"}})),
            )
            .await
            .unwrap();
        assert_eq!(merged.data.unwrap()["node-a"], "r");
        api.patch(
            CM,
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"absent": null}})),
        )
        .await
        .unwrap();
        Ok(codes)
    })
    .unwrap();
    assert_eq!(
        codes,
        [(422, "Invalid".to_string()), (422, "Invalid".to_string())]
    );
}

#[test]
fn missing_or_malformed_kubeconfig_fails_naming_it() {
    let w = World::new();
    w.api.add_node("node-a");
    let garbage = w.dir.join("garbage-kubeconfig");
    fs::write(&garbage, "clusters: [unterminated\n").unwrap();
    // A FIFO would block a whole-file read forever: refused unopened.
    let fifo = w.dir.join("fifo-kubeconfig");
    make_fifo(&fifo);
    for path in [w.dir.join("no-such-kubeconfig"), garbage, fifo] {
        let e = failed(
            w.nodefabric_as(&path)
                .args([
                    "observe",
                    "--rails-configmap",
                    CM,
                    "--owner-deployment",
                    OWNER,
                ])
                .output()
                .unwrap(),
        );
        assert!(e.contains(&format!("KUBECONFIG={}", path.display())), "{e}");
        let e = failed(
            w.rails("node-a", "lldp.json")
                .env("KUBECONFIG", &path)
                .output()
                .unwrap(),
        );
        assert!(
            e.contains(&format!("KUBECONFIG={}", path.display())) && e.contains("Node node-a"),
            "{e}"
        );
    }
    assert!(w.api.log().is_empty(), "nothing reached the server");
}

#[test]
fn one_shot_publish_writes_the_rail_file_even_when_the_configmap_refuses() {
    let w = World::new();
    w.api.add_node("node-a");
    let file = w.dir.join("out/rails.json");
    let publish = || {
        let mut c = w.nodefabric_as(&w.broker_kubeconfig);
        c.args(["publish", "--sysfs-root"]).arg(&w.root);
        for (flag, dir) in [
            ("--features-dir", "f"),
            ("--cdi-dir", "cdi"),
            ("--state-dir", "s"),
        ] {
            c.arg(flag).arg(w.dir.join(dir));
        }
        c.arg("--rails-file")
            .arg(&file)
            .arg("--lldp-json")
            .arg(w.dir.join("lldp.json"));
        c.args([
            "--interface-regex",
            "^eth_r([0-9]+)_p[0-9]+$",
            "--rail-id",
            "rail$1",
            "--sysfs-paths",
        ]);
        c.args(["--node-name", "node-a", "--rails-configmap", CM]);
        c.output().unwrap()
    };
    let e = failed(publish());
    assert!(e.contains("does not exist"), "{e}");
    let written = fs::read_to_string(&file).expect("the file does not wait on the cluster");
    w.owned_configmap(json!({}));
    ok(publish());
    assert_eq!(
        w.data()["node-a"],
        compact(&written),
        "file and key carry the same record"
    );
}

// ---- the custom-resource form (--rails-record custom-resource) ---------------

const NRR_PATH: &str = "/apis/nodefabric.gpustack.ai/v1alpha1/noderailrecords";

/// A record spec as a broker of Node `uid` writes it (any valid one will do).
fn spec(uid: &str) -> Value {
    json!({"version": "rails.nodefabric.gpustack.ai/v1", "nodeUID": uid, "railSource": "host-lldp",
           "nics": {"0000:01:00.0": ["rail0"]}, "gpus": []})
}

#[test]
fn custom_resource_broker_applies_its_record_owned_by_its_node_and_an_empty_result_deletes_it() {
    let w = World::new();
    w.api.install_crd();
    let uid = w.api.add_node("node-a");
    // Under the broker's own account: deploy/'s RBAC must allow all of it.
    let printed: Value =
        serde_json::from_str(&ok(w.cr_broker("node-a", "lldp.json").output().unwrap())).unwrap();
    let obj = w.nrr("node-a").expect("the record was created");
    assert_eq!(
        obj["spec"], printed,
        "the spec is the printed record, nothing pruned or added"
    );
    assert_eq!(
        obj["metadata"]["ownerReferences"],
        json!([{"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": uid}]),
        "owned by the Node's UID, not a controller reference"
    );
    let labels = &obj["metadata"]["labels"];
    assert_eq!(
        (
            labels["nodefabric.gpustack.ai/gpus"].as_str(),
            labels["nodefabric.gpustack.ai/rails"].as_str()
        ),
        (Some("8"), Some("4"))
    );
    let apply = w
        .api
        .log()
        .into_iter()
        .find(|l| l.method == "PATCH" && l.path == format!("{NRR_PATH}/node-a"))
        .unwrap();
    assert!(
        apply
            .content_type
            .starts_with("application/apply-patch+yaml"),
        "{}",
        apply.content_type
    );
    assert!(
        apply.query.contains("fieldManager=nodefabric") && apply.query.contains("force=true"),
        "{}",
        apply.query
    );

    // The same record again: the object does not change.
    let rv = obj["metadata"]["resourceVersion"].clone();
    ok(w.cr_broker("node-a", "lldp.json").output().unwrap());
    assert_eq!(w.nrr("node-a").unwrap()["metadata"]["resourceVersion"], rv);

    // No rail any more: the object goes; gone already is fine.
    ok(w.cr_broker("node-a", "none.json").output().unwrap());
    assert!(w.nrr("node-a").is_none());
    ok(w.cr_broker("node-a", "none.json").output().unwrap());
    // No ConfigMap was touched in this form.
    assert!(w.api.log().iter().all(|l| !l.path.contains("configmaps")));
}

#[test]
fn custom_resource_owner_reference_lets_the_garbage_collector_take_a_replaced_nodes_record() {
    let w = World::with_applied_record();
    assert!(
        w.api.with(|s| s.collect_garbage()).is_empty(),
        "the living Node's record stays"
    );
    w.api.add_node("node-a"); // replaced: same name, new UID
    assert_eq!(w.api.with(|s| s.collect_garbage()), ["node-a"]);
}

#[test]
fn custom_resource_without_the_crd_fails_naming_how_to_install_it() {
    let w = World::new();
    w.api.add_node("node-a");
    let e = failed(w.cr_broker("node-a", "lldp.json").output().unwrap());
    assert!(
        e.contains("APPLY NodeRailRecord node-a")
            && e.contains("not installed")
            && e.contains("nodefabric crd | kubectl apply -f -"),
        "{e}"
    );
    // An empty result has nothing to delete, but the missing CRD is still named.
    let e = failed(w.cr_broker("node-a", "none.json").output().unwrap());
    assert!(
        e.contains("DELETE NodeRailRecord node-a") && e.contains("not installed"),
        "{e}"
    );
}

#[test]
fn custom_resource_a_hand_edit_of_the_spec_does_not_pin_a_stale_rail() {
    let w = World::with_applied_record();
    let good = w.nrr("node-a").unwrap()["spec"].clone();
    let code = w.api.with(|s| {
        s.edit_record(
            "node-a",
            "kubectl-edit",
            json!({"spec": {"nics": {"0000:99:00.0": ["rail9"]}}}),
        )
    });
    assert_eq!(code, 200);
    assert_ne!(w.nrr("node-a").unwrap()["spec"], good);
    // The broker's forced apply takes the fields back (unforced, the stand-in answers 409 as the real server does).
    ok(w.cr_broker("node-a", "lldp.json").output().unwrap());
    assert_eq!(w.nrr("node-a").unwrap()["spec"], good);
}

#[test]
fn custom_resource_api_failure_keeps_the_previous_record_and_fails_the_pass() {
    let w = World::with_applied_record();
    let before = w.nrr("node-a").unwrap();
    w.api
        .fault("PATCH", &format!("{NRR_PATH}/node-a"), Action::Respond(500));
    let e = failed(w.cr_broker("node-a", "lldp.json").output().unwrap());
    assert!(
        e.contains("APPLY NodeRailRecord node-a") && e.contains("500"),
        "{e}"
    );
    w.api.fault(
        "DELETE",
        &format!("{NRR_PATH}/node-a"),
        Action::Respond(500),
    );
    let e = failed(w.cr_broker("node-a", "none.json").output().unwrap());
    assert!(e.contains("DELETE NodeRailRecord node-a"), "{e}");
    assert_eq!(w.nrr("node-a").unwrap(), before);
}

#[test]
fn custom_resource_flags_that_belong_to_the_other_form_are_refused() {
    let w = World::new();
    let mut c = w.cr_broker("node-a", "lldp.json");
    c.args(["--rails-configmap", CM]); // no Node node-a either: the usage error comes first
    let e = failed(c.output().unwrap());
    assert!(
        e.contains("--rails-configmap") && e.contains("custom-resource"),
        "{e}"
    );
    let mut c = w.nodefabric_as(&w.observer_kubeconfig);
    c.args([
        "observe",
        "--rails-record",
        "custom-resource",
        "--rails-configmap",
        CM,
    ]);
    assert!(failed(c.output().unwrap()).contains("custom-resource needs neither"));
    let mut c = w.nodefabric_as(&w.observer_kubeconfig);
    c.args(["observe"]);
    assert!(failed(c.output().unwrap()).contains("needs --rails-configmap and --owner-deployment"));
    // Without a cluster there is nowhere to write the object.
    let mut c = w.cr_broker("node-a", "lldp.json");
    c.env_remove("KUBECONFIG");
    assert!(failed(c.output().unwrap()).contains("needs a cluster"));
}

/// The DELETE requests for NodeRailRecords, with their bodies.
fn record_deletes(api: &ApiServer) -> Vec<apiserver::Logged> {
    api.log()
        .into_iter()
        .filter(|l| l.method == "DELETE" && l.path.starts_with(NRR_PATH))
        .collect()
}

#[test]
fn observer_deletes_records_of_gone_and_replaced_nodes_without_the_garbage_collector() {
    let w = World::new();
    w.api.install_crd();
    let (a, b, c) = (
        w.api.add_node("a"),
        w.api.add_node("b"),
        w.api.add_node("c"),
    );
    w.api.add_node("e");
    let (ra, rb) = w.api.with(|s| {
        let ra = s.put_record("a", &a, spec(&a));
        let rb = s.put_record("b", &b, spec(&b));
        s.put_record("c", &c, spec(&c));
        s.put_record("gone", "u-gone", spec("u-gone"));
        // Left by an earlier Node e: its owner UID is not the current e's.
        s.put_record("e", "u-old-e", spec("u-old-e"));
        (ra, rb)
    });
    // Every candidate is judged again by a fresh read of its Node before its delete.
    let mut obs = w.cr_observer("observer.log", "10m");
    eventually("the record of a Node that never existed is deleted", || {
        w.nrr("gone").is_none()
    });
    eventually("the record of an earlier Node e is deleted", || {
        w.nrr("e").is_none()
    });
    assert!(w.nrr("a").is_some() && w.nrr("b").is_some() && w.nrr("c").is_some());

    w.api.touch_node("a"); // an ordinary update: nothing to do
    w.api.delete_node("b");
    eventually("b's record is deleted", || w.nrr("b").is_none());
    w.api.add_node("c"); // replaced under the same name; its broker has not applied yet
    eventually("c's record is deleted", || w.nrr("c").is_none());
    assert_eq!(w.nrr("a").unwrap()["metadata"]["uid"], ra.as_str());

    // Every delete named the uid and resourceVersion of the object judged.
    let deletes = record_deletes(&w.api);
    let b_delete = deletes.iter().find(|d| d.path.ends_with("/b")).unwrap();
    let body: Value = serde_json::from_str(&b_delete.body).unwrap();
    assert_eq!(body["preconditions"]["uid"], rb.as_str());
    assert!(
        body["preconditions"]["resourceVersion"].is_string(),
        "{body}"
    );
    assert!(deletes.iter().all(|d| d.body.contains("preconditions")));
    // The list is of metadata only, never the records' specs.
    let lists: Vec<_> = w
        .api
        .log()
        .into_iter()
        .filter(|l| l.method == "GET" && l.path == NRR_PATH)
        .collect();
    assert!(!lists.is_empty());
    assert!(sigterm(&mut obs).success());
    let log = w.read_log("observer.log");
    assert!(
        log.contains("deleted NodeRailRecord b: no Node of that name exists"),
        "{log}"
    );
    assert!(
        log.contains("deleted NodeRailRecord e: its owner UID u-old-e is not Node e's UID"),
        "{log}"
    );
}

#[test]
fn observer_never_deletes_a_record_reapplied_in_place_after_it_was_judged() {
    let w = World::new();
    let mut obs = w.observed_records(&["a", "b"], "10m");
    // b is replaced; just before the observer's delete lands, the new Node's
    // broker re-applies the same object in place (same uid, new resourceVersion).
    let new_b = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let uid_cell = new_b.clone();
    w.api.fault(
        "DELETE",
        &format!("{NRR_PATH}/b"),
        Action::Before(Box::new(move |s| {
            let uid = uid_cell.lock().unwrap().clone();
            s.put_record("b", &uid, spec(&uid));
        })),
    );
    let uid = w.api.add_node("b");
    *new_b.lock().unwrap() = uid.clone();
    eventually("the delete was refused", || {
        record_deletes(&w.api).iter().any(|d| d.status == 409)
    });
    let kept = w.nrr("b").expect("the re-applied record stays");
    assert_eq!(kept["metadata"]["ownerReferences"][0]["uid"], uid.as_str());
    // Still running and still working.
    w.api.delete_node("a");
    eventually("a's record is deleted", || w.nrr("a").is_none());
    assert!(w
        .read_log("observer.log")
        .contains("changed or went since it was read"));
    assert!(sigterm(&mut obs).success());
}

#[test]
fn observer_judges_a_record_its_node_cache_cannot_explain_by_a_fresh_read() {
    let w = World::new();
    let mut obs = w.observed_records(&["a"], "1s");
    // A new Node the cache does not get to see yet, and its broker's record.
    w.api.pause_watches();
    let d = w.api.add_node("d");
    w.api.with(|s| drop(s.put_record("d", &d, spec(&d))));
    // Several resyncs judge d against a cache without it: each reads Node d afresh and keeps the record.
    eventually("a resync judged d", || {
        w.read_log("observer.log")
            .matches("NodeRailRecord d: stale by the Node cache, current by a fresh read")
            .count()
            >= 2
    });
    assert!(
        w.nrr("d").is_some(),
        "a record is never deleted on the cache's word alone"
    );
    w.api.resume_watches();
    assert!(sigterm(&mut obs).success());
    assert!(record_deletes(&w.api).is_empty());
}

/// The example a scheduler extension would start from
/// (examples/watch_rail_records.rs), where a whole `cargo test` builds it.
/// (Building it from here would build it without the dev-dependencies'
/// features, and each build would undo the other's.)
fn example(name: &str) -> PathBuf {
    let deps = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    deps.parent().unwrap().join("examples").join(name)
}

#[test]
fn the_watch_example_sees_each_record_a_broker_applies_and_deletes() {
    let w = World::new();
    w.api.install_crd();
    w.api.add_node("node-a");
    let bin = example("watch_rail_records");
    let missing = (!bin.exists()).then(|| {
        format!(
            "{} is built by a whole `cargo test`, not by --test cluster alone",
            bin.display()
        )
    });
    if !host::runnable(
        "the_watch_example_sees_each_record_a_broker_applies_and_deletes",
        missing,
    ) {
        return;
    }
    let out = w.dir.join("example.out");
    let mut watcher = Command::new(&bin)
        .env("KUBECONFIG", &w.kubeconfig)
        .stdout(fs::File::create(&out).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    ok(w.cr_broker("node-a", "lldp.json").output().unwrap());
    eventually("the example printed node-a's record", || {
        fs::read_to_string(&out)
            .unwrap()
            .contains("node-a: 8 GPUs, 8 NICs; ")
    });
    ok(w.cr_broker("node-a", "none.json").output().unwrap());
    eventually("the example printed the deletion", || {
        fs::read_to_string(&out)
            .unwrap()
            .contains("node-a: deleted")
    });
    let _ = watcher.kill();
    let _ = watcher.wait();
}

#[test]
fn observer_without_the_crd_is_unready_naming_the_fix_and_recovers_once_it_exists() {
    let w = World::new();
    w.api.add_node("a");
    let port = free_port();
    let stderr = fs::File::create(w.dir.join("observer.log")).unwrap();
    let mut obs = w
        .nodefabric_as(&w.observer_kubeconfig)
        .args([
            "observe",
            "--rails-record",
            "custom-resource",
            "--resync",
            "1s",
            "--health-addr",
            &format!("127.0.0.1:{port}"),
        ])
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap();
    eventually("the pass failed", || {
        w.read_log("observer.log").contains("not installed")
    });
    assert!(w
        .read_log("observer.log")
        .contains("nodefabric crd | kubectl apply -f -"));
    assert_eq!(probe(port, "/readyz"), Some(503));
    w.api.install_crd();
    w.api
        .with(|s| drop(s.put_record("gone", "u-gone", spec("u-gone"))));
    eventually("a resync deleted the stale record", || {
        w.nrr("gone").is_none()
    });
    eventually("ready", || probe(port, "/readyz") == Some(200));
    assert!(sigterm(&mut obs).success());
}

#[test]
fn observer_delete_refused_or_beaten_by_the_garbage_collector() {
    let w = World::new();
    let mut obs = w.observed_records(&["a", "b"], "10m");
    // The garbage collector deletes b's record between the observer's list and its delete: a 404, not an error.
    w.api.fault(
        "DELETE",
        &format!("{NRR_PATH}/b"),
        Action::Before(Box::new(|s| drop(s.collect_garbage()))),
    );
    w.api.delete_node("b");
    eventually("the delete found it gone", || {
        record_deletes(&w.api).iter().any(|d| d.status == 404)
    });
    assert!(w.nrr("b").is_none());
    // A refused delete names the missing permission, and the record stays.
    w.api
        .fault("DELETE", &format!("{NRR_PATH}/a"), Action::Respond(403));
    w.api.delete_node("a");
    eventually("the refusal is logged", || {
        w.read_log("observer.log")
            .contains("needs `delete` on noderailrecords")
    });
    assert!(w.nrr("a").is_some());
    assert!(sigterm(&mut obs).success());
}

#[test]
fn observer_pages_through_more_records_than_one_list_holds_and_survives_an_expired_continue() {
    let w = World::new();
    w.api.install_crd();
    const N: usize = 1100; // three pages of 500
    let uids: Vec<String> = (0..N)
        .map(|i| w.api.add_node(&format!("n{i:04}")))
        .collect();
    let stale = [0, 600, N - 1];
    w.api.with(|s| {
        for (i, uid) in uids.iter().enumerate() {
            let owner = if stale.contains(&i) {
                format!("old-{i}")
            } else {
                uid.clone()
            };
            s.put_record(&format!("n{i:04}"), &owner, spec(&owner));
        }
    });
    // The second page's continue token has expired: the list starts over.
    w.api
        .fault_where("GET", NRR_PATH, Some("continue="), Action::Respond(410));
    let mut obs = w.cr_observer("observer.log", "10m");
    for i in stale {
        eventually(&format!("stale record {i} is deleted"), || {
            w.nrr(&format!("n{i:04}")).is_none()
        });
    }
    assert_eq!(
        w.api.with(|s| (0..N)
            .filter(|i| s.record(&format!("n{i:04}")).is_some())
            .count()),
        N - 3
    );
    let lists: Vec<_> = w
        .api
        .log()
        .into_iter()
        .filter(|l| l.method == "GET" && l.path == NRR_PATH)
        .collect();
    assert!(
        lists.iter().any(|l| l.status == 410)
            && lists
                .iter()
                .filter(|l| l.query.contains("continue="))
                .count()
                >= 2,
        "{lists:?}"
    );
    assert!(w
        .read_log("observer.log")
        .contains("listing again from the start"));
    assert!(sigterm(&mut obs).success());
}

#[test]
fn malformed_answers_to_the_records_list_or_apply_fail_naming_the_request_and_delete_nothing() {
    let w = World::with_applied_record();
    let before = w.nrr("node-a").unwrap();
    // A broken answer to the apply: the pass fails, naming it.
    for (body, code) in [
        ("not json at all", 200),
        ("{\"kind\": \"Status\"", 500),
        ("", 502),
    ] {
        w.api.fault(
            "PATCH",
            &format!("{NRR_PATH}/node-a"),
            Action::Raw(code, body),
        );
        let e = failed(w.cr_broker("node-a", "lldp.json").output().unwrap());
        assert!(e.contains("APPLY NodeRailRecord node-a"), "{body:?}: {e}");
    }
    assert_eq!(w.nrr("node-a").unwrap(), before);
    // A broken list answer: the observer is unready and deletes nothing, then recovers.
    w.api
        .with(|s| drop(s.put_record("gone", "u-gone", spec("u-gone"))));
    w.api
        .fault("GET", NRR_PATH, Action::Raw(200, "{\"items\": 7}"));
    let mut obs = w.cr_observer("observer.log", "1s");
    eventually("the broken list is reported", || {
        w.read_log("observer.log")
            .contains("reconciling NodeRailRecords: LIST NodeRailRecords")
    });
    eventually("the next resync deletes the stale record", || {
        w.nrr("gone").is_none()
    });
    assert!(w.nrr("node-a").is_some());
    assert!(sigterm(&mut obs).success());
}

// ---- issue 31: faults that lost records ---------------------------------------

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
    let w = World::new();
    w.owned_configmap(json!({"node-a": "previous"}));
    w.api.add_node("node-a");
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
    let mut c = w.nodefabric_as(&hung);
    c.args(["publish", "--sysfs-root"]).arg(&w.root);
    for (flag, dir) in [
        ("--features-dir", "f"),
        ("--cdi-dir", "cdi"),
        ("--state-dir", "s"),
    ] {
        c.arg(flag).arg(w.dir.join(dir));
    }
    c.args(["--interval", "1s", "--api-timeout", "1s", "--health-addr"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--lldp-json")
        .arg(w.dir.join("lldp.json"))
        .args([
            "--interface-regex",
            "^eth_r([0-9]+)_p[0-9]+$",
            "--rail-id",
            "rail$1",
            "--sysfs-paths",
            "--node-name",
            "node-a",
            "--rails-configmap",
            CM,
        ]);
    let mut publisher = c.stdout(Stdio::null()).stderr(log).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let failed_passes = || {
        w.read_log("publisher.log")
            .lines()
            .filter(|l| l.contains("publish pass failed") && l.contains("API timeout"))
            .count()
    };
    while failed_passes() < 3 {
        assert!(
            Instant::now() < deadline,
            "the passes stalled: {}",
            w.read_log("publisher.log")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
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
    let has = |w: &World, v: &str| {
        w.api
            .data(NS, CM)
            .and_then(|d| d.get("node-a").cloned())
            .as_deref()
            == Some(v)
    };
    eventually("the record is published", || {
        w.api.data(NS, CM).is_some_and(|d| d.contains_key("node-a"))
    });
    let published = w.data()["node-a"].clone();
    eventually("the publisher is ready", || {
        probe(port, "/readyz") == Some(200)
    });
    // The key edited by hand.
    w.api
        .with(|s| s.set_configmap_key(NS, CM, "node-a", "edited by hand"));
    eventually("the hand edit is overwritten", || has(&w, &published));
    // The ConfigMap deleted: the record cannot be written, and readiness says so.
    w.api.delete_configmap(NS, CM);
    eventually("the publisher is unready", || {
        probe(port, "/readyz") == Some(503)
    });
    // Created again, empty (as the observer does): the record comes back.
    w.owned_configmap(json!({}));
    eventually("the record is restored", || has(&w, &published));
    eventually("the publisher is ready again", || {
        probe(port, "/readyz") == Some(200)
    });
    // The Node re-created under a new UID; its old record removed (as the
    // observer does): the broker reads the new UID and writes it.
    let new_uid = w.api.add_node("node-a");
    w.owned_configmap(json!({}));
    eventually("the record carries the new UID", || {
        w.api.data(NS, CM).is_some_and(|d| d.contains_key("node-a"))
            && w.record_uid("node-a").as_deref() == Some(new_uid.as_str())
    });
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
    eventually("the record is applied", || w.nrr("node-a").is_some());
    let spec = w.nrr("node-a").unwrap()["spec"].clone();
    // Deleted (or gone with a re-installed CRD): applied again.
    w.api.delete_record("node-a");
    eventually("the record is applied again", || {
        w.nrr("node-a").is_some_and(|r| r["spec"] == spec)
    });
    // Its spec edited by hand: put back.
    assert!(
        w.api.with(|s| s.edit_record(
            "node-a",
            "kubectl-edit",
            json!({"spec": {"railSource": "interface-name"}})
        )) < 300
    );
    eventually("the hand edit is undone", || {
        w.nrr("node-a").is_some_and(|r| r["spec"] == spec)
    });
    // The Node re-created: the garbage collector takes the record, and the
    // broker applies it again owned by the new Node.
    let new_uid = w.api.add_node("node-a");
    w.api.with(|s| s.collect_garbage());
    eventually("the record is owned by the new Node", || {
        w.nrr("node-a").is_some_and(|r| {
            r["metadata"]["ownerReferences"][0]["uid"] == new_uid.as_str()
                && r["spec"]["nodeUID"] == new_uid.as_str()
        })
    });
    eventually("the publisher is ready", || {
        probe(port, "/readyz") == Some(200)
    });
    publisher.kill().unwrap();
    publisher.wait().unwrap();
}

#[test]
fn observer_cleanup_transient_error_is_retried_with_backoff_not_left_until_the_resync() {
    let w = World::new();
    let (a, b) = (w.api.add_node("a"), w.api.add_node("b"));
    w.owned_configmap(json!({"a": record(&a), "b": record(&b)}));
    let mut obs = w.synced_observer(); // resync: the 10m default
                                       // One plain 500 (not retried by the request policy) on the removal.
    w.api.fault("PATCH", CM_PATH, Action::Respond(500));
    w.api.delete_node("b");
    // Well before the resync: a hang guard, not a measurement.
    let deadline = Instant::now() + Duration::from_secs(45);
    while w.data().contains_key("b") {
        assert!(
            Instant::now() < deadline,
            "the record of deleted Node b is still there: {}",
            w.read_log("observer.log")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(w.data().contains_key("a"));
    assert!(
        patches(&w.api).iter().any(|p| p.status == 500),
        "the first removal failed"
    );
    assert!(sigterm(&mut obs).success());
}

#[test]
fn observer_is_unready_while_its_node_watch_keeps_failing() {
    let w = World::new();
    w.api.add_node("a");
    w.api.add_deployment(NS, OWNER);
    let port = free_port();
    let mut obs = w
        .observe()
        .args(["--health-addr", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    eventually("the observer is ready", || {
        probe(port, "/readyz") == Some(200)
    });
    for _ in 0..3 {
        w.api
            .fault_where("GET", "/api/v1/nodes", Some("watch="), Action::Respond(500));
    }
    w.api.drop_watches();
    eventually("the observer is unready", || {
        probe(port, "/readyz") == Some(503)
    });
    assert_eq!(probe(port, "/livez"), Some(200));
    // The watch works again: the next event shows it, and it is ready.
    w.api.touch_node("a");
    eventually("the observer is ready again", || {
        probe(port, "/readyz") == Some(200)
    });
    assert!(sigterm(&mut obs).success());
}

#[test]
fn node_names_that_are_not_dns_subdomains_are_a_usage_error_naming_the_flag_and_value() {
    let w = World::new();
    w.owned_configmap(json!({}));
    for bad in ["", "a/b", "n1/../n1", "Node-A", "a..b"] {
        let o = w.broker(bad, "lldp.json").output().unwrap();
        let e = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{bad:?}: {e}");
        assert!(
            e.contains("--node-name") && e.contains(&format!("{bad:?}")),
            "{bad:?}: {e}"
        );
        // From the environment, as the DaemonSet sets it.
        let mut c = w.broker("x", "lldp.json");
        let args: Vec<_> = c.get_args().map(|a| a.to_owned()).collect();
        let at = args.iter().position(|a| a == "--node-name").unwrap();
        let mut c2 = w.nodefabric_as(&w.broker_kubeconfig);
        c2.args(args[..at].iter().chain(&args[at + 2..]))
            .env("NODE_NAME", bad);
        c = c2;
        let o = c.output().unwrap();
        let e = String::from_utf8_lossy(&o.stderr);
        if bad.is_empty() {
            // An empty NODE_NAME is no name: publishing needs one.
            assert!(!o.status.success(), "{e}");
            continue;
        }
        assert_eq!(o.status.code(), Some(2), "NODE_NAME={bad:?}: {e}");
        assert!(
            e.contains("NODE_NAME") && e.contains(&format!("{bad:?}")),
            "NODE_NAME={bad:?}: {e}"
        );
    }
    assert!(
        w.api.log().is_empty(),
        "nothing reached the API: {:?}",
        w.api.log().iter().map(|l| &l.path).collect::<Vec<_>>()
    );
    assert!(w.data().is_empty());
}

#[test]
fn running_observer_that_loses_its_configmap_ownership_refuses_it_as_a_restart_would() {
    let w = World::new();
    let a = w.api.add_node("a");
    w.owned_configmap(json!({"a": record(&a)}));
    let mut obs = w
        .observe()
        .args(["--resync", "1s", "--log-level", "debug"])
        .stdout(Stdio::null())
        .stderr(fs::File::create(w.dir.join("observer.log")).unwrap())
        .spawn()
        .unwrap();
    eventually("the observer synced", || {
        w.read_log("observer.log")
            .contains("reconciling every record")
    });
    // Someone else's ConfigMap now, with a record whose Node is gone.
    w.api.put_configmap(
        NS,
        CM,
        json!({"data": {"a": record(&a), "gone": record("u-gone")}}),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = obs.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the observer carries on: {}",
            w.read_log("observer.log")
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success());
    let log = w.read_log("observer.log");
    assert!(
        log.contains("refusing to adopt") && log.contains("no controller ownerReference"),
        "{log}"
    );
    assert!(w.data().contains_key("gone"), "nothing was changed");
    // A restart says the same.
    let e = failed(w.observe().output().unwrap());
    assert!(e.contains("refusing to adopt"), "{e}");
}

#[test]
fn api_error_texts_name_each_cause_once_in_words_without_a_status_dump() {
    let w = World::new();
    w.owned_configmap(json!({"node-a": "previous"}));
    w.api.add_node("node-a");
    w.api.fault("PATCH", CM_PATH, Action::Respond(409));
    let e = failed(w.broker("node-a", "lldp.json").output().unwrap());
    assert!(!e.contains("Status {") && !e.contains("ApiError"), "{e}");
    assert!(e.contains("the API server refused: 409 Conflict"), "{e}");
    let line = e.lines().find(|l| l.contains("409")).unwrap();
    // Every cause once: no part of the line repeats the one before it.
    let parts: Vec<&str> = line.split(": ").collect();
    for pair in parts.windows(2) {
        assert_ne!(pair[0], pair[1], "{line}");
    }
    let msg = parts.last().unwrap();
    assert_eq!(line.matches(msg).count(), 1, "{line}");
    // The same for a refusal the broker names (403): the server's words once.
    w.api.fault("PATCH", CM_PATH, Action::Respond(403));
    let e = failed(w.broker("node-a", "lldp.json").output().unwrap());
    assert!(!e.contains("Status {") && !e.contains("ApiError"), "{e}");
    assert_eq!(w.data()["node-a"], "previous");
}
