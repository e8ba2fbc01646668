//! An in-test Kubernetes API server: exactly the part of the API nodefabric
//! uses, implemented the way kube-apiserver behaves, over TLS with a bearer
//! token, so the real binaries run against it unchanged (KUBECONFIG).
//!
//! - Nodes: GET, LIST (with `fieldSelector=metadata.name=…`), WATCH from a
//!   resourceVersion as a chunked stream of `{"type", "object"}` lines;
//!   `410 Gone` (an ERROR event) for a resourceVersion older than the
//!   retained history.
//! - ConfigMaps: GET, LIST and WATCH (with `fieldSelector=metadata.name=…`,
//!   which RBAC authorizes as a request on that name), POST (409 AlreadyExists), PATCH with
//!   `application/json-patch+json` (RFC 6902, `test` included: any failed
//!   operation is 422 Invalid and nothing applies) and
//!   `application/merge-patch+json` (RFC 7386, `null` removes); an empty
//!   `data` is not stored; keys must match `[-._a-zA-Z0-9]+`; keys and values
//!   together at most 1 MiB (422 with cause FieldValueTooLong); a no-op
//!   patch keeps the resourceVersion.
//! - Deployments: GET.
//! - DaemonSets, pods and the pod `exec` subresource (a websocket upgrade
//!   speaking the channel protocol): see [`exec`].
//! - `resource.k8s.io/v1` ResourceSlices and ResourceClaims: see [`dra`].
//! - `Accept: …;as=PartialObjectMetadata[List]` answers metadata only.
//! - Every error is a `Status` object with the real reason and code.
//!
//! - Authentication by bearer token: [`TOKEN`] may do anything; a token from
//!   [`ApiServer::account_token`] is a ServiceAccount whose requests are
//!   authorized by the RBAC in deploy/ (403 Forbidden otherwise).
//!
//! Tests add faults (an answer of their choosing, or a change made just
//! before a request is served), pause watch delivery, and read the request log.

#![allow(dead_code)] // each test binary uses a different part

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[path = "apiserver_dra.rs"]
pub mod dra;
#[path = "apiserver_exec.rs"]
pub mod exec;

/// The administrator's token: every request allowed.
pub const TOKEN: &str = "nodefabric-test-token";
/// The API server's ConfigMap size limit.
pub const LIMIT: usize = 1024 * 1024;

type Body = BoxBody<Bytes, Infallible>;

/// One request as served, for assertions.
#[derive(Debug, Clone)]
pub struct Logged {
    /// `GET`, `PATCH`, …
    pub method: String,
    /// The path without the query.
    pub path: String,
    /// The query string.
    pub query: String,
    /// The content type sent.
    pub content_type: String,
    /// The body sent.
    pub body: String,
    /// The status answered.
    pub status: u16,
}

/// What a fault does to the next matching request.
pub enum Action {
    /// Answer with this status code (a `Status` body), change nothing.
    Respond(u16),
    /// Answer with this status and this body, as given (a broken server or proxy).
    Raw(u16, &'static str),
    /// Never answer (a hung server).
    Hang,
    /// Change the state first (as another client would have), then serve.
    Before(Box<dyn FnOnce(&mut State) + Send>),
}

struct Fault {
    method: Method,
    path: String,
    /// Only a request whose query contains this (e.g. `continue=`).
    query: Option<String>,
    action: Action,
}

/// The stored objects and their history.
#[derive(Default)]
pub struct State {
    rv: u64,
    /// (resource, namespace, name) → object.
    objects: BTreeMap<(String, String, String), Value>,
    /// Watch history: (resourceVersion, resource, namespace, type, object).
    events: Vec<(u64, String, String, &'static str, Value)>,
    /// Events at or below this resourceVersion are gone (a compaction).
    compacted: u64,
    /// While set, watches deliver nothing after this resourceVersion.
    paused_at: Option<u64>,
    /// Bumped to end every open watch stream.
    watch_epoch: u64,
    faults: Vec<Fault>,
    log: Vec<Logged>,
    next_uid: u64,
    /// token → ServiceAccount (namespace, name).
    accounts: BTreeMap<String, (String, String)>,
    /// The NodeRailRecord CRD's schema, once installed: until then the
    /// resource is unknown (404 for every request), as on a real server.
    crd: Option<Arc<Crd>>,
    /// NodeRailRecord name → the field manager that last wrote its spec and
    /// the label keys each manager's apply set (server-side apply's field
    /// ownership, at the granularity nodefabric's objects need).
    owners: BTreeMap<String, Ownership>,
    /// Device attributes created ResourceSlices lose (a feature gate off).
    dropped_device_fields: Vec<String>,
    /// The `DRADeviceTaints` gate is off: devices' taints are dropped.
    pub(crate) taints_gate_off: bool,
    /// The scripted exec answers and the execs served.
    pub exec: exec::Execs,
}

/// Who owns which fields of one custom object.
#[derive(Default, Clone)]
struct Ownership {
    spec: String,
    labels: BTreeMap<String, Vec<String>>,
}

/// An installed CRD: the validator of its schema and the schema (for pruning).
pub struct Crd {
    validator: jsonschema::Validator,
    schema: Value,
}

impl State {
    fn bump(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    /// Records a watch event for an object of `resource` in `ns`.
    fn event(&mut self, rv: u64, resource: &str, ns: &str, kind: &'static str, obj: Value) {
        self.events
            .push((rv, resource.to_string(), ns.to_string(), kind, obj));
    }

    fn uid(&mut self) -> String {
        self.next_uid += 1;
        format!("00000000-0000-4000-8000-{:012x}", self.next_uid)
    }

    /// The ConfigMap's data, if it exists.
    pub fn configmap_data(&self, ns: &str, name: &str) -> Option<BTreeMap<String, String>> {
        let cm = self.objects.get(&key("configmaps", ns, name))?;
        Some(serde_json::from_value(cm.get("data").cloned().unwrap_or(json!({}))).unwrap())
    }

    /// Sets one data key of an existing ConfigMap, as another writer would.
    pub fn set_configmap_key(&mut self, ns: &str, name: &str, k: &str, v: &str) {
        let rv = self.bump();
        let cm = self
            .objects
            .get_mut(&key("configmaps", ns, name))
            .expect("ConfigMap exists");
        if cm.get("data").is_none() {
            cm["data"] = json!({});
        }
        cm["data"][k] = json!(v);
        cm["metadata"]["resourceVersion"] = json!(rv.to_string());
        let cm = cm.clone();
        self.event(rv, "configmaps", ns, "MODIFIED", cm);
    }

    /// The current resourceVersion, where a watch from now starts.
    pub fn resource_version(&self) -> String {
        self.rv.to_string()
    }

    /// A stored NodeRailRecord, whole.
    pub fn record(&self, name: &str) -> Option<&Value> {
        self.objects.get(&key(RECORDS, "", name))
    }

    /// Stores a NodeRailRecord as a broker's apply would (a test's setup or
    /// a benchmark's thousands), validated like one; returns its uid.
    pub fn put_record(&mut self, name: &str, node_uid: &str, spec: Value) -> String {
        let obj = json!({"apiVersion": RECORDS_API, "kind": "NodeRailRecord",
            "metadata": {"name": name, "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": node_uid}]},
            "spec": spec});
        let (code, out) = apply_record(
            self,
            name,
            "nodefabric",
            true,
            &serde_json::to_vec(&obj).unwrap(),
        );
        assert!(
            code < 300,
            "the test's NodeRailRecord is invalid ({code}): {out}"
        );
        out["metadata"]["uid"].as_str().unwrap().to_string()
    }

    /// Changes a NodeRailRecord's spec with a merge patch, as `kubectl edit` would.
    pub fn edit_record(&mut self, name: &str, manager: &str, patch: Value) -> u16 {
        let patch = serde_json::to_vec(&patch).unwrap();
        patch_record(self, name, manager, "application/merge-patch+json", &patch).0
    }

    /// What Kubernetes' garbage collector does for NodeRailRecords: deletes
    /// those whose Node owner no longer exists under that UID. Tests call it
    /// when they want a collector; by default there is none (it may be
    /// disabled or slow on a real cluster).
    pub fn collect_garbage(&mut self) -> Vec<String> {
        let node_uids: BTreeMap<String, String> = self
            .objects
            .iter()
            .filter(|((r, _, _), _)| r == "nodes")
            .map(|((_, _, n), o)| {
                (
                    n.clone(),
                    o["metadata"]["uid"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect();
        let doomed: Vec<String> = self
            .objects
            .iter()
            .filter(|((r, _, _), _)| r == RECORDS)
            .filter(|(_, o)| {
                o["metadata"]["ownerReferences"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|r| {
                        r["kind"] == "Node"
                            && node_uids
                                .get(r["name"].as_str().unwrap_or(""))
                                .map(String::as_str)
                                != r["uid"].as_str()
                    })
            })
            .map(|((_, _, n), _)| n.clone())
            .collect();
        for name in &doomed {
            let mut old = self.objects.remove(&key(RECORDS, "", name)).unwrap();
            self.owners.remove(name);
            let rv = self.bump();
            old["metadata"]["resourceVersion"] = json!(rv.to_string());
            self.event(rv, RECORDS, "", "DELETED", old);
        }
        doomed
    }
}

/// NodeRailRecords' plural, API version and collection path.
pub const RECORDS: &str = "noderailrecords";
/// NodeRailRecords' apiVersion.
pub const RECORDS_API: &str = "nodefabric.gpustack.ai/v1alpha1";
/// The collection's path.
pub const RECORDS_PATH: &str = "/apis/nodefabric.gpustack.ai/v1alpha1/noderailrecords";

fn key(resource: &str, ns: &str, name: &str) -> (String, String, String) {
    (resource.to_string(), ns.to_string(), name.to_string())
}

/// A running server; it lives until the test process ends.
pub struct ApiServer {
    /// The port on 127.0.0.1.
    pub port: u16,
    state: Arc<Mutex<State>>,
    rbac: Arc<super::apiserver_rbac::Rbac>,
    wake: tokio::sync::watch::Sender<u64>,
}

fn data(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(rel)
}

impl ApiServer {
    /// Starts a server on a thread of its own, under deploy/'s RBAC.
    pub fn start() -> ApiServer {
        ApiServer::start_with(super::apiserver_rbac::Rbac::from_deploy())
    }

    /// Starts a server on a thread of its own, under `rbac`.
    pub fn start_with(rbac: super::apiserver_rbac::Rbac) -> ApiServer {
        let certs = vec![CertificateDer::from_pem_file(data("tls/server.crt")).unwrap()];
        let key = PrivateKeyDer::from_pem_file(data("tls/server.key")).unwrap();
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(Mutex::new(State {
            rv: 100,
            ..Default::default()
        }));
        let (wake, _) = tokio::sync::watch::channel(0u64);
        let rbac = Arc::new(rbac);
        let server = ApiServer {
            port,
            state: state.clone(),
            rbac: rbac.clone(),
            wake: wake.clone(),
        };
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                loop {
                    let (tcp, _) = listener.accept().await.unwrap();
                    let (acceptor, state, wake, rbac) =
                        (acceptor.clone(), state.clone(), wake.clone(), rbac.clone());
                    tokio::spawn(async move {
                        let Ok(tls) = acceptor.accept(tcp).await else {
                            return;
                        };
                        let service = hyper::service::service_fn(move |req| {
                            let (state, wake, rbac) = (state.clone(), wake.clone(), rbac.clone());
                            async move { Ok::<_, Infallible>(serve(req, state, wake, rbac).await) }
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                            // An exec's connection is handed to its websocket.
                            .with_upgrades()
                            .await;
                    });
                }
            });
        });
        server
    }

    /// Adds DaemonSet `ns/name` selecting pods by `labels` (its
    /// `spec.selector.matchLabels`, as the GPU Operator's are).
    pub fn add_daemonset(&self, ns: &str, name: &str, labels: Value) {
        self.with(|s| {
            let uid = s.uid();
            let rv = s.bump();
            let ds = json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
                "metadata": {"name": name, "namespace": ns, "uid": uid, "resourceVersion": rv.to_string()},
                "spec": {"selector": {"matchLabels": labels},
                         "template": {"metadata": {"labels": labels}, "spec": {"containers": []}}}});
            s.objects.insert(key("daemonsets", ns, name), ds);
        });
    }

    /// Adds pod `ns/name` on `node` with `labels`, in `phase`, with these containers.
    pub fn add_pod(
        &self,
        ns: &str,
        name: &str,
        node: &str,
        labels: Value,
        phase: &str,
        containers: &[&str],
    ) {
        self.with(|s| {
            let uid = s.uid();
            let rv = s.bump();
            let containers: Vec<Value> = containers
                .iter()
                .map(|c| json!({"name": c, "image": "nvcr.io/nvidia/k8s-device-plugin"}))
                .collect();
            let pod = json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": ns, "uid": uid, "labels": labels, "resourceVersion": rv.to_string()},
                "spec": {"nodeName": node, "containers": containers},
                "status": {"phase": phase}});
            s.objects.insert(key("pods", ns, name), pod);
        });
    }

    /// Scripts what `command` (its words joined by spaces) answers in pod `ns/pod`.
    pub fn script_exec(&self, ns: &str, pod: &str, command: &str, reply: exec::Reply) {
        self.with(|s| {
            s.exec
                .replies
                .insert((ns.into(), pod.into(), command.into()), reply)
        });
    }

    /// Upgrades execs only to these subprotocols (default: v5 and v4).
    pub fn allow_exec_protocols(&self, protocols: &[&'static str]) {
        self.with(|s| s.exec.allowed = protocols.to_vec());
    }

    /// The execs upgraded so far.
    pub fn served_execs(&self) -> Vec<exec::Served> {
        self.with(|s| s.exec.served.clone())
    }

    /// Runs `f` on the state (under its lock), waking watches afterwards.
    pub fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let out = f(&mut self.state.lock().unwrap());
        self.wake.send_modify(|g| *g += 1);
        out
    }

    /// A token for ServiceAccount `namespace/name`, limited to what deploy/'s RBAC grants it.
    pub fn account_token(&self, namespace: &str, name: &str) -> String {
        let token = format!("sa-{namespace}-{name}");
        self.with(|s| {
            s.accounts
                .insert(token.clone(), (namespace.to_string(), name.to_string()))
        });
        token
    }

    /// Writes a kubeconfig for this server into `dir`, with `token` and a
    /// default namespace; returns its path.
    pub fn kubeconfig(&self, dir: &Path, token: &str, namespace: &str) -> PathBuf {
        let config = json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "test", "cluster": {"server": format!("https://127.0.0.1:{}", self.port), "certificate-authority": data("tls/ca.crt")}}],
            "users": [{"name": "test", "user": {"token": token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test", "namespace": namespace}}],
            "current-context": "test",
        });
        let path = dir.join(format!("kubeconfig-{token}"));
        std::fs::write(&path, serde_json::to_vec_pretty(&config).unwrap()).unwrap();
        path
    }

    /// Adds (or replaces, under a new UID) Node `name`; returns its UID.
    pub fn add_node(&self, name: &str) -> String {
        self.with(|s| {
            if let Some(old) = s.objects.remove(&key("nodes", "", name)) {
                let rv = s.bump();
                s.event(rv, "nodes", "", "DELETED", old);
            }
            let uid = s.uid();
            let rv = s.bump();
            let node = json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "uid": uid, "resourceVersion": rv.to_string(), "creationTimestamp": "2026-03-01T12:00:00Z",
                             "labels": {"kubernetes.io/hostname": name}},
                "status": {"conditions": [{"type": "Ready", "status": "True"}], "nodeInfo": {"kubeletVersion": "v1.33.0"}},
            });
            s.objects.insert(key("nodes", "", name), node.clone());
            s.event(rv, "nodes", "", "ADDED", node);
            uid
        })
    }

    /// Changes a label of Node `name` (a MODIFIED event, same UID).
    pub fn touch_node(&self, name: &str) {
        self.with(|s| {
            let rv = s.bump();
            let node = s
                .objects
                .get_mut(&key("nodes", "", name))
                .expect("Node exists");
            node["metadata"]["resourceVersion"] = json!(rv.to_string());
            node["metadata"]["labels"]["touched"] = json!(rv.to_string());
            let node = node.clone();
            s.event(rv, "nodes", "", "MODIFIED", node);
        })
    }

    /// Deletes Node `name`.
    pub fn delete_node(&self, name: &str) {
        self.with(|s| {
            let mut old = s
                .objects
                .remove(&key("nodes", "", name))
                .expect("Node exists");
            let rv = s.bump();
            old["metadata"]["resourceVersion"] = json!(rv.to_string());
            s.event(rv, "nodes", "", "DELETED", old);
        })
    }

    /// Deletes ConfigMap `ns/name`, as `kubectl delete` would.
    pub fn delete_configmap(&self, ns: &str, name: &str) {
        self.with(|s| {
            let mut old = s
                .objects
                .remove(&key("configmaps", ns, name))
                .expect("ConfigMap exists");
            let rv = s.bump();
            old["metadata"]["resourceVersion"] = json!(rv.to_string());
            s.event(rv, "configmaps", ns, "DELETED", old);
        })
    }

    /// Deletes NodeRailRecord `name`, as `kubectl delete` (or a CRD
    /// re-installed) would.
    pub fn delete_record(&self, name: &str) {
        self.with(|s| {
            let mut old = s
                .objects
                .remove(&key(RECORDS, "", name))
                .expect("NodeRailRecord exists");
            s.owners.remove(name);
            let rv = s.bump();
            old["metadata"]["resourceVersion"] = json!(rv.to_string());
            s.event(rv, RECORDS, "", "DELETED", old);
        })
    }

    /// Installs the NodeRailRecord CRD from deploy/crds/: from now on the
    /// server serves the resource and validates objects against its schema.
    pub fn install_crd(&self) {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/crds/noderailrecords.yaml");
        let crd: Value = serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone();
        let validator = jsonschema::validator_for(&schema).expect("the CRD's schema compiles");
        self.with(|s| s.crd = Some(Arc::new(Crd { validator, schema })));
    }

    /// Adds a Deployment; returns its UID.
    pub fn add_deployment(&self, ns: &str, name: &str) -> String {
        self.with(|s| {
            let uid = s.uid();
            let rv = s.bump();
            let d = json!({"apiVersion": "apps/v1", "kind": "Deployment",
                           "metadata": {"name": name, "namespace": ns, "uid": uid, "resourceVersion": rv.to_string()},
                           "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}}, "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": []}}}});
            s.objects.insert(key("deployments", ns, name), d);
            uid
        })
    }

    /// Stores a ConfigMap as given (someone else's, or one prepared by a test).
    /// It passes the same validation and takes the same stored shape as a POST.
    pub fn put_configmap(&self, ns: &str, name: &str, mut cm: Value) {
        if let Err((code, status)) = validate(&mut cm, name) {
            panic!("the test's ConfigMap is invalid ({code}): {status}");
        }
        self.with(|s| {
            let (uid, rv) = (s.uid(), s.bump());
            cm["apiVersion"] = json!("v1");
            cm["kind"] = json!("ConfigMap");
            cm["metadata"]["name"] = json!(name);
            cm["metadata"]["namespace"] = json!(ns);
            cm["metadata"]["uid"] = json!(uid);
            cm["metadata"]["resourceVersion"] = json!(rv.to_string());
            s.objects.insert(key("configmaps", ns, name), cm);
        })
    }

    /// A stored ConfigMap, whole.
    pub fn configmap(&self, ns: &str, name: &str) -> Option<Value> {
        self.with(|s| s.objects.get(&key("configmaps", ns, name)).cloned())
    }

    /// A stored ConfigMap's data (absent `data` is an empty map).
    pub fn data(&self, ns: &str, name: &str) -> Option<BTreeMap<String, String>> {
        self.with(|s| s.configmap_data(ns, name))
    }

    /// Answers the next `method` request on `path` with `action`.
    pub fn fault(&self, method: &str, path: &str, action: Action) {
        self.fault_where(method, path, None, action)
    }

    /// As [`ApiServer::fault`], for a request whose query contains `query`.
    pub fn fault_where(&self, method: &str, path: &str, query: Option<&str>, action: Action) {
        self.with(|s| {
            s.faults.push(Fault {
                method: method.parse().unwrap(),
                path: path.to_string(),
                query: query.map(str::to_string),
                action,
            })
        });
    }

    /// Holds back watch events from now on (they are still recorded).
    pub fn pause_watches(&self) {
        self.with(|s| s.paused_at = Some(s.rv));
    }

    /// Ends every open watch stream (as a restarting API server does); the
    /// clients watch again from their last resourceVersion.
    pub fn drop_watches(&self) {
        self.with(|s| s.watch_epoch += 1);
    }

    /// Delivers held-back watch events.
    pub fn resume_watches(&self) {
        self.with(|s| s.paused_at = None);
    }

    /// Forgets the watch history so far: a watch from an older resourceVersion gets 410 Gone.
    pub fn compact(&self) {
        self.with(|s| {
            s.compacted = s.rv;
            s.events.clear();
        });
    }

    /// The requests served so far.
    pub fn log(&self) -> Vec<Logged> {
        self.with(|s| s.log.clone())
    }
}

/// A `Status` answer, as the real server writes them.
fn status(code: u16, reason: &str, message: &str, details: Value) -> (u16, Value) {
    let mut s = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code});
    if !details.is_null() {
        s["details"] = details;
    }
    (code, s)
}

fn not_found(resource: &str, name: &str) -> (u16, Value) {
    status(
        404,
        "NotFound",
        &format!("{resource} \"{name}\" not found"),
        json!({"name": name, "kind": resource}),
    )
}

fn reply(code: u16, body: &Value) -> Response<Body> {
    // A bare string is a plain-text answer (an unknown path's 404).
    if let Value::String(text) = body {
        let mut r = Response::new(Full::new(Bytes::from(text.clone())).boxed());
        *r.status_mut() = StatusCode::from_u16(code).unwrap();
        r.headers_mut()
            .insert("content-type", "text/plain; charset=utf-8".parse().unwrap());
        return r;
    }
    let bytes = Bytes::from(serde_json::to_vec(body).unwrap());
    let mut r = Response::new(Full::new(bytes).boxed());
    *r.status_mut() = StatusCode::from_u16(code).unwrap();
    r.headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    r
}

fn query_param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == name).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8(out).unwrap()
}

/// Metadata only, when the client asked for it.
fn shape(obj: &Value, partial: bool) -> Value {
    if partial {
        json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": obj["metadata"]})
    } else {
        obj.clone()
    }
}

/// What RBAC sees of a request: verb, group, resource, namespace, name.
/// A list or watch narrowed by `fieldSelector=metadata.name=NAME` is
/// authorized as one on NAME, as kube-apiserver's RequestInfoFactory does
/// (so a rule with resourceNames may grant a single-object watch).
fn attributes(
    method: &Method,
    seg: &[&str],
    query: &str,
    watch: bool,
) -> Option<super::apiserver_rbac::Attributes> {
    use super::apiserver_rbac::Attributes;
    let selected = query_param(query, "fieldSelector").and_then(|f| {
        f.split(',')
            .find_map(|t| t.strip_prefix("metadata.name=").map(str::to_string))
            .filter(|n| !n.is_empty() && !n.contains('/'))
    });
    let selected = selected.as_deref();
    let verb = |named: bool| match (method.as_str(), named) {
        ("GET", true) => "get",
        ("GET", false) if watch => "watch",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PATCH", _) => "patch",
        ("PUT", _) => "update",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => "unknown",
    };
    Some(match seg {
        ["api", "v1", resource] => Attributes::new(verb(false), "", resource, None, selected),
        ["api", "v1", resource, name] => {
            Attributes::new(verb(true), "", resource, None, Some(name))
        }
        ["api", "v1", "namespaces", ns, resource] => {
            Attributes::new(verb(false), "", resource, Some(ns), selected)
        }
        ["api", "v1", "namespaces", ns, resource, name] => {
            Attributes::new(verb(true), "", resource, Some(ns), Some(name))
        }
        // A websocket exec is a GET, authorized as `create` on the
        // subresource (as Kubernetes 1.35 checks it).
        ["api", "v1", "namespaces", ns, "pods", name, "exec"] => {
            Attributes::new("create", "", "pods/exec", Some(ns), Some(name))
        }
        ["apis", group, _, resource] => Attributes::new(verb(false), group, resource, None, None),
        ["apis", group, _, resource, name] if *resource != "namespaces" => {
            Attributes::new(verb(true), group, resource, None, Some(name))
        }
        ["apis", group, _, "namespaces", ns, resource] => {
            Attributes::new(verb(false), group, resource, Some(ns), None)
        }
        ["apis", group, _, "namespaces", ns, resource, name] => {
            Attributes::new(verb(true), group, resource, Some(ns), Some(name))
        }
        _ => return None,
    })
}

fn forbidden(sa: &(String, String), a: &super::apiserver_rbac::Attributes) -> (u16, Value) {
    let user = format!("system:serviceaccount:{}:{}", sa.0, sa.1);
    let scope = a
        .namespace
        .as_ref()
        .map(|n| format!(" in the namespace \"{n}\""))
        .unwrap_or_else(|| " at the cluster scope".into());
    // A subresource is named by its object: `pods "x" is forbidden`.
    let object = a.resource.split('/').next().unwrap_or_default();
    let what = match &a.name {
        Some(n) => format!("{object} \"{n}\""),
        None => object.to_string(),
    };
    let msg = format!(
        "{what} is forbidden: User \"{user}\" cannot {} resource \"{}\" in API group \"{}\"{scope}",
        a.verb, a.resource, a.group
    );
    status(
        403,
        "Forbidden",
        &msg,
        json!({"name": a.name.clone().unwrap_or_default(), "kind": a.resource}),
    )
}

async fn serve(
    mut req: Request<Incoming>,
    state: Arc<Mutex<State>>,
    wake: tokio::sync::watch::Sender<u64>,
    rbac: Arc<super::apiserver_rbac::Rbac>,
) -> Response<Body> {
    // An exec is answered on the connection itself, once upgraded.
    let upgrade = req
        .uri()
        .path()
        .ends_with("/exec")
        .then(|| hyper::upgrade::on(&mut req));
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let header = |n: &str| {
        req.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let (auth, content_type, accept) = (
        header("authorization"),
        header("content-type"),
        header("accept"),
    );
    let (ws_upgrade, ws_key, ws_protocols) = (
        header("upgrade"),
        header("sec-websocket-key"),
        header("sec-websocket-protocol"),
    );
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let body_text = String::from_utf8_lossy(&body).into_owned();
    let partial = accept.contains("as=PartialObjectMetadata");

    let log = |s: &mut State, code: u16| {
        s.log.push(Logged {
            method: method.to_string(),
            path: path.clone(),
            query: query.clone(),
            content_type: content_type.clone(),
            body: body_text.clone(),
            status: code,
        })
    };
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let is_watch = matches!(query_param(&query, "watch").as_deref(), Some("true" | "1"));
    let token = auth.strip_prefix("Bearer ").unwrap_or_default();
    let account = state.lock().unwrap().accounts.get(token).cloned();
    if token != TOKEN && account.is_none() {
        let (code, b) = status(401, "Unauthorized", "Unauthorized", Value::Null);
        log(&mut state.lock().unwrap(), code);
        return reply(code, &b);
    }
    if let (Some(sa), Some(a)) = (&account, attributes(&method, &segments, &query, is_watch)) {
        if !rbac.allows((&sa.0, &sa.1), &a) {
            let (code, b) = forbidden(sa, &a);
            log(&mut state.lock().unwrap(), code);
            return reply(code, &b);
        }
    }
    if let (Some(on), "GET", ["api", "v1", "namespaces", _, "pods", _, "exec"]) =
        (upgrade, method.as_str(), segments.as_slice())
    {
        let mut s = state.lock().unwrap();
        let checked = exec::check(&s, &segments, &query, &ws_upgrade, &ws_protocols);
        return match checked {
            Err((code, body)) => {
                log(&mut s, code);
                match body {
                    Some(b) => reply(code, &b),
                    None => {
                        let mut r = Response::new(Full::new(Bytes::new()).boxed());
                        *r.status_mut() = StatusCode::from_u16(code).unwrap();
                        r
                    }
                }
            }
            Ok(asked) => {
                log(&mut s, 101);
                s.exec.served.push(exec::Served {
                    pod: format!("{}/{}", asked.ns, asked.pod),
                    container: asked.container.clone(),
                    command: asked.command.clone(),
                    protocol: asked.protocol.to_string(),
                });
                let mut r = Response::new(Full::new(Bytes::new()).boxed());
                *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
                let h = r.headers_mut();
                h.insert("upgrade", "websocket".parse().unwrap());
                h.insert("connection", "Upgrade".parse().unwrap());
                let accept =
                    tokio_tungstenite::tungstenite::handshake::derive_accept_key(ws_key.as_bytes());
                h.insert("sec-websocket-accept", accept.parse().unwrap());
                h.insert("sec-websocket-protocol", asked.protocol.parse().unwrap());
                tokio::spawn(exec::speak(on, asked));
                r
            }
        };
    }
    if method == Method::GET && is_watch {
        // A refusal injected for a watch request (`fault_where(…, "watch=", …)`):
        // the watch is refused before it starts, as an overloaded server does.
        let refused = {
            let mut s = state.lock().unwrap();
            let at = s.faults.iter().position(|f| {
                f.method == method
                    && f.path == path
                    && matches!(f.action, Action::Respond(_))
                    && f.query.as_deref().is_some_and(|q| query.contains(q))
            });
            match at.map(|i| s.faults.remove(i).action) {
                Some(Action::Respond(code)) => {
                    log(&mut s, code);
                    Some(status(
                        code,
                        "InternalError",
                        &format!("injected failure {code}"),
                        Value::Null,
                    ))
                }
                _ => None,
            }
        };
        if let Some((code, b)) = refused {
            return reply(code, &b);
        }
        let served = match segments.as_slice() {
            ["api", "v1", r] => Some((r.to_string(), String::new())),
            ["api", "v1", "namespaces", ns, r] => Some((r.to_string(), ns.to_string())),
            ["apis", "nodefabric.gpustack.ai", "v1alpha1", RECORDS]
                if state.lock().unwrap().crd.is_some() =>
            {
                Some((RECORDS.to_string(), String::new()))
            }
            _ => None,
        };
        if let Some((resource, ns)) = served {
            return watch(
                &state,
                wake,
                &query,
                partial,
                (&resource, &ns),
                |s, code| log(s, code),
            );
        }
    }

    let (code, answer) = {
        let mut s = state.lock().unwrap();
        // A fault for this request?
        let at = s.faults.iter().position(|f| {
            f.method == method
                && f.path == path
                && f.query.as_deref().is_none_or(|q| query.contains(q))
        });
        let injected = at.map(|i| s.faults.remove(i)).and_then(|f| match f.action {
            Action::Respond(code) => {
                let reason = match code {
                    403 => "Forbidden",
                    410 => "Expired",
                    _ => "InternalError",
                };
                Some(Err(Some(status(
                    code,
                    reason,
                    &format!("injected failure {code}"),
                    Value::Null,
                ))))
            }
            Action::Raw(code, body) => Some(Ok((code, body))),
            Action::Hang => Some(Err(None)),
            Action::Before(change) => {
                change(&mut s);
                None
            }
        });
        match injected {
            Some(Ok((code, raw))) => {
                log(&mut s, code);
                let mut r = Response::new(Full::new(Bytes::from_static(raw.as_bytes())).boxed());
                *r.status_mut() = StatusCode::from_u16(code).unwrap();
                r.headers_mut()
                    .insert("content-type", "application/json".parse().unwrap());
                return r;
            }
            Some(Err(None)) => {
                log(&mut s, 0);
                (0, Value::Null)
            }
            Some(Err(Some(out))) => {
                log(&mut s, out.0);
                out
            }
            None => {
                let out = route(
                    &mut s,
                    &method,
                    &segments,
                    &query,
                    &content_type,
                    &body,
                    partial,
                );
                log(&mut s, out.0);
                out
            }
        }
    };
    if code == 0 {
        return std::future::pending().await; // Action::Hang
    }
    wake.send_modify(|g| *g += 1);
    reply(code, &answer)
}

fn route(
    s: &mut State,
    method: &Method,
    seg: &[&str],
    query: &str,
    content_type: &str,
    body: &[u8],
    partial: bool,
) -> (u16, Value) {
    if let Some(answer) = exec::route(s, method.as_str(), seg, query) {
        return answer;
    }
    match (method.as_str(), seg) {
        ("GET", ["api", "v1", "nodes"]) => {
            let selector = query_param(query, "fieldSelector");
            let only = selector
                .as_deref()
                .and_then(|f| f.strip_prefix("metadata.name="));
            let items: Vec<Value> = s
                .objects
                .iter()
                .filter(|((r, _, name), _)| r == "nodes" && only.is_none_or(|o| o == name))
                .map(|(_, o)| shape(o, partial))
                .collect();
            let kind = if partial {
                "PartialObjectMetadataList"
            } else {
                "NodeList"
            };
            let api = if partial { "meta.k8s.io/v1" } else { "v1" };
            (
                200,
                json!({"apiVersion": api, "kind": kind, "metadata": {"resourceVersion": s.rv.to_string()}, "items": items}),
            )
        }
        ("GET", ["api", "v1", "nodes", name]) => match s.objects.get(&key("nodes", "", name)) {
            Some(n) => (200, shape(n, partial)),
            None => not_found("nodes", name),
        },
        ("GET", ["apis", "apps", "v1", "namespaces", ns, "deployments", name]) => {
            match s.objects.get(&key("deployments", ns, name)) {
                Some(d) => (200, shape(d, partial)),
                None => status(
                    404,
                    "NotFound",
                    &format!("deployments.apps \"{name}\" not found"),
                    json!({"name": name, "group": "apps", "kind": "deployments"}),
                ),
            }
        }
        ("GET", ["api", "v1", "namespaces", ns, "configmaps"]) => {
            let selector = query_param(query, "fieldSelector");
            let only = selector
                .as_deref()
                .and_then(|f| f.strip_prefix("metadata.name="));
            let items: Vec<Value> = s
                .objects
                .iter()
                .filter(|((r, n, name), _)| {
                    r == "configmaps" && n == ns && only.is_none_or(|o| o == name)
                })
                .map(|(_, o)| shape(o, partial))
                .collect();
            let (api, kind) = if partial {
                ("meta.k8s.io/v1", "PartialObjectMetadataList")
            } else {
                ("v1", "ConfigMapList")
            };
            (
                200,
                json!({"apiVersion": api, "kind": kind, "metadata": {"resourceVersion": s.rv.to_string()}, "items": items}),
            )
        }
        ("GET", ["api", "v1", "namespaces", ns, "configmaps", name]) => {
            match s.objects.get(&key("configmaps", ns, name)) {
                Some(c) => (200, shape(c, partial)),
                None => not_found("configmaps", name),
            }
        }
        ("POST", ["api", "v1", "namespaces", ns, "configmaps"]) => create_configmap(s, ns, body),
        ("PATCH", ["api", "v1", "namespaces", ns, "configmaps", name]) => {
            patch_configmap(s, ns, name, content_type, body)
        }
        (_, ["apis", "nodefabric.gpustack.ai", "v1alpha1", RECORDS, ..]) if s.crd.is_some() => {
            records(
                s,
                method.as_str(),
                &seg[4..],
                query,
                content_type,
                body,
                partial,
            )
        }
        // A group the server does not serve (the CRD not installed): its
        // NotFound handler answers any method in plain text, not a Status.
        (_, ["apis", "nodefabric.gpustack.ai", ..]) => {
            (404, Value::String("404 page not found\n".into()))
        }
        (m, ["apis", "resource.k8s.io", "v1", rest @ ..]) => dra::route(s, m, rest, query, body),
        (m, _) if !["GET", "POST", "PATCH"].contains(&m) => status(
            405,
            "MethodNotAllowed",
            &format!("{m} is not supported here"),
            Value::Null,
        ),
        _ => status(
            404,
            "NotFound",
            "the server could not find the requested resource",
            Value::Null,
        ),
    }
}

fn create_configmap(s: &mut State, ns: &str, body: &[u8]) -> (u16, Value) {
    let mut cm: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            return status(
                400,
                "BadRequest",
                &format!("the body is not JSON: {e}"),
                Value::Null,
            )
        }
    };
    let Some(name) = cm["metadata"]["name"].as_str().map(str::to_string) else {
        return status(422, "Invalid", "ConfigMap \"\" is invalid: metadata.name: Required value: name or generateName is required", Value::Null);
    };
    if s.objects.contains_key(&key("configmaps", ns, &name)) {
        return status(
            409,
            "AlreadyExists",
            &format!("configmaps \"{name}\" already exists"),
            json!({"name": name, "kind": "configmaps"}),
        );
    }
    if let Err(e) = validate(&mut cm, &name) {
        return e;
    }
    let (uid, rv) = (s.uid(), s.bump());
    cm["metadata"]["namespace"] = json!(ns);
    cm["metadata"]["uid"] = json!(uid);
    cm["metadata"]["resourceVersion"] = json!(rv.to_string());
    cm["metadata"]["creationTimestamp"] = json!("2026-03-01T12:00:00Z");
    s.objects.insert(key("configmaps", ns, &name), cm.clone());
    s.event(rv, "configmaps", ns, "ADDED", cm.clone());
    (201, cm)
}

fn patch_configmap(
    s: &mut State,
    ns: &str,
    name: &str,
    content_type: &str,
    body: &[u8],
) -> (u16, Value) {
    let Some(current) = s.objects.get(&key("configmaps", ns, name)).cloned() else {
        return not_found("configmaps", name);
    };
    let mut next = current.clone();
    let invalid = |detail: String| {
        status(
            422,
            "Invalid",
            &format!("ConfigMap \"{name}\" is invalid: patch: Invalid value: {detail}"),
            json!({"name": name, "kind": "ConfigMap"}),
        )
    };
    match content_type.split(';').next().unwrap_or("") {
        "application/json-patch+json" => {
            let patch: json_patch::Patch = match serde_json::from_slice(body) {
                Ok(p) => p,
                Err(e) => return status(400, "BadRequest", &format!("the patch is not a JSON Patch: {e}"), Value::Null),
            };
            if let Err(e) = json_patch::patch(&mut next, &patch) {
                return invalid(format!("{:?}: {e}", String::from_utf8_lossy(body)));
            }
        }
        "application/merge-patch+json" => {
            let patch: Value = match serde_json::from_slice(body) {
                Ok(p) => p,
                Err(e) => return status(400, "BadRequest", &format!("the patch is not JSON: {e}"), Value::Null),
            };
            if let Some(want) = patch.pointer("/metadata/resourceVersion").and_then(Value::as_str) {
                if Some(want) != current["metadata"]["resourceVersion"].as_str() {
                    return status(409, "Conflict", &format!("Operation cannot be fulfilled on configmaps \"{name}\": the object has been modified; please apply your changes to the latest version and try again"), json!({"name": name, "kind": "configmaps"}));
                }
            }
            json_patch::merge(&mut next, &patch);
        }
        other => return status(415, "UnsupportedMediaType", &format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (got {other:?})"), Value::Null),
    }
    if next["metadata"]["name"] != current["metadata"]["name"]
        || next["metadata"]["uid"] != current["metadata"]["uid"]
    {
        return invalid("metadata.name and metadata.uid cannot change".into());
    }
    if let Err(e) = validate(&mut next, name) {
        return e;
    }
    // The stored object's resourceVersion moves only when something changed.
    next["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
    if next != current {
        let rv = s.bump();
        next["metadata"]["resourceVersion"] = json!(rv.to_string());
        s.objects.insert(key("configmaps", ns, name), next.clone());
        s.event(rv, "configmaps", ns, "MODIFIED", next.clone());
    }
    (200, next)
}

/// The ConfigMap validation the real server applies, and its storage shape.
fn validate(cm: &mut Value, name: &str) -> Result<(), (u16, Value)> {
    let mut size = 0;
    for field in ["data", "binaryData"] {
        match cm.get(field) {
            None | Some(Value::Null) => {}
            Some(Value::Object(m)) => {
                for (k, v) in m {
                    let Some(v) = v.as_str() else {
                        return Err(status(400, "BadRequest", &format!("json: cannot unmarshal {v} into Go struct field ConfigMap.{field} of type string"), Value::Null));
                    };
                    if k.is_empty()
                        || k.len() > 253
                        || !k
                            .bytes()
                            .all(|c| c.is_ascii_alphanumeric() || b"-._".contains(&c))
                    {
                        let msg = format!("ConfigMap \"{name}\" is invalid: {field}[{k}]: Invalid value: \"{k}\": a valid config key must consist of alphanumeric characters, '-', '_' or '.'");
                        return Err(status(
                            422,
                            "Invalid",
                            &msg,
                            json!({"name": name, "kind": "ConfigMap", "causes": [{"reason": "FieldValueInvalid", "message": msg, "field": format!("{field}[{k}]")}]}),
                        ));
                    }
                    size += k.len() + v.len();
                }
            }
            Some(other) => {
                return Err(status(
                    400,
                    "BadRequest",
                    &format!(
                        "json: cannot unmarshal {other} into Go struct field ConfigMap.{field}"
                    ),
                    Value::Null,
                ))
            }
        }
    }
    if size > LIMIT {
        let msg = format!("Too long: may not be more than {LIMIT} bytes");
        return Err(status(
            422,
            "Invalid",
            &format!("ConfigMap \"{name}\" is invalid: []: {msg}"),
            json!({"name": name, "kind": "ConfigMap", "causes": [{"reason": "FieldValueTooLong", "message": msg, "field": "[]"}]}),
        ));
    }
    // An empty map is not stored (Go's omitempty).
    for field in ["data", "binaryData"] {
        if cm
            .get(field)
            .is_some_and(|v| v.is_null() || v.as_object().is_some_and(|m| m.is_empty()))
        {
            cm.as_object_mut().unwrap().remove(field);
        }
    }
    Ok(())
}

/// A watch of one collection (`resource` in namespace `ns`, "" for
/// cluster-scoped; `fieldSelector=metadata.name=…` narrows it to one
/// object): every event after the given resourceVersion, as they come.
fn watch(
    state: &Arc<Mutex<State>>,
    wake: tokio::sync::watch::Sender<u64>,
    query: &str,
    partial: bool,
    (resource, ns): (&str, &str),
    log: impl Fn(&mut State, u16),
) -> Response<Body> {
    let (resource, ns) = (resource.to_string(), ns.to_string());
    let only = query_param(query, "fieldSelector")
        .and_then(|f| f.strip_prefix("metadata.name=").map(str::to_string));
    let from: u64 = query_param(query, "resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let timeout = query_param(query, "timeoutSeconds")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1800u64);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(64);
    {
        let mut s = state.lock().unwrap();
        log(&mut s, 200);
        if from < s.compacted {
            let (_, gone) = status(
                410,
                "Expired",
                &format!("too old resource version: {from} ({})", s.compacted),
                Value::Null,
            );
            let line = format!("{}\n", json!({"type": "ERROR", "object": gone}));
            let _ = tx.try_send(Ok(Frame::data(Bytes::from(line))));
            drop(tx);
            return stream_reply(rx);
        }
    }
    let epoch = state.lock().unwrap().watch_epoch;
    let state = state.clone();
    let mut woken = wake.subscribe();
    tokio::spawn(async move {
        let mut last = from;
        let deadline = tokio::time::sleep(Duration::from_secs(timeout));
        tokio::pin!(deadline);
        loop {
            let lines: Vec<(u64, String)> = {
                let s = state.lock().unwrap();
                if s.watch_epoch != epoch {
                    return; // dropped: the stream ends, the client watches again
                }
                let horizon = s.paused_at.unwrap_or(u64::MAX);
                s.events
                    .iter()
                    .filter(|(rv, r, n, _, o)| {
                        *rv > last
                            && *rv <= horizon
                            && *r == resource
                            && *n == ns
                            && only
                                .as_deref()
                                .is_none_or(|name| o["metadata"]["name"] == name)
                    })
                    .map(|(rv, _, _, t, o)| {
                        (
                            *rv,
                            format!("{}\n", json!({"type": t, "object": shape(o, partial)})),
                        )
                    })
                    .collect()
            };
            for (rv, line) in lines {
                if tx.send(Ok(Frame::data(Bytes::from(line)))).await.is_err() {
                    return;
                }
                last = rv;
            }
            tokio::select! {
                r = woken.changed() => if r.is_err() { return },
                _ = &mut deadline => return,
                _ = tx.closed() => return,
            }
        }
    });
    stream_reply(rx)
}

fn stream_reply(
    rx: tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, Infallible>>,
) -> Response<Body> {
    let body = StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    let mut r = Response::new(BodyExt::boxed(body));
    r.headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    r
}

/// The NodeRailRecord endpoints (the CRD installed): list (paged, by name),
/// get, server-side apply, merge patch, and delete with preconditions.
fn records(
    s: &mut State,
    method: &str,
    rest: &[&str],
    query: &str,
    content_type: &str,
    body: &[u8],
    partial: bool,
) -> (u16, Value) {
    match (method, rest) {
        ("GET", []) => list_records(s, query, partial),
        ("GET", [name]) => match s.record(name) {
            Some(o) => (200, shape(o, partial)),
            None => record_not_found(name),
        },
        ("PATCH", [name]) if content_type.starts_with("application/apply-patch+yaml") => {
            let Some(manager) = query_param(query, "fieldManager").filter(|m| !m.is_empty()) else {
                return status(422, "Invalid", "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch", Value::Null);
            };
            let force = query_param(query, "force").as_deref() == Some("true");
            apply_record(s, name, &manager, force, body)
        }
        ("PATCH", [name]) => {
            let manager = query_param(query, "fieldManager").unwrap_or_else(|| "unknown".into());
            patch_record(s, name, &manager, content_type, body)
        }
        ("DELETE", [name]) => delete_record(s, name, body),
        _ => status(
            405,
            "MethodNotAllowed",
            &format!("{method} is not supported here"),
            Value::Null,
        ),
    }
}

fn record_not_found(name: &str) -> (u16, Value) {
    status(
        404,
        "NotFound",
        &format!("noderailrecords.nodefabric.gpustack.ai \"{name}\" not found"),
        json!({"name": name, "group": "nodefabric.gpustack.ai", "kind": RECORDS}),
    )
}

/// A page of records in name order; `continue` is the last name served.
fn list_records(s: &State, query: &str, partial: bool) -> (u16, Value) {
    let only =
        query_param(query, "fieldSelector").map(|f| match f.strip_prefix("metadata.name=") {
            Some(n) => Ok(n.to_string()),
            None => Err(f),
        });
    let only = match only {
        Some(Err(f)) => {
            return status(
                400,
                "BadRequest",
                &format!("field label not supported: {f}"),
                Value::Null,
            )
        }
        Some(Ok(n)) => Some(n),
        None => None,
    };
    let limit: usize = query_param(query, "limit")
        .and_then(|l| l.parse().ok())
        .filter(|l| *l > 0)
        .unwrap_or(usize::MAX);
    let after = query_param(query, "continue").filter(|c| !c.is_empty());
    let mut items = Vec::new();
    let mut more = None;
    for ((r, _, name), o) in s
        .objects
        .range(key(RECORDS, "", after.as_deref().unwrap_or(""))..)
    {
        if r != RECORDS {
            break;
        }
        if after.as_deref() == Some(name.as_str()) || only.as_ref().is_some_and(|n| n != name) {
            continue;
        }
        if items.len() == limit {
            more = items
                .last()
                .map(|i: &Value| i["metadata"]["name"].as_str().unwrap().to_string());
            break;
        }
        items.push(shape(o, partial));
    }
    let (api, kind) = if partial {
        ("meta.k8s.io/v1", "PartialObjectMetadataList")
    } else {
        (RECORDS_API, "NodeRailRecordList")
    };
    let mut meta = json!({"resourceVersion": s.rv.to_string()});
    if let Some(c) = more {
        meta["continue"] = json!(c);
    }
    (
        200,
        json!({"apiVersion": api, "kind": kind, "metadata": meta, "items": items}),
    )
}

/// Drops what the schema does not declare, as the API server prunes a
/// structural schema's unknown fields.
fn prune(v: &mut Value, schema: &Value) {
    match v {
        Value::Object(m) => {
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                m.retain(|k, _| props.contains_key(k));
                for (k, child) in m.iter_mut() {
                    prune(child, &props[k]);
                }
            } else if let Some(inner) = schema.get("additionalProperties") {
                for child in m.values_mut() {
                    prune(child, inner);
                }
            }
        }
        Value::Array(items) => {
            if let Some(inner) = schema.get("items") {
                for child in items {
                    prune(child, inner);
                }
            }
        }
        _ => {}
    }
}

/// The checks the API server makes on every NodeRailRecord it stores: the
/// kind, the name, ownerReferences' required fields, and the CRD schema.
fn check_record(s: &State, name: &str, obj: &mut Value) -> Result<(), (u16, Value)> {
    let invalid = |field: &str, msg: String| {
        let full =
            format!("NodeRailRecord.nodefabric.gpustack.ai \"{name}\" is invalid: {field}: {msg}");
        status(
            422,
            "Invalid",
            &full,
            json!({"name": name, "group": "nodefabric.gpustack.ai", "kind": "NodeRailRecord", "causes": [{"reason": "FieldValueInvalid", "message": msg, "field": field}]}),
        )
    };
    if obj["apiVersion"] != RECORDS_API || obj["kind"] != "NodeRailRecord" {
        return Err(status(
            400,
            "BadRequest",
            &format!(
                "the object's apiVersion/kind {}/{} is not {RECORDS_API}/NodeRailRecord",
                obj["apiVersion"], obj["kind"]
            ),
            Value::Null,
        ));
    }
    if obj["metadata"]["name"] != name {
        return Err(status(
            400,
            "BadRequest",
            "the name of the object does not match the name on the URL",
            Value::Null,
        ));
    }
    for (i, r) in obj["metadata"]["ownerReferences"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        for f in ["apiVersion", "kind", "name", "uid"] {
            if r[f].as_str().is_none_or(str::is_empty) {
                return Err(invalid(
                    &format!("metadata.ownerReferences[{i}].{f}"),
                    "Invalid value: \"\": must not be empty".into(),
                ));
            }
        }
    }
    let crd = s.crd.clone().unwrap();
    let mut pruned = obj.clone();
    prune(&mut pruned, &crd.schema);
    // metadata is the API server's, not the schema's: keep it whole.
    pruned["metadata"] = obj["metadata"].clone();
    pruned["apiVersion"] = obj["apiVersion"].clone();
    pruned["kind"] = obj["kind"].clone();
    if let Some(e) = crd.validator.iter_errors(&pruned).next() {
        return Err(invalid(&e.instance_path().to_string(), format!("{e}")));
    }
    *obj = pruned;
    Ok(())
}

/// Stores `next` for `name` if it differs from what is stored (the
/// resourceVersion moves only on a change); records the event.
fn store_record(s: &mut State, name: &str, mut next: Value, created: bool) -> (u16, Value) {
    let current = s.record(name).cloned();
    if let Some(c) = &current {
        next["metadata"]["resourceVersion"] = c["metadata"]["resourceVersion"].clone();
        if *c == next {
            return (200, next);
        }
    }
    let rv = s.bump();
    next["metadata"]["resourceVersion"] = json!(rv.to_string());
    s.objects.insert(key(RECORDS, "", name), next.clone());
    s.event(
        rv,
        RECORDS,
        "",
        if created { "ADDED" } else { "MODIFIED" },
        next.clone(),
    );
    (if created { 201 } else { 200 }, next)
}

/// Server-side apply: creates the object when absent; otherwise the
/// manager's applied fields replace those it owned. A spec another manager
/// wrote last is a conflict (409) unless forced.
fn apply_record(
    s: &mut State,
    name: &str,
    manager: &str,
    force: bool,
    body: &[u8],
) -> (u16, Value) {
    let text = String::from_utf8_lossy(body);
    let mut applied: Value = match serde_saphyr::from_str(&text) {
        Ok(v) => v,
        Err(e) => {
            return status(
                400,
                "BadRequest",
                &format!("error decoding YAML: {e}"),
                Value::Null,
            )
        }
    };
    if let Err(e) = check_record(s, name, &mut applied) {
        return e;
    }
    let current = s.record(name).cloned();
    let mut own = s.owners.get(name).cloned().unwrap_or_default();
    let mut next = match current {
        None => {
            let (uid, ts) = (s.uid(), "2026-03-01T12:00:00Z");
            let mut o = applied.clone();
            o["metadata"]["uid"] = json!(uid);
            o["metadata"]["creationTimestamp"] = json!(ts);
            o
        }
        Some(c) => {
            if !force
                && !own.spec.is_empty()
                && own.spec != manager
                && applied.get("spec").is_some()
                && applied["spec"] != c["spec"]
            {
                let msg = format!(
                    "Apply failed with 1 conflict: conflict with \"{}\": .spec",
                    own.spec
                );
                return status(
                    409,
                    "Conflict",
                    &msg,
                    json!({"name": name, "group": "nodefabric.gpustack.ai", "kind": RECORDS, "causes": [{"reason": "FieldManagerConflict", "message": format!("conflict with \"{}\"", own.spec), "field": ".spec"}]}),
                );
            }
            let mut o = c.clone();
            if let Some(spec) = applied.get("spec") {
                let atomic = s.crd.as_ref().unwrap().schema["properties"]["spec"]
                    ["x-kubernetes-map-type"]
                    == "atomic";
                if atomic {
                    // The applier owns the whole spec: it replaces it.
                    o["spec"] = spec.clone();
                } else {
                    // A granular spec: keys other managers set stay theirs.
                    json_patch::merge(&mut o["spec"], spec);
                }
            }
            // Labels: this manager's earlier keys go, its applied keys are set, others' stay.
            let mut labels = c["metadata"]["labels"]
                .as_object()
                .cloned()
                .unwrap_or_default();
            for k in own.labels.get(manager).into_iter().flatten() {
                labels.remove(k);
            }
            for (k, v) in applied["metadata"]["labels"]
                .as_object()
                .into_iter()
                .flatten()
            {
                labels.insert(k.clone(), v.clone());
            }
            o["metadata"]["labels"] = Value::Object(labels);
            o["metadata"]["ownerReferences"] = applied["metadata"]["ownerReferences"].clone();
            o
        }
    };
    if next["metadata"]["ownerReferences"].is_null() {
        next["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("ownerReferences");
    }
    own.spec = manager.to_string();
    own.labels.insert(
        manager.to_string(),
        applied["metadata"]["labels"]
            .as_object()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default(),
    );
    let created = s.record(name).is_none();
    next["metadata"]["managedFields"] = managed_fields(&own, &next);
    s.owners.insert(name.to_string(), own);
    store_record(s, name, next, created)
}

/// `metadata.managedFields` as the server records them (FieldsV1), at the
/// granularity the stand-in tracks: each applier's labels and owner
/// references, and the spec under its last writer.
fn managed_fields(own: &Ownership, obj: &Value) -> Value {
    let mut entries = Vec::new();
    let refs: serde_json::Map<String, Value> = obj["metadata"]["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            (
                format!("k:{{\"uid\":\"{}\"}}", r["uid"].as_str().unwrap_or("")),
                json!({}),
            )
        })
        .collect();
    for (manager, labels) in &own.labels {
        let labels: serde_json::Map<String, Value> = labels
            .iter()
            .map(|k| (format!("f:{k}"), json!({})))
            .collect();
        let mut fields = json!({"f:metadata": {"f:labels": labels, "f:ownerReferences": refs}});
        if own.spec == *manager {
            fields["f:spec"] = json!({});
        }
        entries.push(json!({"manager": manager, "operation": "Apply", "apiVersion": RECORDS_API, "time": "2026-03-01T12:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": fields}));
    }
    if !own.spec.is_empty() && !own.labels.contains_key(&own.spec) {
        entries.push(json!({"manager": own.spec, "operation": "Update", "apiVersion": RECORDS_API, "time": "2026-03-01T12:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}));
    }
    Value::Array(entries)
}

/// A merge patch (as `kubectl edit` sends), making `manager` the spec's owner.
fn patch_record(
    s: &mut State,
    name: &str,
    manager: &str,
    content_type: &str,
    body: &[u8],
) -> (u16, Value) {
    let Some(current) = s.record(name).cloned() else {
        return record_not_found(name);
    };
    if !content_type.starts_with("application/merge-patch+json") {
        return status(415, "UnsupportedMediaType", &format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (got {content_type:?})"), Value::Null);
    }
    let patch: Value = match serde_json::from_slice(body) {
        Ok(p) => p,
        Err(e) => {
            return status(
                400,
                "BadRequest",
                &format!("the patch is not JSON: {e}"),
                Value::Null,
            )
        }
    };
    let mut next = current.clone();
    json_patch::merge(&mut next, &patch);
    if let Err(e) = check_record(s, name, &mut next) {
        return e;
    }
    if next["spec"] != current["spec"] {
        s.owners.entry(name.to_string()).or_default().spec = manager.to_string();
    }
    next["metadata"]["managedFields"] =
        managed_fields(&s.owners.get(name).cloned().unwrap_or_default(), &next);
    store_record(s, name, next, false)
}

/// Delete, honouring `preconditions.uid` and `.resourceVersion` (409 Conflict
/// when either differs, nothing deleted); answers the object as it was.
fn delete_record(s: &mut State, name: &str, body: &[u8]) -> (u16, Value) {
    let Some(current) = s.record(name).cloned() else {
        return record_not_found(name);
    };
    let options: Value = if body.is_empty() {
        json!({})
    } else {
        match serde_json::from_slice(body) {
            Ok(v) => v,
            Err(e) => {
                return status(
                    400,
                    "BadRequest",
                    &format!("the DeleteOptions are not JSON: {e}"),
                    Value::Null,
                )
            }
        }
    };
    let conflict = |what: &str, want: &Value, have: &Value| {
        status(409, "Conflict", &format!("Operation cannot be fulfilled on noderailrecords.nodefabric.gpustack.ai \"{name}\": Precondition failed: {what} in precondition: {}, {what} in object meta: {}", want.as_str().unwrap_or(""), have.as_str().unwrap_or("")), json!({"name": name, "group": "nodefabric.gpustack.ai", "kind": RECORDS}))
    };
    let pre = &options["preconditions"];
    if !pre["uid"].is_null() && pre["uid"] != current["metadata"]["uid"] {
        return conflict("UID", &pre["uid"], &current["metadata"]["uid"]);
    }
    if !pre["resourceVersion"].is_null()
        && pre["resourceVersion"] != current["metadata"]["resourceVersion"]
    {
        return conflict(
            "ResourceVersion",
            &pre["resourceVersion"],
            &current["metadata"]["resourceVersion"],
        );
    }
    s.objects.remove(&key(RECORDS, "", name));
    s.owners.remove(name);
    let rv = s.bump();
    let mut old = current;
    old["metadata"]["resourceVersion"] = json!(rv.to_string());
    s.event(rv, RECORDS, "", "DELETED", old.clone());
    (200, old)
}
