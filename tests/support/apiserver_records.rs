//! The API stand-in's NodeRailRecords (`nodefabric.gpustack.ai/v1alpha1`),
//! served once a test installs the CRD from deploy/crds/ and validated
//! against its schema: LIST (paged, `continue` tokens that expire),
//! server-side apply with field ownership, merge patches, DELETE with
//! preconditions; and what the garbage collector does for them.

use super::{key, query_param, shape, status, ApiServer, State, RECORDS, RECORDS_API};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// Who owns which fields of one custom object.
#[derive(Default, Clone)]
pub(super) struct Ownership {
    spec: String,
    labels: BTreeMap<String, Vec<String>>,
}

/// An installed CRD: the validator of its schema and the schema (for pruning).
pub struct Crd {
    validator: jsonschema::Validator,
    schema: Value,
}

impl State {
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

impl ApiServer {
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
        self.install_crd_lacking(None);
    }

    /// Installs the CRD of an earlier release, whose spec did not have
    /// `field` yet: the server prunes it from every object it keeps, as a
    /// structural schema's unknown fields are pruned (and `helm upgrade`
    /// leaves such a CRD in place).
    pub fn install_crd_without(&self, field: &str) {
        self.install_crd_lacking(Some(field));
    }

    fn install_crd_lacking(&self, field: Option<&str>) {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/crds/noderailrecords.yaml");
        let crd: Value = serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let mut schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone();
        if let Some(field) = field {
            let props = schema["properties"]["spec"]["properties"]
                .as_object_mut()
                .expect("the spec's properties");
            assert!(props.remove(field).is_some(), "the CRD has no spec.{field}");
            if let Some(required) = schema["properties"]["spec"]["required"].as_array_mut() {
                required.retain(|r| r != field);
            }
        }
        let validator = jsonschema::validator_for(&schema).expect("the CRD's schema compiles");
        self.with(|s| s.crd = Some(Arc::new(Crd { validator, schema })));
    }
}

/// The NodeRailRecord endpoints (the CRD installed): list (paged, by name),
/// get, server-side apply, merge patch, and delete with preconditions.
pub(super) fn records(
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
