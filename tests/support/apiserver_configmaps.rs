//! The API stand-in's ConfigMap writes: POST, JSON Patch and merge patch
//! (a no-op keeps the resourceVersion), and the validation and storage
//! shape the real server applies (keys, the 1 MiB limit, no empty map).

use super::{key, not_found, status, State, LIMIT};
use serde_json::{json, Value};
use std::collections::BTreeMap;

impl State {
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
}

pub(super) fn create_configmap(s: &mut State, ns: &str, body: &[u8]) -> (u16, Value) {
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

pub(super) fn patch_configmap(
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
pub(super) fn validate(cm: &mut Value, name: &str) -> Result<(), (u16, Value)> {
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
