//! The broker run once (`rails --rails-configmap`): the Node read, one
//! merge patch of its own key, the RBAC deploy/ grants it, and the faults
//! and hostile answers it must survive without changing the ConfigMap.

use super::support::apiserver::{self, Action, TOKEN};
use super::support::cluster::{NS, OWNER};
use super::support::os::make_fifo;
use super::{compact, failed, ok, patches, World, CM, CM_PATH, RAIL_ARGS};
use serde_json::{json, Value};
use std::fs;
use std::path::Path;
use std::process::Stdio;

// ---- the Node read -------------------------------------------------------------

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
        c.args(RAIL_ARGS).args(extra);
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

// ---- the broker ----------------------------------------------------------------

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
    let w = World::holding(json!({"node-a": "previous", "node-b": "other"}));
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
    let w = World::holding(json!({"node-a": "previous"}));
    fs::write(w.dir.join("broken.json"), "{\"lldp\": ").unwrap();
    failed(w.broker("node-a", "broken.json").output().unwrap());
    assert_eq!(w.data()["node-a"], "previous");
    assert!(patches(&w.api).is_empty());
}

#[test]
fn empty_rail_result_removes_the_key_and_an_absent_key_is_fine() {
    let w = World::holding(json!({"node-a": "previous", "node-b": "other"}));
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

#[test]
fn values_file_config_map_name_is_the_broker_target_in_a_cluster() {
    let w = World::holding(json!({}));
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

#[test]
fn one_shot_publish_writes_the_rail_file_even_when_the_configmap_refuses() {
    let w = World::new();
    w.api.add_node("node-a");
    let file = w.dir.join("out/rails.json");
    let publish = || {
        let mut c = w.publish_as(&w.broker_kubeconfig, "");
        c.arg("--rails-file")
            .arg(&file)
            .arg("--lldp-json")
            .arg(w.dir.join("lldp.json"));
        c.args(RAIL_ARGS);
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

// ---- RBAC (deploy/) ------------------------------------------------------------

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

// ---- hostile API servers -------------------------------------------------------

#[test]
fn hung_api_server_fails_the_broker_within_its_timeout_and_changes_nothing() {
    let w = World::holding(json!({"node-a": "previous"}));
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
    let w = World::holding(json!({"node-a": "previous"}));
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
fn api_error_texts_name_each_cause_once_in_words_without_a_status_dump() {
    let w = World::holding(json!({"node-a": "previous"}));
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

// ---- the stand-in itself -------------------------------------------------------

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
