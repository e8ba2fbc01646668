//! The cluster-wide rail record, end to end: the real `nodefabric` binary as
//! broker (`rails`/`publish` with --rails-configmap) and as Node Observer
//! (`observe`), against the in-test API server (tests/support/apiserver.rs)
//! over TLS with a bearer token. Seed 001's list: concurrent publication,
//! observer restart, ownership conflicts, Node-name reuse; plus the faults
//! a broker must survive without changing the ConfigMap. This file holds
//! the world every test starts from; the tests live by concern beside it.

#[path = "../support/mod.rs"]
mod support;

mod broker;
mod configmap_restore;
mod custom_resource;
mod gpu_exec;
mod kubectl;
mod observer;
mod publisher;

use apiserver::ApiServer;
use serde_json::{json, Value};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use support::cluster::{Cluster, NS, OWNER};
use support::{apiserver, fixtures, wait};

// The names deploy/ uses: the RBAC there grants exactly these.
const CM: &str = "nodefabric-rails";
const CM_PATH: &str = "/api/v1/namespaces/nodefabric/configmaps/nodefabric-rails";
/// How the fixture's ports map to rails (the LLDP tables name them all).
const RAIL_ARGS: [&str; 5] = [
    "--interface-regex",
    "^eth_r([0-9]+)_p[0-9]+$",
    "--rail-id",
    "rail$1",
    "--sysfs-paths",
];
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

    /// A world whose ConfigMap (the observer's) holds `data` and whose Node
    /// node-a exists: where the broker's tests start.
    fn holding(data: Value) -> World {
        let w = World::new();
        w.owned_configmap(data);
        w.api.add_node("node-a");
        w
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
        c.args(RAIL_ARGS).args(["--node-name", node]);
        c
    }

    /// `nodefabric publish` under the account of `kubeconfig`, its output
    /// folders named `<prefix>f`, `<prefix>cdi` and `<prefix>s`.
    fn publish_as(&self, kubeconfig: &Path, prefix: &str) -> Command {
        let mut c = self.nodefabric_as(kubeconfig);
        c.args(["publish", "--sysfs-root"]).arg(&self.root);
        for (flag, dir) in [
            ("--features-dir", "f"),
            ("--cdi-dir", "cdi"),
            ("--state-dir", "s"),
        ] {
            c.arg(flag).arg(self.dir.join(format!("{prefix}{dir}")));
        }
        c
    }

    /// The same as node `node`'s broker.
    fn broker(&self, node: &str, lldp: &str) -> Command {
        let mut c = self.rails(node, lldp);
        c.args(["--rails-configmap", &format!("{NS}/{CM}")]);
        c
    }

    /// `c` started at debug level, logging to `log` in the test's folder.
    fn spawn_logged(&self, c: &mut Command, log: &str) -> Child {
        let stderr = fs::File::create(self.dir.join(log)).unwrap();
        c.args(["--log-level", "debug"])
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap()
    }

    /// The ConfigMap observer, logging to `log`.
    fn observer(&self, log: &str) -> Child {
        self.spawn_logged(&mut self.observe(), log)
    }

    /// Waits until the observer logging to `log` is past its first
    /// reconciliation.
    fn synced(&self, log: &str) {
        self.await_log("the observer synced", log, "reconciling every record");
    }

    /// Waits until `log` holds `text` (`what`); gives the log.
    fn await_log(&self, what: &str, log: &str, text: &str) -> String {
        wait::until(what, || self.read_log(log), |l| l.contains(text))
    }

    /// The observer (logging to observer.log) once past its first
    /// reconciliation.
    fn synced_observer(&self) -> Child {
        let obs = self.observer("observer.log");
        self.synced("observer.log");
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
    fn cr_observe(&self, resync: &str) -> Command {
        let mut c = self.nodefabric_as(&self.observer_kubeconfig);
        c.args([
            "observe",
            "--rails-record",
            "custom-resource",
            "--resync",
            resync,
        ]);
        c
    }

    /// [`World::cr_observe`] started, logging to `log`.
    fn cr_observer(&self, log: &str, resync: &str) -> Child {
        self.spawn_logged(&mut self.cr_observe(resync), log)
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
        self.synced("observer.log");
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
    let mut c = w.publish_as(&w.broker_kubeconfig, prefix);
    c.args(["--interval", interval]);
    if let Some(port) = port {
        c.args(["--health-addr", &format!("127.0.0.1:{port}")]);
    }
    c.arg("--lldp-json").arg(w.dir.join("lldp.json"));
    c.args(RAIL_ARGS).args(["--node-name", node]);
    c.args(target);
    c.stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Where the NodeRailRecords live (`--rails-record custom-resource`).
const NRR_PATH: &str = "/apis/nodefabric.gpustack.ai/v1alpha1/noderailrecords";

/// A record spec as a broker of Node `uid` writes it (any valid one will do).
fn spec(uid: &str) -> Value {
    json!({"version": "rails.nodefabric.gpustack.ai/v1", "nodeUID": uid, "railSource": "host-lldp",
           "nics": {"0000:01:00.0": ["rail0"]}, "gpus": []})
}
