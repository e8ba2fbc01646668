//! Cross-driver allocation: the example claims allocated, one claim after
//! another, against the pool nodefabric-dra would publish (its own pure
//! code: `devices::pool` and the taint rule) plus a second driver's GPUs
//! (NVIDIA's `gpu.nvidia.com` devices, their `pcieRoot` and `numaNode`
//! read from the same fixture tree). Selectors are evaluated by a real CEL
//! implementation (the cel crate, through dra_deploy's evaluator), and the
//! search follows Kubernetes' allocator: requests in order, a
//! `firstAvailable` request's subrequests in order, devices in slice order,
//! the first complete allocation wins; `matchAttribute` holds when every
//! device of the constraint's requests has the attribute and the values are
//! equal (a constraint naming `request/subrequest` binds only when that
//! subrequest is chosen); a device with a `NoSchedule` or `NoExecute` taint
//! the request does not tolerate is not allocatable.

use crate::dra_deploy::{classes, example, node, selected, Candidate, Node, GPU, GPU1, GPU_CLASS};
use k8s_openapi::api::resource::v1::{DeviceTaint, DeviceToleration, ResourceClaimTemplate};
use nodefabric::dra::attributes;
use nodefabric::dra::devices::{self, Attribute};
use nodefabric::dra::taints::TaintRule;
use nodefabric::dra::DEFAULT_DRIVER;
use std::collections::{BTreeMap, BTreeSet};

/// A device in a ResourceSlice: what selectors see, and its taints.
#[derive(Debug, Clone)]
struct Offered {
    device: Candidate,
    taints: Vec<DeviceTaint>,
}

/// The node's devices in slice order: the driver's pool with the taints
/// its rule gives, then NVIDIA's two GPUs (`gpu0` beside mlx5_0, `gpu1`
/// alone on its root, NUMA 1).
fn offered(n: &Node) -> Vec<Offered> {
    let pool = devices::pool(&n.specs, Some(&n.rails));
    assert!(pool.refused.is_empty(), "{:?}", pool.refused);
    let rule = TaintRule {
        driver: DEFAULT_DRIVER.to_string(),
        effect: Default::default(),
    };
    let mut out: Vec<Offered> = pool
        .devices
        .iter()
        .map(|d| Offered {
            device: Candidate {
                label: d.rdma_device.clone(),
                driver: DEFAULT_DRIVER.to_string(),
                attributes: d.attributes.clone(),
            },
            taints: rule.taints(d).unwrap_or_default(),
        })
        .collect();
    for (pci, label) in [(GPU, "gpu0"), (GPU1, "gpu1")] {
        out.push(Offered {
            device: n.gpu_at(pci, label),
            taints: Vec::new(),
        });
    }
    out
}

/// One way to satisfy a request: the request's name, the subrequest's
/// (for `firstAvailable`), its class, selectors and tolerations.
struct Alternative {
    request: String,
    sub: Option<String>,
    class: String,
    selectors: Vec<String>,
    tolerations: Vec<DeviceToleration>,
}

/// Whether `t` tolerates `taint`, as the API defines it: `Exists` with no
/// key tolerates every taint; `Equal` (the default) needs key and value;
/// an empty effect matches every effect.
fn tolerates(t: &DeviceToleration, taint: &DeviceTaint) -> bool {
    let effect = t.effect.as_deref().is_none_or(|e| e == taint.effect);
    let key = t.key.as_deref().is_none_or(|k| k == taint.key);
    let matched = match t.operator.as_deref().unwrap_or("Equal") {
        "Exists" => key,
        "Equal" => key && t.value == taint.value,
        other => panic!("operator {other} is not modelled"),
    };
    effect && matched
}

/// Whether a request with `tolerations` may get a device with `taints`.
fn allocatable(taints: &[DeviceTaint], tolerations: &[DeviceToleration]) -> bool {
    taints.iter().all(|taint| {
        !matches!(taint.effect.as_str(), "NoSchedule" | "NoExecute")
            || tolerations.iter().any(|t| tolerates(t, taint))
    })
}

/// One device chosen: `request` or `request/subrequest`, and its label.
type Chosen = (String, String);

/// The allocation Kubernetes' allocator finds for `template` on
/// `devices`, none of `taken` (devices earlier claims hold): `Ok(None)`
/// when none fits, `Err` when a selector aborts it.
fn allocate(
    template: &ResourceClaimTemplate,
    classes: &BTreeMap<String, Vec<String>>,
    devices: &[Offered],
    taken: &BTreeSet<String>,
) -> Result<Option<Vec<Chosen>>, String> {
    let claim = template.spec.spec.devices.as_ref().unwrap();
    let mut requests: Vec<Vec<(Alternative, Vec<&Offered>)>> = Vec::new();
    for r in claim.requests.iter().flatten() {
        let mut alternatives = Vec::new();
        if let Some(e) = &r.exactly {
            assert_eq!(
                e.count.unwrap_or(1),
                1,
                "one device per request is modelled"
            );
            alternatives.push(Alternative {
                request: r.name.clone(),
                sub: None,
                class: e.device_class_name.clone(),
                selectors: crate::dra_deploy::expressions(&e.selectors),
                tolerations: e.tolerations.clone().unwrap_or_default(),
            });
        }
        for s in r.first_available.iter().flatten() {
            assert_eq!(
                s.count.unwrap_or(1),
                1,
                "one device per request is modelled"
            );
            alternatives.push(Alternative {
                request: r.name.clone(),
                sub: Some(s.name.clone()),
                class: s.device_class_name.clone(),
                selectors: crate::dra_deploy::expressions(&s.selectors),
                tolerations: s.tolerations.clone().unwrap_or_default(),
            });
        }
        let mut with_devices = Vec::new();
        for a in alternatives {
            let candidates: Vec<Candidate> = devices.iter().map(|o| o.device.clone()).collect();
            let picked: BTreeSet<String> = selected(classes, &a.class, &a.selectors, &candidates)?
                .iter()
                .map(|c| c.label.clone())
                .collect();
            let usable: Vec<&Offered> = devices
                .iter()
                .filter(|o| picked.contains(&o.device.label))
                .filter(|o| !taken.contains(&o.device.label))
                .filter(|o| allocatable(&o.taints, &a.tolerations))
                .collect();
            with_devices.push((a, usable));
        }
        requests.push(with_devices);
    }
    let constraints: Vec<(Vec<String>, String)> = claim
        .constraints
        .iter()
        .flatten()
        .map(|c| {
            (
                c.requests.clone().unwrap_or_default(),
                c.match_attribute.clone().expect("matchAttribute"),
            )
        })
        .collect();
    let mut chosen: Vec<(&Alternative, &Offered)> = Vec::new();
    Ok(search(&requests, &constraints, &mut chosen).then(|| {
        chosen
            .iter()
            .map(|(a, o)| {
                let name = match &a.sub {
                    Some(sub) => format!("{}/{sub}", a.request),
                    None => a.request.clone(),
                };
                (name, o.device.label.clone())
            })
            .collect()
    }))
}

/// Depth-first, in the allocator's order; `chosen` holds the allocation
/// when it returns true.
fn search<'a>(
    requests: &'a [Vec<(Alternative, Vec<&'a Offered>)>],
    constraints: &[(Vec<String>, String)],
    chosen: &mut Vec<(&'a Alternative, &'a Offered)>,
) -> bool {
    let Some(request) = requests.get(chosen.len()) else {
        return true;
    };
    for (alternative, options) in request {
        for o in options {
            if chosen.iter().any(|(_, c)| c.device.label == o.device.label) {
                continue;
            }
            chosen.push((alternative, o));
            if holds(constraints, chosen) && search(requests, constraints, chosen) {
                return true;
            }
            chosen.pop();
        }
    }
    false
}

/// Whether every constraint holds on the devices chosen so far.
fn holds(constraints: &[(Vec<String>, String)], chosen: &[(&Alternative, &Offered)]) -> bool {
    constraints.iter().all(|(names, attr)| {
        let bound: Vec<Option<&Attribute>> = chosen
            .iter()
            .filter(|(a, _)| {
                names.is_empty()
                    || names.iter().any(|n| match n.split_once('/') {
                        Some((r, s)) => a.request == r && a.sub.as_deref() == Some(s),
                        None => a.request == *n,
                    })
            })
            .map(|(_, o)| o.device.qualified(attr))
            .collect();
        bound.iter().all(Option::is_some) && bound.windows(2).all(|w| w[0] == w[1])
    })
}

/// Claims of `template` allocated one after another until one does not
/// fit (at most `max`), each as its chosen devices.
fn allocate_until_full(
    template: &ResourceClaimTemplate,
    classes: &BTreeMap<String, Vec<String>>,
    devices: &[Offered],
    max: usize,
) -> Vec<Vec<Chosen>> {
    let mut taken = BTreeSet::new();
    let mut out = Vec::new();
    while out.len() < max {
        let Some(got) = allocate(template, classes, devices, &taken).unwrap() else {
            break;
        };
        taken.extend(got.iter().map(|(_, d)| d.clone()));
        out.push(got);
    }
    out
}

fn pairs(items: &[&[(&str, &str)]]) -> Vec<Vec<Chosen>> {
    items
        .iter()
        .map(|a| {
            a.iter()
                .map(|(r, d)| (r.to_string(), d.to_string()))
                .collect()
        })
        .collect()
}

#[test]
fn each_gpu_gets_the_nic_on_its_pcie_root_and_a_gpu_without_one_gets_none() {
    let n = node();
    let devices = offered(&n);
    let got = allocate_until_full(&example("gpu-and-nic.yaml"), &classes(), &devices, 4);
    // gpu1's root (pci0000:a0) has no NIC: the second claim does not fit,
    // though mlx5_1 is free and healthy.
    assert_eq!(got, pairs(&[&[("gpu", "gpu0"), ("nic", "mlx5_0")]]));
}

#[test]
fn the_numa_example_pairs_each_gpu_with_a_nic_on_its_numa_node() {
    let n = node();
    let devices = offered(&n);
    let template = example("gpu-and-nic-numa.yaml");
    let got = allocate_until_full(&template, &classes(), &devices, 4);
    assert_eq!(
        got,
        pairs(&[
            &[("gpu", "gpu0"), ("nic", "mlx5_0")],
            &[("gpu", "gpu1"), ("nic", "mlx5_1")],
        ])
    );
    // The pairing rests on the standard name: a NIC with only the
    // driver's own numaNode pairs with no GPU.
    let own_only: Vec<Offered> = devices
        .iter()
        .cloned()
        .map(|mut o| {
            if o.device.driver == DEFAULT_DRIVER {
                o.device.attributes.remove(attributes::NUMA_NODE);
            }
            o
        })
        .collect();
    assert_eq!(
        allocate(&template, &classes(), &own_only, &BTreeSet::new()).unwrap(),
        None
    );
}

#[test]
fn first_available_takes_the_nic_on_the_gpus_root_else_one_on_its_numa_node() {
    let n = node();
    let devices = offered(&n);
    let got = allocate_until_full(
        &example("gpu-and-nearest-nic.yaml"),
        &classes(),
        &devices,
        4,
    );
    assert_eq!(
        got,
        pairs(&[
            &[("gpu", "gpu0"), ("nic/on-pcie-root", "mlx5_0")],
            // No NIC on gpu1's root: the second subrequest, by NUMA node.
            &[("gpu", "gpu1"), ("nic/on-numa-node", "mlx5_1")],
        ])
    );
    // With mlx5_0 held by another claim, gpu0 has no NIC on its root nor
    // on its NUMA node (mlx5_2 there is Failed), so the claim gets gpu1's
    // pair instead.
    let taken = BTreeSet::from(["mlx5_0".to_string()]);
    assert_eq!(
        allocate(
            &example("gpu-and-nearest-nic.yaml"),
            &classes(),
            &devices,
            &taken
        )
        .unwrap(),
        Some(pairs(&[&[("gpu", "gpu1"), ("nic/on-numa-node", "mlx5_1")]]).remove(0))
    );
}

#[test]
fn a_device_with_a_no_schedule_taint_is_not_allocated_unless_tolerated() {
    let n = node();
    let devices = offered(&n);
    // The driver's rule taints exactly the Failed links.
    let tainted: Vec<(&str, Vec<(String, String)>)> = devices
        .iter()
        .filter(|o| !o.taints.is_empty())
        .map(|o| {
            (
                o.device.label.as_str(),
                o.taints
                    .iter()
                    .map(|t| (t.key.clone(), t.effect.clone()))
                    .collect(),
            )
        })
        .collect();
    let failed = vec![(
        format!("{DEFAULT_DRIVER}/link-failed"),
        "NoSchedule".to_string(),
    )];
    assert_eq!(
        tainted,
        [("mlx5_2", failed.clone()), ("mlx5_5", failed.clone())]
    );
    // A user's class that takes any whole NIC, whatever its link: the
    // taint, not the class, keeps the Failed one out ...
    let mut classes = classes();
    classes.insert(
        "any.rdma.example.com".into(),
        vec![format!(
            "device.driver == \"{DEFAULT_DRIVER}\" && !device.attributes[\"{DEFAULT_DRIVER}\"].virtualFunction"
        )],
    );
    let claim = |tolerations: serde_json::Value| -> ResourceClaimTemplate {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "any-nic"},
            "spec": {"spec": {"devices": {"requests": [{
                "name": "nic",
                "exactly": {
                    "deviceClassName": "any.rdma.example.com",
                    "count": 1,
                    "tolerations": tolerations,
                },
            }]}}},
        }))
        .unwrap()
    };
    let nics = |t: &ResourceClaimTemplate| -> Vec<String> {
        let mut v: Vec<String> = allocate_until_full(t, &classes, &devices, 8)
            .into_iter()
            .map(|c| c[0].1.clone())
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        nics(&claim(serde_json::json!([]))),
        ["mlx5_0", "mlx5_1", "mlx5_3"]
    );
    // ... and a claim that tolerates it gets it.
    let tolerant = claim(serde_json::json!([
        {"key": format!("{DEFAULT_DRIVER}/link-failed"), "operator": "Exists", "effect": "NoSchedule"}
    ]));
    assert_eq!(nics(&tolerant), ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]);

    // Another driver's taint counts the same: NVIDIA tainting gpu0 leaves
    // the numa example gpu1's pair only.
    let mut gpu_tainted = devices.clone();
    let gpu0 = gpu_tainted
        .iter_mut()
        .find(|o| o.device.label == "gpu0")
        .unwrap();
    assert_eq!(gpu0.device.driver, GPU_CLASS);
    gpu0.taints.push(DeviceTaint {
        key: format!("{GPU_CLASS}/unhealthy"),
        value: None,
        effect: "NoSchedule".into(),
        time_added: None,
    });
    assert_eq!(
        allocate_until_full(&example("gpu-and-nic-numa.yaml"), &classes, &gpu_tainted, 4),
        pairs(&[&[("gpu", "gpu1"), ("nic", "mlx5_1")]])
    );
    assert!(
        allocate_until_full(&example("gpu-and-nic.yaml"), &classes, &gpu_tainted, 4).is_empty()
    );
}
