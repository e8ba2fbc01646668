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
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

#[path = "apiserver_configmaps.rs"]
mod configmaps;
#[path = "apiserver_dra.rs"]
pub mod dra;
#[path = "apiserver_exec.rs"]
pub mod exec;
#[path = "apiserver_records.rs"]
pub mod records;
#[path = "apiserver_shares.rs"]
mod shares;
#[path = "apiserver_watch.rs"]
mod watches;

use configmaps::{create_configmap, patch_configmap, validate};
use records::{records, Crd, Ownership};
use watches::watch;

/// NodeRailRecords' plural, API version and collection path.
pub const RECORDS: &str = "noderailrecords";
/// NodeRailRecords' apiVersion.
pub const RECORDS_API: &str = "nodefabric.gpustack.ai/v1alpha1";
/// The collection's path.
pub const RECORDS_PATH: &str = "/apis/nodefabric.gpustack.ai/v1alpha1/noderailrecords";

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
    /// Answer with this status code to every matching request until
    /// [`ApiServer::clear_faults`] removes it (an outage of unknown length,
    /// so a test need not guess how many reads happen meanwhile).
    Failing(u16),
}

/// Takes the fault at `at` for one request: a [`Action::Failing`] stays for
/// the next request, every other fault is used up.
fn take(faults: &mut Vec<Fault>, at: usize) -> Action {
    match faults[at].action {
        Action::Failing(code) => Action::Respond(code),
        _ => faults.remove(at).action,
    }
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
    /// The `DRAConsumableCapacity` gate is off: devices' sharing fields
    /// are dropped.
    pub(crate) capacity_gate_off: bool,
    /// The scripted exec answers and the execs served.
    pub exec: exec::Execs,
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

    /// The current resourceVersion, where a watch from now starts.
    pub fn resource_version(&self) -> String {
        self.rv.to_string()
    }
}

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

    /// Removes every fault left for `method` on `path` (ends an
    /// [`Action::Failing`] outage).
    pub fn clear_faults(&self, method: &str, path: &str) {
        let method: Method = method.parse().unwrap();
        self.with(|s| s.faults.retain(|f| f.method != method || f.path != path));
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
                    && matches!(f.action, Action::Respond(_) | Action::Failing(_))
                    && f.query.as_deref().is_some_and(|q| query.contains(q))
            });
            match at.map(|i| take(&mut s.faults, i)) {
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
        let injected = at.map(|i| take(&mut s.faults, i)).and_then(|a| match a {
            Action::Respond(code) | Action::Failing(code) => {
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
