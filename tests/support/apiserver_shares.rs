//! The API stand-in's consumable capacity (KEP-5075, gate
//! `DRAConsumableCapacity`), as upstream's ResourceSlice strategy and
//! validation treat it: with the gate off a write loses every device's
//! `allowMultipleAllocations` and each capacity's `requestPolicy` (unless
//! the stored slice already uses them); with it on, a request policy is
//! validated against its capacity. Quantities are whole numbers here: all
//! a NIC's shares need.

use serde_json::Value;

/// What the server does to sharing fields on a write: with the gate off
/// and the stored object not using them, drops them.
pub fn admit(gate_off: bool, obj: &mut Value, old: Option<&Value>) {
    if !gate_off || old.is_some_and(in_use) {
        return;
    }
    for d in obj["spec"]["devices"].as_array_mut().into_iter().flatten() {
        if let Some(d) = d.as_object_mut() {
            d.remove("allowMultipleAllocations");
        }
        for c in d["capacity"]
            .as_object_mut()
            .into_iter()
            .flat_map(|c| c.values_mut())
        {
            if let Some(c) = c.as_object_mut() {
                c.remove("requestPolicy");
            }
        }
    }
}

/// Whether a stored slice uses the gate's fields.
fn in_use(slice: &Value) -> bool {
    slice["spec"]["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|d| {
            !d["allowMultipleAllocations"].is_null()
                || d["capacity"]
                    .as_object()
                    .is_some_and(|c| c.values().any(|c| !c["requestPolicy"].is_null()))
        })
}

/// A whole-number quantity, or why not.
fn whole(q: &Value) -> Option<i64> {
    q.as_str().and_then(|s| s.parse().ok())
}

/// The violations of device `i`'s capacities, worded as the server words them.
pub fn validate(i: usize, d: &Value, causes: &mut Vec<String>) {
    let shared = d["allowMultipleAllocations"] == Value::Bool(true);
    for (name, c) in d["capacity"].as_object().into_iter().flatten() {
        let at = format!("spec.devices[{i}].capacity[{name}]");
        let Some(value) = whole(&c["value"]) else {
            causes.push(format!("{at}.value: Required value"));
            continue;
        };
        let policy = &c["requestPolicy"];
        if policy.is_null() {
            continue;
        }
        if !shared {
            causes.push(format!(
                "{at}.requestPolicy: Forbidden: allowMultipleAllocations must be true"
            ));
        }
        let default = whole(&policy["default"]);
        let range = &policy["validRange"];
        if range.is_null() {
            continue;
        }
        let (Some(default), Some(min)) = (default, whole(&range["min"])) else {
            causes.push(format!(
                "{at}.requestPolicy.default: Required value: default and validRange.min are required with validRange"
            ));
            continue;
        };
        let max = whole(&range["max"]).unwrap_or(value);
        let step = whole(&range["step"]).unwrap_or(1);
        if min < 0 || min > value || max > value || min > max {
            causes.push(format!(
                "{at}.requestPolicy.validRange: Invalid value: min {min}, max {max}: must lie within 0..={value}"
            ));
        }
        if default < min || default > max {
            causes.push(format!(
                "{at}.requestPolicy.default: Invalid value: {default}: must be within validRange {min}..={max}"
            ));
        }
        if step < 1 || (default - min) % step != 0 || (max - min) % step != 0 {
            causes.push(format!(
                "{at}.requestPolicy.validRange.step: Invalid value: {step}: default and max must be min plus a multiple of it"
            ));
        }
    }
}
