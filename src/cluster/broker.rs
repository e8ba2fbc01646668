//! The broker: what every node's `nodefabric rails`/`publish` writes to the
//! cluster, its key of the shared ConfigMap or (with `--rails-record
//! custom-resource`) its own NodeRailRecord, and the Node UID the record
//! carries.
//!
//! A JSON merge patch `{"data": {"NODE": record}}` (`null` to remove) touches
//! only that key, so brokers of many nodes patch at once without reading and
//! rewriting the object. A JSON Patch would not do: `add /data/NODE` is
//! refused (422) while the ConfigMap has no `data` yet, and `remove` of an
//! absent key is refused too; a merge patch has neither problem.
//!
//! [`Broker`] is the synchronous face the publisher calls every pass. A
//! write is skipped only when the server still holds exactly what would be
//! written: a pass that would send again what this process published reads
//! its own record back first (the ConfigMap's
//! metadata, and its data only when the ConfigMap changed since the record
//! was last seen there; or its own NodeRailRecord), so a record deleted, a
//! ConfigMap re-created, a key edited by hand or a CRD re-installed is put
//! right within an interval ([`Memo`] keeps what was last confirmed).

use super::error::status_message;
use super::node_rail_record::{self, GROUP};
use super::{client, code, ClusterError, ConfigMapRef, CONFIGMAP_LIMIT, FIELD_MANAGER};
use crate::rails::RailRecord;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;
use std::time::{Duration, Instant};

/// Who this node is, and how to reach the API server.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// The Node's UID as given; empty: read from Node `node_name` when a
    /// cluster is configured.
    pub node_uid: String,
    /// This node's name: its key in the shared ConfigMap, its
    /// NodeRailRecord's name, and the Node whose UID the record carries.
    pub node_name: Option<String>,
    /// The API client's settings.
    pub client: client::Settings,
}

/// Where a broker publishes its record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Its key of this ConfigMap.
    ConfigMap(ConfigMapRef),
    /// Its own NodeRailRecord, named after the node (the name given).
    CustomResource(String),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::ConfigMap(cm) => write!(f, "key of ConfigMap {cm}"),
            Target::CustomResource(node) => write!(f, "NodeRailRecord {node}"),
        }
    }
}

/// How long an interval publisher trusts the Node UID it read: within it,
/// the Node is not read again unless the record it published went missing
/// or changed on the server (the Node may have been re-created with it); after
/// it, it is. At 10,000 nodes and a 60s interval this saves about 160 API
/// requests a second.
pub const REFRESH: Duration = Duration::from_secs(600);

/// The interval publisher's memory between passes (a one-shot run has one
/// pass); clones share it.
#[derive(Debug, Clone, Default)]
pub struct Memo(std::sync::Arc<std::sync::Mutex<MemoState>>);

#[derive(Debug, Default)]
struct MemoState {
    /// (node name, its UID, when read).
    uid: Option<(String, String, Instant)>,
    /// (where, the record's bytes, the ConfigMap's resourceVersion when
    /// known): the last publication seen on the server or written to it.
    confirmed: Option<(String, String, Option<String>)>,
    /// The spec the server kept of that publication, where it is not what
    /// was sent: an API server whose NodeRailRecord CRD is older than this
    /// release drops the fields it does not know (`railIndex`).
    kept_spec: Option<serde_json::Value>,
}

impl Memo {
    fn state(&self) -> std::sync::MutexGuard<'_, MemoState> {
        // A panic elsewhere cannot leave this half-written: every update is one assignment.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The UID read for `node` less than [`REFRESH`] ago.
    fn uid(&self, node: &str) -> Option<String> {
        let s = self.state();
        let (n, uid, at) = s.uid.as_ref()?;
        (n == node && at.elapsed() < REFRESH).then(|| uid.clone())
    }

    fn set_uid(&self, node: &str, uid: &str) {
        self.state().uid = Some((node.to_string(), uid.to_string(), Instant::now()));
    }

    fn forget_uid(&self) {
        self.state().uid = None;
    }

    /// Whether exactly `bytes` was last confirmed at `target`.
    fn confirmed(&self, target: &str, bytes: &str) -> bool {
        let s = self.state();
        s.confirmed
            .as_ref()
            .is_some_and(|(t, b, _)| t == target && b == bytes)
    }

    /// The ConfigMap's resourceVersion at which exactly `bytes` was seen at `target`.
    fn confirmed_at(&self, target: &str, bytes: &str) -> Option<String> {
        let s = self.state();
        let (t, b, rv) = s.confirmed.as_ref()?;
        (t == target && b == bytes).then(|| rv.clone())?
    }

    /// Confirms `bytes` at `target`; what the server kept of it is
    /// forgotten unless it is the same publication.
    fn set_confirmed(&self, target: &str, bytes: &str, rv: Option<String>) {
        let mut s = self.state();
        let same = s
            .confirmed
            .as_ref()
            .is_some_and(|(t, b, _)| t == target && b == bytes);
        if !same {
            s.kept_spec = None;
        }
        s.confirmed = Some((target.to_string(), bytes.to_string(), rv));
    }

    /// What the server kept of the publication confirmed at `target` as
    /// `bytes`, where it differs from what was sent.
    fn kept_spec(&self, target: &str, bytes: &str) -> Option<serde_json::Value> {
        let s = self.state();
        let (t, b, _) = s.confirmed.as_ref()?;
        (t == target && b == bytes).then(|| s.kept_spec.clone())?
    }

    fn set_kept_spec(&self, spec: Option<serde_json::Value>) {
        self.state().kept_spec = spec;
    }
}

/// This node's broker: its settings and its memory between passes.
#[derive(Debug, Clone, Default)]
pub struct Broker {
    /// Who this node is, and the API client's settings.
    pub settings: Settings,
    /// What it last read and sent.
    pub memo: Memo,
}

impl Broker {
    /// The record's `nodeUID`: the one given; else read from Node
    /// `node_name` when a cluster is configured; else empty (node-local use).
    pub fn node_uid(&self) -> Result<String, ClusterError> {
        if !self.settings.node_uid.is_empty() {
            return Ok(self.settings.node_uid.clone());
        }
        match &self.settings.node_name {
            Some(name) if client::configured() => {
                if let Some(uid) = self.memo.uid(name) {
                    return Ok(uid);
                }
                let what = format!("GET Node {name}");
                let uid = client::run(&self.settings.client, &what, |c| async move {
                    read_node_uid(&c, name).await
                })
                .map_err(|e| ClusterError::NodeUid {
                    node: name.clone(),
                    source: Box::new(e),
                })?;
                self.memo.set_uid(name, &uid);
                Ok(uid)
            }
            _ => Ok(String::new()),
        }
    }

    /// Publishes `record` to `target`: patches this node's ConfigMap key, or
    /// applies this node's NodeRailRecord; an empty record (no rail) removes
    /// the key or deletes the object. Nothing is sent when the server holds
    /// exactly that already. Any error leaves the previous record.
    pub fn publish(&self, target: &Target, record: &RailRecord) -> Result<(), ClusterError> {
        let node = self
            .settings
            .node_name
            .as_deref()
            .ok_or_else(|| ClusterError::NoNodeName(target.to_string()))?;
        let mut record = std::borrow::Cow::Borrowed(record);
        let mut text = compact(&record);
        let place = target.to_string();
        // A record this process published before is read back first, and
        // not sent again only when the server still holds exactly it; a new
        // or changed record (and a one-shot run's) is sent straight away.
        if self.memo.confirmed(&place, &text) {
            match self.held(target, node, &record, &text) {
                Ok(Some(rv)) => {
                    tracing::debug!(
                        "the server holds this rail record at {target} already: not sent again"
                    );
                    self.memo.set_confirmed(&place, &text, rv);
                    return Ok(());
                }
                Ok(None) if !record.node_uid.is_empty() => {
                    // It went missing or changed on the server: the Node may
                    // have been re-created, so its UID is read again first.
                    tracing::warn!("{target} no longer holds the rail record this node published: writing it again");
                    self.memo.forget_uid();
                    let uid = self.node_uid()?;
                    if uid != record.node_uid {
                        tracing::info!("Node {node}'s UID is now {uid}");
                        record.to_mut().node_uid = uid;
                        text = compact(&record);
                    }
                }
                Ok(None) => {}
                // The write says what is wrong, as it would without the read.
                Err(e) => tracing::debug!(
                    "reading back {target}: {}; writing it",
                    super::error::Chain(&e)
                ),
            }
        }
        let kept = self.send(target, node, &record, &text)?;
        self.memo.set_confirmed(&place, &text, None);
        self.memo.set_kept_spec(kept);
        Ok(())
    }

    /// Whether the server holds exactly this publication at `target`: then
    /// `Some` (with the ConfigMap's resourceVersion, when read).
    fn held(
        &self,
        target: &Target,
        node: &str,
        record: &RailRecord,
        text: &str,
    ) -> Result<Option<Option<String>>, ClusterError> {
        let empty = record.nics.is_empty();
        match target {
            Target::ConfigMap(cm) => {
                let known = self.memo.confirmed_at(&target.to_string(), text);
                let request = format!("GET ConfigMap {cm}");
                let want = (!empty).then_some(text);
                client::run(&self.settings.client, &request, |c| async move {
                    configmap_holds(&c, cm, node, want, known.as_deref()).await
                })
            }
            Target::CustomResource(_) => {
                let request = format!("GET NodeRailRecord {node}");
                let want = (!empty).then_some(record);
                let kept = self.memo.kept_spec(&target.to_string(), text);
                let kept = kept.as_ref();
                let held = client::run(&self.settings.client, &request, |c| async move {
                    record_holds(&c, node, want, kept).await
                })?;
                Ok(held.then_some(None))
            }
        }
    }

    /// Sends one publication (see [`Broker::publish`]); for a NodeRailRecord
    /// the server kept short of some field, the spec it kept.
    fn send(
        &self,
        target: &Target,
        node: &str,
        record: &RailRecord,
        text: &str,
    ) -> Result<Option<serde_json::Value>, ClusterError> {
        let empty = record.nics.is_empty();
        match target {
            Target::ConfigMap(cm) => {
                // The compact form is about half the bytes of the pretty one
                // `rails` prints, so twice the nodes fit the 1 MiB ConfigMap.
                let what = if empty {
                    Publication::Remove
                } else {
                    Publication::Record(text)
                };
                let request = format!("PATCH ConfigMap {cm} key {node}");
                client::run(&self.settings.client, &request, |c| async move {
                    publish(&c, cm, node, what).await
                })?;
                match what {
                    Publication::Remove => {
                        tracing::info!("no rail on this node: key {node} of ConfigMap {cm} removed")
                    }
                    Publication::Record(_) => {
                        tracing::info!(
                            "published the rail record under key {node} of ConfigMap {cm}"
                        )
                    }
                }
            }
            Target::CustomResource(_) => {
                if record.node_uid.is_empty() {
                    return Err(ClusterError::NoNodeUid(node.to_string()));
                }
                let request = match empty {
                    true => format!("DELETE NodeRailRecord {node}"),
                    false => format!("APPLY NodeRailRecord {node}"),
                };
                let kept = client::run(&self.settings.client, &request, |c| async move {
                    if empty {
                        delete_record(&c, node).await.map(|()| None)
                    } else {
                        apply_record(&c, node, record).await.map(Some)
                    }
                })?;
                let Some(kept) = kept else {
                    tracing::info!("no rail on this node: NodeRailRecord {node} deleted ({GROUP})");
                    return Ok(None);
                };
                tracing::info!("applied NodeRailRecord {node} ({GROUP})");
                let sent = &node_rail_record::object(node, record)["spec"];
                if kept != *sent {
                    let dropped = dropped_fields(sent, &kept);
                    tracing::warn!(
                        "the API server kept NodeRailRecord {node} without {}: its NodeRailRecord CRD is older than this release's; \
                         apply this release's CRD (`nodefabric crd`, deploy/crds/, the chart's crds/: `helm upgrade` does not update CRDs). \
                         Until then the record is published without them, and compared as the server keeps it",
                        dropped.join(", ")
                    );
                    return Ok(Some(kept));
                }
                return Ok(None);
            }
        }
        Ok(None)
    }
}

/// The record as the ConfigMap stores it: compact JSON, every object's keys
/// sorted (serde_json's Value map is ordered); what tells a change.
fn compact(record: &RailRecord) -> String {
    let value = serde_json::to_value(record).expect("the record serialises");
    serde_json::to_string(&value).expect("a JSON value serialises")
}

/// Whether key `node` of ConfigMap `cm` holds exactly `want` (`None`: is
/// absent); `Some` with the ConfigMap's resourceVersion when it does. Reads
/// only the metadata when the ConfigMap is still at `known`, the version at
/// which that value was last seen (RBAC: `get` on the ConfigMap).
pub async fn configmap_holds(
    client: &Client,
    cm: &ConfigMapRef,
    node: &str,
    want: Option<&str>,
    known: Option<&str>,
) -> Result<Option<Option<String>>, ClusterError> {
    let cm = cm.resolved(client);
    let api: Api<ConfigMap> =
        Api::namespaced(client.clone(), cm.namespace.as_deref().unwrap_or_default());
    let request = format!("GET ConfigMap {cm}");
    let refused = |e: kube::Error| {
        let needs = format!("`get` on the ConfigMap {} (resourceNames)", cm.name);
        ClusterError::refused(request.clone(), needs, e)
    };
    if let Some(known) = known {
        let meta = api.get_metadata_opt(&cm.name).await.map_err(refused)?;
        let meta = meta.ok_or_else(|| ClusterError::NoConfigMap(cm.clone()))?;
        if meta.metadata.resource_version.as_deref() == Some(known) {
            return Ok(Some(Some(known.to_string())));
        }
    }
    let current = api
        .get_opt(&cm.name)
        .await
        .map_err(refused)?
        .ok_or_else(|| ClusterError::NoConfigMap(cm.clone()))?;
    let held = current
        .data
        .as_ref()
        .and_then(|d| d.get(node))
        .map(String::as_str);
    Ok((held == want).then_some(current.metadata.resource_version))
}

/// Whether NodeRailRecord `node` is exactly what applying `want` would make
/// it (its spec, its Node owner, its labels), or absent for `None` (RBAC:
/// `get` on noderailrecords). `kept` is the spec this server kept of `want`
/// when applied, where its CRD dropped fields of it; the spec is compared
/// with that.
pub async fn record_holds(
    client: &Client,
    node: &str,
    want: Option<&RailRecord>,
    kept: Option<&serde_json::Value>,
) -> Result<bool, ClusterError> {
    let api = node_rail_record::records_untyped(client);
    let current = match api.get(node).await {
        Ok(o) => Some(o),
        Err(e) if code(&e) == Some(404) && !node_rail_record::no_resource(&e) => None,
        Err(e) => {
            return Err(node_rail_record::record_error(
                format!("GET NodeRailRecord {node}"),
                "`get` on noderailrecords",
                e,
            ))
        }
    };
    let (current, want) = match (current, want) {
        (None, None) => return Ok(true),
        (Some(c), Some(w)) => (c, w),
        _ => return Ok(false),
    };
    let wanted = node_rail_record::object(node, want);
    let labels = current.metadata.labels.unwrap_or_default();
    let labels_held = wanted["metadata"]["labels"]
        .as_object()
        .into_iter()
        .flatten()
        .all(|(k, v)| v.as_str() == labels.get(k).map(String::as_str));
    let owner_held = current
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|r| r.kind == "Node" && r.api_version == "v1" && r.uid == want.node_uid);
    let spec = kept.unwrap_or(&wanted["spec"]);
    Ok(labels_held && owner_held && current.data.get("spec") == Some(spec))
}

/// The fields of `sent` that `kept` lacks, by their path (`railIndex`,
/// `nics[0].x`): what the server dropped.
fn dropped_fields(sent: &serde_json::Value, kept: &serde_json::Value) -> Vec<String> {
    use serde_json::Value;
    fn walk(sent: &Value, kept: &Value, at: &str, out: &mut Vec<String>) {
        match (sent, kept) {
            (Value::Object(s), Value::Object(k)) => {
                for (key, v) in s {
                    let path = if at.is_empty() {
                        key.clone()
                    } else {
                        format!("{at}.{key}")
                    };
                    match k.get(key) {
                        Some(kv) => walk(v, kv, &path, out),
                        None => out.push(path),
                    }
                }
            }
            (Value::Array(s), Value::Array(k)) => {
                for (i, (v, kv)) in s.iter().zip(k).enumerate() {
                    walk(v, kv, &format!("{at}[{i}]"), out);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(sent, kept, "", &mut out);
    if out.is_empty() {
        // Not a dropped field but a changed value: say so, not nothing.
        out.push("the spec as sent".to_string());
    }
    out
}

/// Reads `metadata.uid` of Node `name` (RBAC: `get` on nodes): the record's
/// `nodeUID`, which tells a record apart from one an earlier node of the
/// same name left behind.
pub async fn read_node_uid(client: &Client, name: &str) -> Result<String, ClusterError> {
    let what = format!("GET Node {name}");
    // Only the metadata: a Node's status (images, conditions) can be large.
    let node = Api::<Node>::all(client.clone())
        .get_metadata(name)
        .await
        .map_err(|e| match code(&e) {
            Some(404) => ClusterError::NoSuchNode(name.to_string()),
            _ => ClusterError::refused(what.clone(), "`get` on nodes", e),
        })?;
    match node.metadata.uid {
        Some(uid) if !uid.is_empty() => Ok(uid),
        _ => Err(ClusterError::Malformed {
            what,
            message: "the answer has no metadata.uid".into(),
        }),
    }
}

/// What the broker writes under its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Publication<'a> {
    /// The record's bytes (the JSON `nodefabric rails` prints).
    Record(&'a str),
    /// An empty rail result: the key goes (absent already is fine).
    Remove,
}

/// Sets (or removes) key `node` of the ConfigMap `cm`; on any error the
/// ConfigMap is unchanged, since a patch applies whole or not at all.
pub async fn publish(
    client: &Client,
    cm: &ConfigMapRef,
    node: &str,
    what: Publication<'_>,
) -> Result<(), ClusterError> {
    let cm = cm.resolved(client);
    let api: Api<ConfigMap> =
        Api::namespaced(client.clone(), cm.namespace.as_deref().unwrap_or_default());
    let (value, size) = match what {
        Publication::Record(r) => (json!(r), node.len() + r.len()),
        Publication::Remove => (serde_json::Value::Null, 0),
    };
    let patch = json!({ "data": { node: value } });
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    let request = format!("PATCH ConfigMap {cm} key {node}");
    match api.patch(&cm.name, &params, &Patch::Merge(&patch)).await {
        Ok(_) => Ok(()),
        Err(e) => Err(match code(&e) {
            Some(404) => ClusterError::NoConfigMap(cm),
            Some(422) if too_long(&e) => ClusterError::TooLarge {
                cm,
                node: node.to_string(),
                size,
                message: status_message(&e),
            },
            _ => {
                let needs = format!("`patch` on the ConfigMap {} (resourceNames)", cm.name);
                ClusterError::refused(request, needs, e)
            }
        }),
    }
}

/// Whether a 422 is the size check: the validation cause `FieldValueTooLong`
/// (or, from a server that sends no causes, its message).
fn too_long(e: &kube::Error) -> bool {
    let kube::Error::Api(s) = e else { return false };
    let by_cause = s
        .details
        .as_ref()
        .is_some_and(|d| d.causes.iter().any(|c| c.reason == "FieldValueTooLong"));
    by_cause || s.message.contains("Too long") || s.message.contains(&CONFIGMAP_LIMIT.to_string())
}

/// Server-side-applies this node's NodeRailRecord (created when absent):
/// the record as spec, its Node (by the record's nodeUID) as owner. Forced:
/// the broker is the record's only writer, and a hand edit must not pin a
/// stale rail. On any error the previous object stays as it was.
pub async fn apply_record(
    client: &Client,
    node: &str,
    record: &RailRecord,
) -> Result<serde_json::Value, ClusterError> {
    let api = node_rail_record::records_untyped(client);
    let object = node_rail_record::object(node, record);
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let request = format!("APPLY NodeRailRecord {node}");
    match api.patch(node, &params, &Patch::Apply(&object)).await {
        // The spec as the server keeps it (its CRD may drop fields).
        Ok(o) => Ok(o.data.get("spec").cloned().unwrap_or_default()),
        Err(e) => Err(node_rail_record::record_error(
            request,
            "`patch` (and `create`) on noderailrecords",
            e,
        )),
    }
}

/// Deletes this node's NodeRailRecord (an empty rail result); absent is fine.
pub async fn delete_record(client: &Client, node: &str) -> Result<(), ClusterError> {
    let api = node_rail_record::records_untyped(client);
    match api.delete(node, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(e) if code(&e) == Some(404) && !node_rail_record::no_resource(&e) => Ok(()),
        Err(e) => Err(node_rail_record::record_error(
            format!("DELETE NodeRailRecord {node}"),
            "`delete` on noderailrecords",
            e,
        )),
    }
}
