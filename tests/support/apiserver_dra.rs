//! The API stand-in's `resource.k8s.io/v1`: ResourceSlices and
//! ResourceClaims, as kube-apiserver 1.34 serves them, where it matters to
//! a DRA driver.
//!
//! - ResourceSlices (cluster-scoped): GET, LIST with the field selectors the
//!   server supports (`spec.nodeName`, `spec.driver`, `spec.pool.name`; any
//!   other is 400), POST (`generateName` filled in; 409 AlreadyExists),
//!   PUT (409 Conflict on a stale `resourceVersion`), DELETE (404; 409 on a
//!   failed UID precondition) and DELETE of the collection (kubelet's wipe,
//!   with a field selector). Validation as the server's: at most 128
//!   devices a slice, 32 attributes and capacities a device, strings of at
//!   most 64 characters, attribute names `<domain>/<name>` or `<name>` with
//!   a C identifier of at most 32 characters, device names DNS labels and
//!   unique in the slice, exactly one of `nodeName`, `nodeSelector`,
//!   `allNodes` and `perDeviceNodeSelection`; 422 Invalid otherwise.
//! - ResourceClaims (namespaced): GET; tests put claims in with
//!   [`super::ApiServer::put_claim`].

use super::{key, query_param, status, State};
use serde_json::{json, Value};

/// The most devices the server takes in one ResourceSlice.
pub const MAX_DEVICES: usize = 128;
/// The most devices in a slice any of whose devices carries taints
/// (`ResourceSliceMaxDevicesWithAdvancedFeatures`, api resource/v1 types.go).
pub const MAX_DEVICES_WITH_TAINTS: usize = 64;
/// The most taints per device (`DeviceTaintsMaxLength`, 16 from 1.35).
pub const MAX_TAINTS: usize = 16;
/// The most attributes and capacities together one device may have.
pub const MAX_ATTRIBUTES: usize = 32;
/// The longest string attribute value.
pub const MAX_STRING: usize = 64;

const SLICES: &str = "resourceslices";
const CLAIMS: &str = "resourceclaims";

/// Serves `/apis/resource.k8s.io/v1/<rest>`.
pub fn route(s: &mut State, method: &str, rest: &[&str], query: &str, body: &[u8]) -> (u16, Value) {
    match (method, rest) {
        ("GET", [SLICES]) => match selector(query) {
            Ok(sel) => {
                let items: Vec<Value> = slices(s, &sel).into_iter().map(|(_, o)| o).collect();
                (
                    200,
                    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList",
                           "metadata": {"resourceVersion": s.rv.to_string()}, "items": items}),
                )
            }
            Err(e) => e,
        },
        ("GET", [SLICES, name]) => match s.objects.get(&key(SLICES, "", name)) {
            Some(o) => (200, o.clone()),
            None => not_found_slice(name),
        },
        ("POST", [SLICES]) => create(s, body),
        ("PUT", [SLICES, name]) => update(s, name, body),
        ("DELETE", [SLICES, name]) => delete(s, name, body),
        ("DELETE", [SLICES]) => match selector(query) {
            Ok(sel) => {
                // The answer is the list of what was deleted.
                let mut items = Vec::new();
                for (name, _) in slices(s, &sel) {
                    let old = s.objects.remove(&key(SLICES, "", &name)).unwrap();
                    let rv = s.bump();
                    s.event(rv, SLICES, "", "DELETED", old.clone());
                    items.push(old);
                }
                (
                    200,
                    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList",
                           "metadata": {"resourceVersion": s.rv.to_string()}, "items": items}),
                )
            }
            Err(e) => e,
        },
        ("GET", ["namespaces", ns, CLAIMS, name]) => match s.objects.get(&key(CLAIMS, ns, name)) {
            Some(o) => (200, o.clone()),
            None => status(
                404,
                "NotFound",
                &format!("resourceclaims.resource.k8s.io \"{name}\" not found"),
                json!({"name": name, "group": "resource.k8s.io", "kind": "resourceclaims"}),
            ),
        },
        (m, _) => status(
            405,
            "MethodNotAllowed",
            &format!("{m} is not supported here"),
            Value::Null,
        ),
    }
}

fn not_found_slice(name: &str) -> (u16, Value) {
    status(
        404,
        "NotFound",
        &format!("resourceslices.resource.k8s.io \"{name}\" not found"),
        json!({"name": name, "group": "resource.k8s.io", "kind": "resourceslices"}),
    )
}

/// A parsed field selector: (field path, value) pairs that must all hold.
type Selector = Vec<(String, String)>;

fn selector(query: &str) -> Result<Selector, (u16, Value)> {
    let Some(raw) = query_param(query, "fieldSelector") else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for term in raw.split(',').filter(|t| !t.is_empty()) {
        let (field, value) = term
            .split_once("==")
            .or_else(|| term.split_once('='))
            .ok_or_else(|| {
                status(
                    400,
                    "BadRequest",
                    &format!("invalid field selector: {term:?}"),
                    Value::Null,
                )
            })?;
        if ![
            "spec.nodeName",
            "spec.driver",
            "spec.pool.name",
            "metadata.name",
        ]
        .contains(&field)
        {
            return Err(status(
                400,
                "BadRequest",
                &format!("field label not supported: {field}"),
                Value::Null,
            ));
        }
        out.push((field.to_string(), value.to_string()));
    }
    Ok(out)
}

fn field<'a>(obj: &'a Value, path: &str) -> Option<&'a str> {
    path.split('.').try_fold(obj, |v, k| v.get(k))?.as_str()
}

/// The slices a selector matches, by name.
fn slices(s: &State, sel: &Selector) -> Vec<(String, Value)> {
    s.objects
        .iter()
        .filter(|((r, _, _), _)| r == SLICES)
        .filter(|(_, o)| {
            sel.iter()
                .all(|(f, v)| field(o, f).unwrap_or_default() == v.as_str())
        })
        .map(|((_, _, name), o)| (name.clone(), o.clone()))
        .collect()
}

fn invalid(name: &str, causes: Vec<String>) -> (u16, Value) {
    status(
        422,
        "Invalid",
        &format!(
            "ResourceSlice.resource.k8s.io \"{name}\" is invalid: {}",
            causes.join(", ")
        ),
        json!({"name": name, "group": "resource.k8s.io", "kind": "ResourceSlice",
               "causes": causes.iter().map(|c| json!({"reason": "FieldValueInvalid", "message": c})).collect::<Vec<_>>()}),
    )
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_c_identifier(s: &str) -> bool {
    let mut b = s.bytes();
    s.len() <= 32
        && b.next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// The server's validation of a slice's spec: every violation, as it words them.
fn validate(obj: &Value) -> Vec<String> {
    let mut causes = Vec::new();
    let spec = &obj["spec"];
    if spec["driver"].as_str().is_none_or(str::is_empty) {
        causes.push("spec.driver: Required value".into());
    }
    if spec["pool"]["name"].as_str().is_none_or(str::is_empty) {
        causes.push("spec.pool.name: Required value".into());
    }
    let count = spec["pool"]["resourceSliceCount"].as_i64().unwrap_or(0);
    if count < 1 {
        causes.push(format!(
            "spec.pool.resourceSliceCount: Invalid value: {count}: must be greater than zero"
        ));
    }
    let placements = [
        "nodeName",
        "nodeSelector",
        "allNodes",
        "perDeviceNodeSelection",
    ]
    .iter()
    .filter(|f| !spec[**f].is_null() && spec[**f] != json!(false) && spec[**f] != json!(""))
    .count();
    if placements != 1 {
        causes.push(
            "spec: Invalid value: exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required"
                .into(),
        );
    }
    let devices = spec["devices"].as_array().cloned().unwrap_or_default();
    if devices.len() > MAX_DEVICES {
        causes.push(format!(
            "spec.devices: Too many: {}: must have at most {MAX_DEVICES} items",
            devices.len()
        ));
    }
    let tainted = devices
        .iter()
        .any(|d| d["taints"].as_array().is_some_and(|t| !t.is_empty()));
    if tainted && devices.len() > MAX_DEVICES_WITH_TAINTS {
        causes.push(format!(
            "spec.devices: Too many: {}: must have at most {MAX_DEVICES_WITH_TAINTS} items when any device has taints",
            devices.len()
        ));
    }
    let mut names = std::collections::BTreeSet::new();
    for (i, d) in devices.iter().enumerate() {
        let taints = d["taints"].as_array().cloned().unwrap_or_default();
        if taints.len() > MAX_TAINTS {
            causes.push(format!(
                "spec.devices[{i}].taints: Too many: {}: must have at most {MAX_TAINTS} items",
                taints.len()
            ));
        }
        for (j, t) in taints.iter().enumerate() {
            let key = t["key"].as_str().unwrap_or_default();
            let qualified = key.split_once('/').is_some_and(|(domain, name)| {
                !domain.is_empty()
                    && domain.len() <= 253
                    && is_label_value(name)
                    && !name.is_empty()
            }) || (is_label_value(key) && !key.is_empty());
            if !qualified {
                causes.push(format!(
                    "spec.devices[{i}].taints[{j}].key: Invalid value: {key:?}: a qualified name must consist of alphanumeric characters, '-', '_' or '.'"
                ));
            }
            let value = t["value"].as_str().unwrap_or_default();
            if !is_label_value(value) {
                causes.push(format!(
                    "spec.devices[{i}].taints[{j}].value: Invalid value: {value:?}: a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', at most 63"
                ));
            }
            let effect = t["effect"].as_str().unwrap_or_default();
            if !["NoSchedule", "NoExecute", "None"].contains(&effect) {
                causes.push(format!(
                    "spec.devices[{i}].taints[{j}].effect: Unsupported value: {effect:?}: supported values: \"NoExecute\", \"NoSchedule\", \"None\""
                ));
            }
        }
        let name = d["name"].as_str().unwrap_or_default();
        if !is_dns_label(name) {
            causes.push(format!(
                "spec.devices[{i}].name: Invalid value: {name:?}: a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-'"
            ));
        }
        if !names.insert(name.to_string()) {
            causes.push(format!("spec.devices[{i}].name: Duplicate value: {name:?}"));
        }
        super::shares::validate(i, d, &mut causes);
        let attrs = d["attributes"].as_object().cloned().unwrap_or_default();
        let caps = d["capacity"].as_object().map_or(0, |c| c.len());
        if attrs.len() + caps > MAX_ATTRIBUTES {
            causes.push(format!(
                "spec.devices[{i}]: Too many: {}: must have at most {MAX_ATTRIBUTES} attributes and capacities",
                attrs.len() + caps
            ));
        }
        for (attr, value) in &attrs {
            let bare = attr.rsplit('/').next().unwrap_or_default();
            if !is_c_identifier(bare) {
                causes.push(format!(
                    "spec.devices[{i}].attributes[{attr}]: Invalid value: {bare:?}: must be a C identifier of at most 32 characters"
                ));
            }
            let set = ["bool", "int", "string", "version"]
                .iter()
                .filter(|k| !value[**k].is_null())
                .count();
            if set != 1 {
                causes.push(format!(
                    "spec.devices[{i}].attributes[{attr}]: Invalid value: exactly one value must be specified"
                ));
            }
            if let Some(text) = value["string"].as_str() {
                if text.chars().count() > MAX_STRING {
                    causes.push(format!(
                        "spec.devices[{i}].attributes[{attr}].string: Too long: may not be more than {MAX_STRING} bytes"
                    ));
                }
            }
        }
    }
    causes
}

/// A label value: empty, or at most 63 of `[A-Za-z0-9_.-]` starting and
/// ending with a letter or digit.
fn is_label_value(s: &str) -> bool {
    s.is_empty()
        || (s.len() <= 63
            && s.starts_with(|c: char| c.is_ascii_alphanumeric())
            && s.ends_with(|c: char| c.is_ascii_alphanumeric())
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
}

/// What the server does to devices' taints on a write: with the gate off
/// it drops them; else it stamps `timeAdded` on each new one (a taint the
/// stored object already had keeps its time).
fn admit_taints(s: &State, obj: &mut Value, old: Option<&Value>, rv: u64) {
    let before: Vec<Value> = old
        .and_then(|o| o["spec"]["devices"].as_array().cloned())
        .unwrap_or_default();
    for d in obj["spec"]["devices"].as_array_mut().into_iter().flatten() {
        if s.taints_gate_off {
            if let Some(d) = d.as_object_mut() {
                d.remove("taints");
            }
            continue;
        }
        let name = d["name"].clone();
        let had: Vec<Value> = before
            .iter()
            .find(|b| b["name"] == name)
            .and_then(|b| b["taints"].as_array().cloned())
            .unwrap_or_default();
        for t in d["taints"].as_array_mut().into_iter().flatten() {
            if !t["timeAdded"].is_null() {
                continue;
            }
            let same = had.iter().find(|h| {
                h["key"] == t["key"] && h["value"] == t["value"] && h["effect"] == t["effect"]
            });
            t["timeAdded"] = match same {
                Some(h) => h["timeAdded"].clone(),
                None => json!(format!(
                    "2026-03-01T12:{:02}:{:02}Z",
                    (rv / 60) % 60,
                    rv % 60
                )),
            };
        }
    }
}

/// A request body as a ResourceSlice object, or the server's 400.
fn slice_body(body: &[u8]) -> Result<Value, (u16, Value)> {
    serde_json::from_slice(body).map_err(|e| {
        status(
            400,
            "BadRequest",
            &format!("the body is not a ResourceSlice: {e}"),
            Value::Null,
        )
    })
}

fn create(s: &mut State, body: &[u8]) -> (u16, Value) {
    let mut obj = match slice_body(body) {
        Ok(v) => v,
        Err(refused) => return refused,
    };
    let name = match (
        obj["metadata"]["name"].as_str(),
        obj["metadata"]["generateName"].as_str(),
    ) {
        (Some(n), _) if !n.is_empty() => n.to_string(),
        (_, Some(prefix)) => {
            // The server's random suffix: five characters; a counter keeps
            // names unique and runs repeatable.
            let n = s.next_uid + 1;
            format!("{prefix}{:05x}", n % 0xfffff)
        }
        _ => {
            return invalid(
                "",
                vec!["metadata.name: Required value: name or generateName is required".into()],
            )
        }
    };
    let causes = validate(&obj);
    if !causes.is_empty() {
        return invalid(&name, causes);
    }
    if s.objects.contains_key(&key(SLICES, "", &name)) {
        return status(
            409,
            "AlreadyExists",
            &format!("resourceslices.resource.k8s.io \"{name}\" already exists"),
            json!({"name": name, "group": "resource.k8s.io", "kind": "resourceslices"}),
        );
    }
    let uid = s.uid();
    let rv = s.bump();
    obj["apiVersion"] = json!("resource.k8s.io/v1");
    obj["kind"] = json!("ResourceSlice");
    obj["metadata"]["name"] = json!(name);
    obj["metadata"]["uid"] = json!(uid);
    obj["metadata"]["resourceVersion"] = json!(rv.to_string());
    obj["metadata"]["creationTimestamp"] = json!("2026-03-01T12:00:00Z");
    for field in &s.dropped_device_fields {
        for d in obj["spec"]["devices"].as_array_mut().into_iter().flatten() {
            if let Some(attrs) = d["attributes"].as_object_mut() {
                attrs.remove(field);
            }
        }
    }
    admit_taints(s, &mut obj, None, rv);
    super::shares::admit(s.capacity_gate_off, &mut obj, None);
    s.objects.insert(key(SLICES, "", &name), obj.clone());
    s.event(rv, SLICES, "", "ADDED", obj.clone());
    (201, obj)
}

fn update(s: &mut State, name: &str, body: &[u8]) -> (u16, Value) {
    let mut obj = match slice_body(body) {
        Ok(v) => v,
        Err(refused) => return refused,
    };
    let Some(old) = s.objects.get(&key(SLICES, "", name)).cloned() else {
        return not_found_slice(name);
    };
    if obj["metadata"]["resourceVersion"] != old["metadata"]["resourceVersion"] {
        return status(
            409,
            "Conflict",
            &format!("Operation cannot be fulfilled on resourceslices.resource.k8s.io \"{name}\": the object has been modified; please apply your changes to the latest version and try again"),
            json!({"name": name, "group": "resource.k8s.io", "kind": "resourceslices"}),
        );
    }
    let causes = validate(&obj);
    if !causes.is_empty() {
        return invalid(name, causes);
    }
    let rv = s.bump();
    obj["metadata"]["uid"] = old["metadata"]["uid"].clone();
    obj["metadata"]["resourceVersion"] = json!(rv.to_string());
    admit_taints(s, &mut obj, Some(&old), rv);
    super::shares::admit(s.capacity_gate_off, &mut obj, Some(&old));
    s.objects.insert(key(SLICES, "", name), obj.clone());
    s.event(rv, SLICES, "", "MODIFIED", obj.clone());
    (200, obj)
}

fn delete(s: &mut State, name: &str, body: &[u8]) -> (u16, Value) {
    let Some(old) = s.objects.get(&key(SLICES, "", name)).cloned() else {
        return not_found_slice(name);
    };
    let options: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    if let Some(uid) = options["preconditions"]["uid"].as_str() {
        if old["metadata"]["uid"].as_str() != Some(uid) {
            return status(
                409,
                "Conflict",
                &format!(
                    "Operation cannot be fulfilled on resourceslices.resource.k8s.io \"{name}\": Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    old["metadata"]["uid"].as_str().unwrap_or_default()
                ),
                json!({"name": name, "group": "resource.k8s.io", "kind": "resourceslices"}),
            );
        }
    }
    s.objects.remove(&key(SLICES, "", name));
    let rv = s.bump();
    s.event(rv, SLICES, "", "DELETED", old.clone());
    (200, old)
}

impl State {
    /// The ResourceSlices stored now, by name.
    pub fn resource_slices(&self) -> Vec<Value> {
        slices(self, &Vec::new())
            .into_iter()
            .map(|(_, o)| o)
            .collect()
    }

    /// Creates a ResourceSlice as any account allowed to create slices
    /// would (another DRA driver), through the server's validation; the
    /// status code answered.
    pub fn create_slice(&mut self, slice: Value) -> u16 {
        create(self, &serde_json::to_vec(&slice).unwrap()).0
    }

    /// Stores a ResourceClaim allocated to `results` (driver, pool, device,
    /// request); returns its UID.
    pub fn put_claim(
        &mut self,
        ns: &str,
        name: &str,
        results: &[(&str, &str, &str, &str)],
    ) -> String {
        let uid = self.uid();
        self.put_claim_as(ns, name, &uid, results);
        uid
    }

    /// [`State::put_claim`] with a UID of the test's choosing (one a
    /// checked-in checkpoint names).
    pub fn put_claim_as(
        &mut self,
        ns: &str,
        name: &str,
        uid: &str,
        results: &[(&str, &str, &str, &str)],
    ) {
        let results: Vec<Value> = results
            .iter()
            .map(|(driver, pool, device, request)| {
                json!({"driver": driver, "pool": pool, "device": device, "request": request})
            })
            .collect();
        self.put_claim_results(ns, name, uid, results);
    }

    /// Stores a ResourceClaim with these allocation results as JSON (a
    /// share's `shareID` and `consumedCapacity`, say), under `uid`.
    pub fn put_claim_results(&mut self, ns: &str, name: &str, uid: &str, results: Vec<Value>) {
        let rv = self.bump();
        let claim = json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"namespace": ns, "name": name, "uid": uid, "resourceVersion": rv.to_string()},
            "spec": {"devices": {"requests": []}},
            "status": {"allocation": {"devices": {"results": results}}},
        });
        self.objects.insert(key(CLAIMS, ns, name), claim);
    }

    /// Gives a stored ResourceClaim other allocation results, keeping its
    /// UID (the claim now allocated elsewhere, or deallocated when empty).
    pub fn reallocate_claim(&mut self, ns: &str, name: &str, results: &[(&str, &str, &str, &str)]) {
        let uid = self.objects[&key(CLAIMS, ns, name)]["metadata"]["uid"]
            .as_str()
            .unwrap()
            .to_string();
        self.put_claim_as(ns, name, &uid, results);
    }

    /// Deletes a ResourceClaim.
    pub fn delete_claim(&mut self, ns: &str, name: &str) {
        self.objects.remove(&key(CLAIMS, ns, name));
    }

    /// From now on, written slices lose their devices' taints, as a server
    /// with the `DRADeviceTaints` gate off (1.34, 1.35 by default) drops them.
    pub fn disable_device_taints(&mut self) {
        self.taints_gate_off = true;
    }

    /// Stores pod `ns/name` whose containers hold these claims (container
    /// name, the ResourceClaim objects it names), each claim named in the
    /// pod's `spec.resourceClaims` by `resourceClaimName`, and reserves each
    /// stored claim for the pod (`status.reservedFor`), as the scheduler does
    /// before the pod reaches kubelet. Returns the pod's UID.
    pub fn put_pod_holding(
        &mut self,
        ns: &str,
        name: &str,
        containers: &[(&str, &[&str])],
    ) -> String {
        let uid = self.uid();
        let rv = self.bump();
        let mut claims: Vec<&str> = containers
            .iter()
            .flat_map(|(_, c)| c.iter().copied())
            .collect();
        claims.sort();
        claims.dedup();
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"namespace": ns, "name": name, "uid": uid, "resourceVersion": rv.to_string()},
            "spec": {
                "containers": containers.iter().map(|(c, held)| json!({"name": c, "image": "busybox",
                    "resources": {"claims": held.iter().map(|h| json!({"name": h})).collect::<Vec<_>>()}})).collect::<Vec<_>>(),
                "resourceClaims": claims.iter().map(|c| json!({"name": c, "resourceClaimName": c})).collect::<Vec<_>>(),
            },
            "status": {"phase": "Pending"}});
        self.objects.insert(key("pods", ns, name), pod);
        for c in claims {
            if let Some(claim) = self.objects.get_mut(&key(CLAIMS, ns, c)) {
                let reserved = json!({"resource": "pods", "name": name, "uid": uid});
                match claim["status"]["reservedFor"].as_array_mut() {
                    Some(list) => list.push(reserved),
                    None => claim["status"]["reservedFor"] = json!([reserved]),
                }
            }
        }
        uid
    }

    /// Deletes pod `ns/name`.
    pub fn delete_pod(&mut self, ns: &str, name: &str) {
        self.objects.remove(&key("pods", ns, name));
    }

    /// From now on, written slices lose their devices' sharing fields, as a
    /// server with the `DRAConsumableCapacity` gate off (1.34, 1.35 by
    /// default) drops them.
    pub fn disable_consumable_capacity(&mut self) {
        self.capacity_gate_off = true;
    }

    /// A fresh object UID, for a claim the test stores with its own results.
    pub fn new_uid(&mut self) -> String {
        self.uid()
    }

    /// From now on, created slices lose this device attribute, as a server
    /// with the field's feature gate off drops it.
    pub fn drop_device_attribute(&mut self, attribute: &str) {
        self.dropped_device_fields.push(attribute.to_string());
    }
}
