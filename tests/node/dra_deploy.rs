//! The DRA driver's deployment: deploy/components/dra/ rendered on top of
//! deploy/ by the real `kubectl kustomize`, and the claim examples in
//! deploy/examples/dra/. Typed objects with only known fields; the driver
//! on exactly the nodes the device plugin leaves; mounts that match its
//! flags; RBAC no wider than the driver's calls; and every CEL selector
//! evaluated by a real CEL implementation (the cel crate) against the
//! devices `nodefabric::dra::devices::pool` builds from CDI specs and a
//! rail record the real publisher wrote, in the shape Kubernetes gives a
//! selector: `device.driver`, `device.attributes[domain][name]` (bare names
//! in the driver's domain), an unknown domain an empty map, and a missing
//! attribute an error that aborts the allocation.

use crate::deploy::{check_kind, typed, verbs};
use crate::support::apiserver_rbac::Rbac;
use crate::support::fixtures::{self, addr, Tree};
use crate::support::host;
use clap::Parser;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, PodSpec, VolumeMount};
use k8s_openapi::api::resource::v1::{DeviceClass, DeviceSelector, ResourceClaimTemplate};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use nodefabric::cli::{Cli, Command as Sub};
use nodefabric::dra::attributes;
use nodefabric::dra::devices::{self, Attribute, Published};
use nodefabric::dra::DEFAULT_DRIVER;
use nodefabric::kubelet::specs::{Change, Loader};
use nodefabric::rails::RailRecord;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The node label that hands a node's NICs to the DRA driver.
const ALLOCATOR_LABEL: &str = "nodefabric.gpustack.ai/rdma-allocator";

/// NVIDIA's GPU DeviceClass, which the GPU example names.
pub(crate) const GPU_CLASS: &str = "gpu.nvidia.com";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The DRA component's folder, whose DeviceClasses the CEL tests read.
pub(crate) fn component() -> PathBuf {
    repo().join("deploy/components/dra")
}

/// The example claims' folder.
pub(crate) fn examples() -> PathBuf {
    repo().join("deploy/examples/dra")
}

// ---- rendering ---------------------------------------------------------------

/// `kubectl kustomize` of an overlay holding `resources` and `components`
/// (folders of this repository). The overlay sits in a temp folder and
/// names them by relative paths: kustomize refuses absolute ones.
/// `None` when kubectl is missing outside CI (the test is skipped, saying
/// so); under CI a missing kubectl fails the test.
pub(crate) fn kustomize(test: &str, resources: &[&str], components: &[&str]) -> Option<Vec<Value>> {
    let missing = (!host::have("kubectl"))
        .then(|| "kubectl is not installed (scripts/test.sh installs it)".to_string());
    if !host::runnable(test, missing) {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let overlay = dir.path().canonicalize().unwrap();
    let up = "../".repeat(overlay.components().count() - 1);
    let repo = repo().canonicalize().unwrap();
    let rel = |p: &&str| format!("{up}{}/{p}", repo.strip_prefix("/").unwrap().display());
    let list = |items: &[&str]| {
        items
            .iter()
            .map(|p| format!("  - {}\n", rel(p)))
            .collect::<String>()
    };
    let mut text = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n{}",
        list(resources)
    );
    if !components.is_empty() {
        text.push_str(&format!("components:\n{}", list(components)));
    }
    fs::write(overlay.join("kustomization.yaml"), text).unwrap();
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(&overlay)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl kustomize {resources:?} + {components:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let docs: Vec<Value> = serde_saphyr::from_multiple(&String::from_utf8(out.stdout).unwrap())
        .unwrap_or_else(|e| panic!("kubectl kustomize output: {e}"));
    assert!(!docs.is_empty());
    Some(docs)
}

/// deploy/ with the DRA component.
fn with_dra(test: &str) -> Option<Vec<Value>> {
    kustomize(test, &["deploy"], &["deploy/components/dra"])
}

/// A rendered object's identity.
pub(crate) fn key(doc: &Value) -> (String, String, String) {
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    (
        s(&doc["kind"]),
        s(&doc["metadata"]["namespace"]),
        s(&doc["metadata"]["name"]),
    )
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
}

fn daemonset(docs: &[Value], name: &str) -> DaemonSet {
    typed(name, find(docs, "DaemonSet", name))
}

fn pod(ds: &DaemonSet) -> PodSpec {
    ds.spec.clone().unwrap().template.spec.unwrap()
}

/// One YAML file of the component or the examples.
pub(crate) fn file(dir: &Path, name: &str) -> Value {
    let path = dir.join(name);
    let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_component_adds_the_driver_and_changes_only_where_the_device_plugin_runs() {
    let test = "the_component_adds_the_driver_and_changes_only_where_the_device_plugin_runs";
    let (Some(base), Some(dra)) = (kustomize(test, &["deploy"], &[]), with_dra(test)) else {
        return;
    };
    // Every rendered document is a typed object with no unknown field.
    for doc in &dra {
        let what = format!("{:?}", key(doc));
        check_kind(
            &what,
            doc,
            &[
                "DaemonSet",
                "Deployment",
                "Namespace",
                "ServiceAccount",
                "ClusterRole",
                "ClusterRoleBinding",
                "Role",
                "RoleBinding",
                "CustomResourceDefinition",
                "DeviceClass",
            ],
        );
    }

    let before: BTreeMap<_, _> = base.iter().map(|d| (key(d), d)).collect();
    let after: BTreeMap<_, _> = dra.iter().map(|d| (key(d), d)).collect();
    assert_eq!(after.len(), dra.len(), "one object per identity");
    let added: Vec<_> = after.keys().filter(|k| !before.contains_key(*k)).collect();
    let k = |kind: &str, ns: &str, name: &str| (kind.to_string(), ns.to_string(), name.to_string());
    assert_eq!(
        added,
        [
            &k("ClusterRole", "", "nodefabric-dra"),
            &k("ClusterRoleBinding", "", "nodefabric-dra"),
            &k("DaemonSet", "nodefabric", "nodefabric-dra"),
            &k("DeviceClass", "", "rdma.gpustack.ai"),
            &k("DeviceClass", "", "vf.rdma.gpustack.ai"),
            &k("ServiceAccount", "nodefabric", "nodefabric-dra"),
        ]
    );
    // The base is kept whole: the device plugin's placement is the one change.
    let plugin = k("DaemonSet", "nodefabric", "nodefabric-device-plugin");
    for (id, old) in &before {
        let new = after.get(id).unwrap_or_else(|| panic!("{id:?} dropped"));
        if *id == plugin {
            assert!(old["spec"]["template"]["spec"].get("affinity").is_none());
            let mut new = (*new).clone();
            let spec = new["spec"]["template"]["spec"].as_object_mut().unwrap();
            assert!(
                spec.remove("affinity").is_some(),
                "the patch adds an affinity"
            );
            assert_eq!(&&new, old, "the patch changes nothing else");
        } else {
            assert_eq!(new, old, "{id:?} changed");
        }
    }
    // What is applied is what the CEL tests below evaluate.
    for name in ["deviceclass-rdma.yaml", "deviceclass-vf.yaml"] {
        let source = file(&component(), name);
        let name = source["metadata"]["name"].as_str().unwrap();
        assert_eq!(find(&dra, "DeviceClass", name), &source, "{name}");
    }
}

// ---- placement -------------------------------------------------------------

/// Whether the scheduler may place `pod` on a node with `labels`: every
/// nodeSelector pair, and (when given) one of the required node-affinity
/// terms, each of whose expressions holds. `NotIn` and `DoesNotExist` hold
/// on a node without the label, as in Kubernetes.
fn runs_on(pod: &PodSpec, labels: &BTreeMap<&str, &str>) -> bool {
    let selector = pod
        .node_selector
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k.as_str()) == Some(&v.as_str()));
    let required = pod
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    let affinity = required.is_none_or(|r| {
        r.node_selector_terms.iter().any(|term| {
            assert!(term.match_fields.is_none(), "matchFields is not modelled");
            term.match_expressions.iter().flatten().all(|e| {
                let value = labels.get(e.key.as_str());
                let values = e.values.clone().unwrap_or_default();
                let listed = value.is_some_and(|v| values.iter().any(|x| x == v));
                match e.operator.as_str() {
                    "In" => listed,
                    "NotIn" => !listed,
                    "Exists" => value.is_some(),
                    "DoesNotExist" => value.is_none(),
                    other => panic!("operator {other} is not modelled"),
                }
            })
        })
    });
    selector && affinity
}

#[test]
fn the_device_plugin_and_the_dra_driver_never_share_a_node() {
    let test = "the_device_plugin_and_the_dra_driver_never_share_a_node";
    let (Some(base), Some(dra)) = (kustomize(test, &["deploy"], &[]), with_dra(test)) else {
        return;
    };
    let publisher = pod(&daemonset(&dra, "nodefabric"));
    let plugin = pod(&daemonset(&dra, "nodefabric-device-plugin"));
    let driver = pod(&daemonset(&dra, "nodefabric-dra"));
    let nodes: [(&str, BTreeMap<&str, &str>); 4] = [
        ("unlabelled", BTreeMap::new()),
        ("dra", BTreeMap::from([(ALLOCATOR_LABEL, "dra")])),
        (
            "dra, with other labels",
            BTreeMap::from([
                (ALLOCATOR_LABEL, "dra"),
                ("feature.gpustack.ai/rdma.capable", "true"),
            ]),
        ),
        (
            "another allocator named",
            BTreeMap::from([(ALLOCATOR_LABEL, "device-plugin")]),
        ),
    ];
    for (what, labels) in &nodes {
        let is_dra = labels.get(ALLOCATOR_LABEL) == Some(&"dra");
        assert!(
            runs_on(&publisher, labels),
            "{what}: the publisher writes the specs both read"
        );
        assert_eq!(runs_on(&driver, labels), is_dra, "{what}: the DRA driver");
        assert_eq!(
            runs_on(&plugin, labels),
            !is_dra,
            "{what}: the device plugin"
        );
    }
    // Without the component the device plugin does run on such a node:
    // the patch is what keeps it off.
    let unpatched = pod(&daemonset(&base, "nodefabric-device-plugin"));
    assert!(runs_on(&unpatched, &nodes[1].1));
    // Both tolerate the same taints, so no tainted node is left with neither.
    assert_eq!(driver.tolerations, plugin.tolerations);
}

/// The extended resources the rendered device plugin registers: its own
/// parser reads the DaemonSet's arguments (no environment variable of its
/// flags is set there, which the test checks).
fn plugin_resources(docs: &[Value]) -> BTreeSet<String> {
    use nodefabric::plugin::catalog::Resource;
    let spec = pod(&daemonset(docs, "nodefabric-device-plugin"));
    let c = &spec.containers[0];
    assert!(
        c.env
            .iter()
            .flatten()
            .all(|e| !e.name.starts_with("NODEFABRIC_")),
        "the plugin's flags are set as arguments"
    );
    let mut argv = c.command.clone().unwrap();
    argv.extend(c.args.clone().unwrap_or_default());
    let cli = nodefabric::plugin::cli::PluginCli::try_parse_from(&argv)
        .unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    Resource::ALL
        .into_iter()
        .filter(|r| match r {
            Resource::Exclusive => true,
            Resource::Shared => !cli.no_shared,
            Resource::Partitioned => !cli.no_partitioned,
        })
        .map(|r| format!("{}/{}", cli.resource_prefix, r.suffix()))
        .collect()
}

/// The extended resources the rendered DeviceClasses map to DRA.
fn class_resources(docs: &[Value]) -> BTreeMap<String, String> {
    docs.iter()
        .filter(|d| d["kind"] == "DeviceClass")
        .filter_map(|d| {
            let class: DeviceClass = typed("DeviceClass", d);
            Some((class.spec.extended_resource_name?, class.metadata.name?))
        })
        .collect()
}

#[test]
fn device_plugin_resource_names_map_to_the_classes_and_each_node_serves_one_source() {
    let test = "device_plugin_resource_names_map_to_the_classes_and_each_node_serves_one_source";
    let Some(dra) = with_dra(test) else {
        return;
    };
    let plugin = plugin_resources(&dra);
    let classes = class_resources(&dra);
    // A Pod written for the device plugin asks for these; on a DRA node
    // the class of the same name answers it.
    assert_eq!(
        classes,
        BTreeMap::from([
            (
                "device.gpustack.ai/rdma".to_string(),
                "rdma.gpustack.ai".to_string()
            ),
            (
                "device.gpustack.ai/rdma.partitioned".to_string(),
                "vf.rdma.gpustack.ai".to_string()
            ),
        ])
    );
    // rdma.shared has no class: DRA gives a NIC to one claim, so 64 Pods
    // asking rdma.shared would each need a NIC of their own.
    assert_eq!(
        plugin
            .difference(&classes.keys().cloned().collect())
            .collect::<Vec<_>>(),
        ["device.gpustack.ai/rdma.shared"]
    );
    for name in classes.keys() {
        assert!(plugin.contains(name), "{name}: the plugin serves it too");
    }
    // Each node gets each name from one source only: the plugin's
    // registration where the plugin runs, the class where the driver does.
    let plugin_pod = pod(&daemonset(&dra, "nodefabric-device-plugin"));
    let driver_pod = pod(&daemonset(&dra, "nodefabric-dra"));
    for labels in [
        BTreeMap::new(),
        BTreeMap::from([(ALLOCATOR_LABEL, "dra")]),
        BTreeMap::from([(ALLOCATOR_LABEL, "device-plugin")]),
    ] {
        let from_plugin: BTreeSet<&String> = if runs_on(&plugin_pod, &labels) {
            plugin.iter().collect()
        } else {
            BTreeSet::new()
        };
        let from_dra: BTreeSet<&String> = if runs_on(&driver_pod, &labels) {
            classes.keys().collect()
        } else {
            BTreeSet::new()
        };
        assert!(
            from_plugin.is_disjoint(&from_dra),
            "{labels:?}: {from_plugin:?} and {from_dra:?}"
        );
        for name in classes.keys() {
            assert!(
                from_plugin.contains(name) || from_dra.contains(name),
                "{labels:?}: nothing serves {name}"
            );
        }
    }
}

// ---- the driver's container ----------------------------------------------------

/// The container's `--name=value` flags.
fn flags(c: &Container) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for a in c.args.iter().flatten() {
        let (name, value) = a
            .strip_prefix("--")
            .and_then(|f| f.split_once('='))
            .unwrap_or_else(|| panic!("{a}: flags are written --name=value"));
        assert!(
            out.insert(name.to_string(), value.to_string()).is_none(),
            "--{name} given twice"
        );
    }
    out
}

/// The mount at exactly `path`.
fn mount<'a>(c: &'a Container, path: &str) -> &'a VolumeMount {
    c.volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path == path)
        .unwrap_or_else(|| panic!("{}: nothing mounted at {path}", c.name))
}

/// The host path of `m`'s volume.
fn host_of(pod: &PodSpec, m: &VolumeMount) -> String {
    pod.volumes
        .iter()
        .flatten()
        .find(|v| v.name == m.name)
        .and_then(|v| v.host_path.as_ref())
        .unwrap_or_else(|| panic!("volume {} is not a hostPath", m.name))
        .path
        .clone()
}

/// The host file a container's `path` is, through the deepest mount that
/// holds it, and whether that mount is read-only.
fn on_host(pod: &PodSpec, c: &Container, path: &Path) -> (PathBuf, bool) {
    let m = c
        .volume_mounts
        .iter()
        .flatten()
        .filter(|m| path.starts_with(&m.mount_path))
        .max_by_key(|m| m.mount_path.len())
        .unwrap_or_else(|| panic!("{}: {} is not mounted", c.name, path.display()));
    let rest = path.strip_prefix(&m.mount_path).unwrap();
    (
        Path::new(&host_of(pod, m)).join(rest),
        m.read_only == Some(true),
    )
}

/// The `--rails-file=` path a manifest's comment tells the reader to add.
fn commented_rails_file(text: &str, file: &str) -> PathBuf {
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with('#') && l.contains("- --rails-file="))
        .unwrap_or_else(|| panic!("{file}: no commented --rails-file"));
    PathBuf::from(line.split("--rails-file=").nth(1).unwrap().trim())
}

#[test]
fn the_dra_driver_mounts_the_folders_its_flags_name_at_the_hosts_own_paths() {
    let Some(dra) =
        with_dra("the_dra_driver_mounts_the_folders_its_flags_name_at_the_hosts_own_paths")
    else {
        return;
    };
    let ds = daemonset(&dra, "nodefabric-dra");
    let spec = pod(&ds);
    assert_eq!(spec.containers.len(), 1);
    let c = &spec.containers[0];
    assert_eq!(
        c.command.as_deref(),
        Some(&["/usr/local/bin/nodefabric-dra".to_string()][..])
    );
    let f = flags(c);
    assert_eq!(
        f.keys().map(String::as_str).collect::<Vec<_>>(),
        [
            "cdi-dir",
            "driver-name",
            "interval",
            "kubelet-root-dir",
            "metrics-addr",
            "node-name",
            "rails-file",
            "state-dir"
        ]
    );
    // The driver's own parser takes the arguments as kubelet passes them.
    let mut argv = c.command.clone().unwrap();
    argv.extend(c.args.clone().unwrap_or_default());
    let parsed = nodefabric::dra::cli::DraCli::try_parse_from(
        argv.iter().map(|a| a.replace("$(NODE_NAME)", "node-a")),
    )
    .unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    let config = parsed.config();
    assert_eq!(config.site.cdi_dir, PathBuf::from(&f["cdi-dir"]));
    assert_eq!(config.interval, std::time::Duration::from_secs(30));
    assert_eq!(
        config.rails_file.as_deref(),
        Some(Path::new(&f["rails-file"]))
    );
    assert_eq!(f["interval"], "30s");
    assert_eq!(f["driver-name"], DEFAULT_DRIVER);
    // $(NODE_NAME) is expanded by kubelet from the container's own env.
    assert_eq!(f["node-name"], "$(NODE_NAME)");
    let node_name = c
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "NODE_NAME")
        .and_then(|e| e.value_from.as_ref())
        .and_then(|v| v.field_ref.as_ref())
        .map(|f| f.field_path.as_str());
    assert_eq!(node_name, Some("spec.nodeName"));

    // kubelet dials the sockets at the paths the driver names from inside
    // its container, and the runtime reads the claim's CDI spec from the
    // host: each folder is mounted read-write at the host's own path.
    let root = Path::new(&f["kubelet-root-dir"]);
    let written = [
        root.join("plugins_registry"),
        root.join("plugins"),
        PathBuf::from(&f["cdi-dir"]),
        PathBuf::from(&f["state-dir"]),
    ];
    for dir in &written {
        let dir = dir.to_str().unwrap();
        let m = mount(c, dir);
        assert_ne!(m.read_only, Some(true), "{dir} is written");
        assert_eq!(host_of(&spec, m), dir, "{dir}: mounted at the host's path");
    }
    let writable: BTreeSet<String> = c
        .volume_mounts
        .iter()
        .flatten()
        .filter(|m| m.read_only != Some(true))
        .map(|m| m.mount_path.clone())
        .collect();
    assert_eq!(
        writable,
        written
            .iter()
            .map(|p| p.display().to_string())
            .collect::<BTreeSet<_>>(),
        "nothing else is writable"
    );

    // The CDI folder is the one the publisher writes; the driver's state is
    // a folder of its own, not the publisher's.
    let publisher_ds = daemonset(&dra, "nodefabric");
    let publisher = pod(&publisher_ds);
    let pc = &publisher.containers[0];
    let mut argv = pc.command.clone().unwrap();
    argv.extend(pc.args.clone().unwrap_or_default());
    let Sub::Publish(p) = Cli::try_parse_from(&argv).unwrap().command else {
        panic!("the publisher runs publish")
    };
    assert_eq!(
        on_host(&spec, c, Path::new(&f["cdi-dir"])).0,
        on_host(&publisher, pc, &p.cdi_dir).0
    );
    assert_ne!(
        on_host(&spec, c, Path::new(&f["state-dir"])).0,
        on_host(&publisher, pc, &p.state_dir).0
    );

    // The rail record: the path the publisher's comment offers is, in the
    // driver's container, the same host file through a read-only mount,
    // and the driver's comment names that path, so turning the `rail`
    // attribute on is one flag on each side.
    let publisher_text = fs::read_to_string(repo().join("deploy/nodefabric.yaml")).unwrap();
    let rails = commented_rails_file(&publisher_text, "nodefabric.yaml");
    assert_eq!(Path::new(&f["rails-file"]), rails);
    let (written_to, publisher_ro) = on_host(&publisher, pc, &rails);
    assert!(!publisher_ro, "the publisher writes it");
    assert_eq!(on_host(&spec, c, &rails), (written_to, true));

    // Probes and metrics on the declared port.
    let port: std::net::SocketAddr = f["metrics-addr"].parse().unwrap();
    let declared = c
        .ports
        .iter()
        .flatten()
        .find(|p| p.container_port == i32::from(port.port()))
        .expect("the metrics port is declared");
    for (probe, path) in [
        (&c.liveness_probe, "/healthz"),
        (&c.readiness_probe, "/readyz"),
    ] {
        let get = probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .unwrap_or_else(|| panic!("{path}: an HTTP probe"));
        assert_eq!(get.path.as_deref(), Some(path));
        assert_eq!(
            get.port,
            IntOrString::String(declared.name.clone().unwrap()),
            "{path}"
        );
    }

    // The same house rules as the base's DaemonSets.
    assert_eq!(
        spec.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(
        sc.capabilities.as_ref().and_then(|c| c.drop.clone()),
        Some(vec!["ALL".to_string()])
    );
    assert!(c
        .resources
        .as_ref()
        .and_then(|r| r.limits.as_ref())
        .is_some_and(|l| l.contains_key("memory")));

    // The image holds every binary a rendered container runs.
    let containerfile = fs::read_to_string(repo().join("deploy/Containerfile")).unwrap();
    let copy = containerfile
        .lines()
        .find(|l| l.starts_with("COPY --from=build"))
        .unwrap();
    for doc in dra.iter().filter(|d| d["kind"] == "DaemonSet") {
        let ds: DaemonSet = typed("DaemonSet", doc);
        for c in pod(&ds).containers {
            let bin = c.command.unwrap()[0].clone();
            let name = Path::new(&bin).file_name().unwrap().to_str().unwrap();
            assert!(
                copy.contains(&format!("/target/release/{name} ")),
                "deploy/Containerfile does not copy {name}: {copy}"
            );
        }
    }
}

// ---- RBAC ----------------------------------------------------------------------

#[test]
fn the_dra_account_may_write_its_slices_get_claims_nodes_and_pods_and_nothing_else() {
    let Some(dra) =
        with_dra("the_dra_account_may_write_its_slices_get_claims_nodes_and_pods_and_nothing_else")
    else {
        return;
    };
    let rbac = Rbac::from_docs(&dra);
    let ds = daemonset(&dra, "nodefabric-dra");
    let ns = ds.metadata.namespace.clone().unwrap();
    let account = pod(&ds).service_account_name.unwrap();
    let me = (ns.as_str(), account.as_str());
    let slices = [
        "get", "list", "watch", "create", "update", "patch", "delete",
    ];
    let group = "resource.k8s.io";
    assert_eq!(
        verbs(&rbac, me, group, "resourceslices", None, None),
        slices
    );
    assert_eq!(
        verbs(
            &rbac,
            me,
            group,
            "resourceslices",
            None,
            Some("node-a-rdma-x")
        ),
        slices
    );
    for ns in ["default", "team-a"] {
        assert_eq!(
            verbs(&rbac, me, group, "resourceclaims", Some(ns), Some("c")),
            ["get"],
            "claims in any namespace"
        );
    }
    assert_eq!(verbs(&rbac, me, "", "nodes", None, Some("node-a")), ["get"]);
    // The pods a claim is reserved for, in any namespace, one by name: their
    // containers' other claims make NCCL_IB_HCA.
    for ns in ["default", "team-a"] {
        assert_eq!(
            verbs(&rbac, me, "", "pods", Some(ns), Some("job-0")),
            ["get"]
        );
    }
    for (group, resource, ns) in [
        ("resource.k8s.io", "resourceclaims/status", Some("default")),
        ("resource.k8s.io", "deviceclasses", None),
        ("resource.k8s.io", "resourceclaimtemplates", Some("default")),
        ("", "pods/exec", Some("default")),
        ("", "secrets", Some("nodefabric")),
        ("", "configmaps", Some("nodefabric")),
        ("", "nodes/status", None),
        ("", "resourceslices", None),
    ] {
        assert!(
            verbs(&rbac, me, group, resource, ns, None).is_empty(),
            "{group}/{resource}"
        );
    }
    // The other accounts gain nothing in resource.k8s.io.
    let publisher = pod(&daemonset(&dra, "nodefabric"))
        .service_account_name
        .unwrap();
    assert!(verbs(
        &rbac,
        ("nodefabric", publisher.as_str()),
        group,
        "resourceslices",
        None,
        None
    )
    .is_empty());
}

// ---- CEL: the node, its published devices, and the allocator's view --------------

/// A node with one endpoint of each kind the classes tell apart, published
/// by the real `nodefabric publish` with a rail record (rail port by RDMA
/// device name: mlx5_N is on railN; VFs are never rail ports):
///
/// | RDMA device | PCI | PCIe root | NUMA | link | |
/// |---|---|---|---|---|---|
/// | mlx5_0 | 0000:04:00.0 | pci0000:00 | 0 | up | under the GPU's switch |
/// | mlx5_1 | 0000:81:00.0 | pci0000:80 | 1 | up | |
/// | mlx5_2 | 0000:41:00.0 | pci0000:40 | 0 | down | Failed |
/// | mlx5_3 | 0000:61:00.0 | pci0000:60 | 1 | one port down, one unreadable | Unverified |
/// | mlx5_4 | 0000:c1:00.2 | pci0000:c0 | 1 | up | a VF of 0000:c1:00.0 |
/// | mlx5_5 | 0000:c1:00.3 | pci0000:c0 | 1 | down | a VF of 0000:c1:00.0, Failed |
///
/// and two GPUs: [`GPU`] on pci0000:00 (NUMA 0) beside mlx5_0, and
/// [`GPU1`] alone on pci0000:a0 (NUMA 1), whose nearest NIC is mlx5_1 on
/// its NUMA node.
pub(crate) struct Node {
    _dir: tempfile::TempDir,
    sys: PathBuf,
    /// The published specs, as the driver's loader reads them.
    pub(crate) specs: Published,
    /// The rail record the publisher wrote.
    pub(crate) rails: RailRecord,
}

/// The GPU's PCI address on [`Node`].
pub(crate) const GPU: &str = "0000:03:00.0";

/// The second GPU's PCI address on [`Node`]: no NIC on its PCIe root.
pub(crate) const GPU1: &str = "0000:a2:00.0";

/// The fixture node of [`Node`], published by the real `nodefabric publish`.
pub(crate) fn node() -> Node {
    let dir = tempfile::tempdir().unwrap();
    let sys = dir.path().join("sys");
    let t = Tree::new(&sys);
    t.rdma_cm();
    let nic = |chain: &[&str],
               device: u16,
               netdev: &str,
               up: bool,
               ibdev: &str,
               ports: &[(&str, &str)],
               numa: i32| {
        let d = t.pci(chain, fixtures::MELLANOX, device, fixtures::CLASS_ETH, numa);
        t.netdev(&d, netdev, 9000, up);
        t.rdma(&d, ibdev, ports);
        d
    };
    let (rp, sw) = (addr(0x00, 1, 0), addr(0x01, 0, 0));
    let gpu = [rp.as_str(), &sw, &addr(0x02, 0, 0), GPU];
    t.pci(&gpu, fixtures::NVIDIA, 0x2330, fixtures::CLASS_3D, 0);
    let gpu1 = [addr(0xa0, 1, 0), addr(0xa1, 0, 0), GPU1.to_string()];
    t.pci(
        &[&gpu1[0], &gpu1[1], &gpu1[2]],
        fixtures::NVIDIA,
        0x2330,
        fixtures::CLASS_3D,
        1,
    );
    let beside = [rp.as_str(), &sw, &addr(0x02, 1, 0), &addr(0x04, 0, 0)];
    nic(
        &beside,
        0x1021,
        "enp4s0np0",
        true,
        "mlx5_0",
        &[fixtures::UP],
        0,
    );
    let other = [addr(0x80, 1, 0), addr(0x81, 0, 0)];
    nic(
        &[&other[0], &other[1]],
        0x1021,
        "enp129s0np0",
        true,
        "mlx5_1",
        &[fixtures::UP],
        1,
    );
    let down = [addr(0x40, 1, 0), addr(0x41, 0, 0)];
    nic(
        &[&down[0], &down[1]],
        0x1017,
        "enp65s0np0",
        false,
        "mlx5_2",
        &[fixtures::DOWN],
        0,
    );
    let unread = [addr(0x60, 1, 0), addr(0x61, 0, 0)];
    let d = nic(
        &[&unread[0], &unread[1]],
        0x1017,
        "enp97s0np0",
        true,
        "mlx5_3",
        &[fixtures::DOWN, fixtures::DOWN],
        1,
    );
    let state = format!("{d}/infiniband/mlx5_3/ports/2/state");
    fs::remove_file(sys.join(&state)).unwrap();
    t.raw_link(&state, "state.gone");
    let sriov_rp = addr(0xc0, 1, 0);
    let pf = t.pci(
        &[&sriov_rp, &addr(0xc1, 0, 0)],
        fixtures::MELLANOX,
        0x101d,
        fixtures::CLASS_ETH,
        1,
    );
    t.netdev(&pf, "enp193s0f0np0", 9000, true);
    let mut vfs = Vec::new();
    for (func, ibdev, up) in [(2, "mlx5_4", true), (3, "mlx5_5", false)] {
        let vf = t.pci(
            &[&sriov_rp, &addr(0xc1, 0, func)],
            fixtures::MELLANOX,
            0x101e,
            fixtures::CLASS_ETH,
            1,
        );
        t.netdev(&vf, &format!("enp193s0f0v{}", func - 2), 9000, up);
        let port = if up { fixtures::UP } else { fixtures::DOWN };
        t.rdma(&vf, ibdev, &[port]);
        vfs.push(vf);
    }
    t.sriov(&pf, 8, &vfs);

    let cdi = dir.path().join("cdi");
    let rails_file = dir.path().join("state/rails.json");
    let out = Command::new(env!("CARGO_BIN_EXE_nodefabric"))
        .args(["publish", "--sysfs-root"])
        .arg(&sys)
        .arg("--features-dir")
        .arg(dir.path().join("features"))
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .arg("--cdi-dir")
        .arg(&cdi)
        .arg("--rails-file")
        .arg(&rails_file)
        .args([
            "--rail-source",
            "interface-name",
            "--interface-regex",
            "^mlx5_([0-9]+)$",
            "--rail-id",
            "rail$1",
            "--sysfs-paths",
        ])
        .env("PATH", "/nonexistent") // no host tool is run
        .env("NODEFABRIC_NOW", "2026-03-01T12:00:00Z")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "publish: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The driver's own reader of the CDI folder.
    let loaded = Loader::new(cdi, 1 << 20).load();
    assert!(loaded.unreadable.is_empty(), "{:?}", loaded.unreadable);
    let specs: Published = loaded
        .changed
        .into_iter()
        .filter_map(|(family, change)| match change {
            Change::Spec { path, spec } => Some((family, (path, spec))),
            Change::Gone => None,
        })
        .collect();
    let rails: RailRecord = serde_json::from_str(&fs::read_to_string(&rails_file).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", rails_file.display()));
    Node {
        _dir: dir,
        sys,
        specs,
        rails,
    }
}

/// A device as the scheduler's allocator sees it in a ResourceSlice.
#[derive(Debug, Clone)]
pub(crate) struct Candidate {
    /// What the assertions call it: the RDMA device, or `gpu`.
    pub(crate) label: String,
    pub(crate) driver: String,
    /// Attribute name as published: `resource.kubernetes.io/pcieRoot`, or
    /// bare (`linkState`), which is in the driver's domain.
    pub(crate) attributes: BTreeMap<String, Attribute>,
}

impl Candidate {
    /// The attribute under its fully qualified name.
    pub(crate) fn qualified(&self, name: &str) -> Option<&Attribute> {
        self.attributes.iter().find_map(|(n, v)| {
            let full = if n.contains('/') {
                n.clone()
            } else {
                format!("{}/{n}", self.driver)
            };
            (full == name).then_some(v)
        })
    }
}

impl Node {
    /// The devices the driver publishes (rail attributes only with the rail
    /// record), and NVIDIA's driver's device for the GPU.
    pub(crate) fn candidates(&self, with_rails: bool) -> Vec<Candidate> {
        let pool = devices::pool(&self.specs, with_rails.then_some(&self.rails));
        assert!(pool.refused.is_empty(), "{:?}", pool.refused);
        let mut out: Vec<Candidate> = pool
            .devices
            .iter()
            .map(|d| Candidate {
                label: d.rdma_device.clone(),
                driver: DEFAULT_DRIVER.to_string(),
                attributes: d.attributes.clone(),
            })
            .collect();
        out.push(self.gpu());
        out
    }

    /// The GPU beside mlx5_0 as NVIDIA's DRA driver publishes it.
    pub(crate) fn gpu(&self) -> Candidate {
        self.gpu_at(GPU, "gpu")
    }

    /// The GPU at `pci` as NVIDIA's DRA driver publishes it; its pcieRoot
    /// found the way Kubernetes' deviceattribute helper finds it (the
    /// `pciDDDD:BB` element of the device's resolved sysfs path), its NUMA
    /// node the kernel's `numa_node`.
    pub(crate) fn gpu_at(&self, pci: &str, label: &str) -> Candidate {
        let dev = self.sys.join("bus/pci/devices").join(pci);
        let numa: i64 = fs::read_to_string(dev.join("numa_node"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let link = fs::read_link(&dev).unwrap();
        let root = link
            .components()
            .filter_map(|c| c.as_os_str().to_str())
            .find(|c| c.starts_with("pci"))
            .unwrap()
            .to_string();
        Candidate {
            label: label.into(),
            driver: GPU_CLASS.into(),
            attributes: BTreeMap::from([
                ("type".into(), Attribute::String("gpu".into())),
                (attributes::PCIE_ROOT.into(), Attribute::String(root)),
                (attributes::PCI_BUS_ID.into(), Attribute::String(pci.into())),
                (attributes::NUMA_NODE.into(), Attribute::Int(numa)),
            ]),
        }
    }
}

/// Every domain `expr` looks up in `device.attributes`.
fn domains(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for part in expr.split("attributes[").skip(1) {
        let quote = part.chars().next().unwrap();
        assert!(quote == '"' || quote == '\'', "{expr}: a literal domain");
        out.insert(part[1..].split(quote).next().unwrap().to_string());
    }
    out
}

/// The `device` variable of a selector, as Kubernetes builds it: names
/// with a domain under it, bare names under the driver's, and every domain
/// the expression names but the device lacks an empty map (Kubernetes'
/// attribute map answers any unknown domain so).
fn cel_device(c: &Candidate, expr: &str) -> cel::Value {
    let mut by_domain: BTreeMap<String, HashMap<String, cel::Value>> = domains(expr)
        .into_iter()
        .map(|d| (d, HashMap::new()))
        .collect();
    for (name, value) in &c.attributes {
        let (domain, id) = name
            .split_once('/')
            .unwrap_or((c.driver.as_str(), name.as_str()));
        let value = match value {
            Attribute::Bool(b) => cel::Value::Bool(*b),
            Attribute::Int(i) => cel::Value::Int(*i),
            Attribute::String(s) => cel::Value::from(s.clone()),
        };
        by_domain
            .entry(domain.to_string())
            .or_default()
            .insert(id.to_string(), value);
    }
    let attributes: HashMap<String, cel::Value> = by_domain
        .into_iter()
        .map(|(d, m)| (d, cel::Value::from(m)))
        .collect();
    cel::Value::from(HashMap::from([
        ("driver".to_string(), cel::Value::from(c.driver.clone())),
        ("attributes".to_string(), cel::Value::from(attributes)),
        (
            "capacity".to_string(),
            cel::Value::from(HashMap::<String, cel::Value>::new()),
        ),
    ]))
}

/// One selector on one device: its verdict, or the evaluation error.
pub(crate) fn eval(expr: &str, c: &Candidate) -> Result<bool, String> {
    let program = cel::Program::compile(expr).unwrap_or_else(|e| panic!("{expr}: {e}"));
    let mut ctx = cel::Context::default();
    ctx.add_variable_from_value("device", cel_device(c, expr));
    match program.execute(&ctx) {
        Ok(cel::Value::Bool(b)) => Ok(b),
        Ok(other) => Err(format!("the result {other:?} is not a bool")),
        Err(e) => Err(e.to_string()),
    }
}

/// The CEL expressions of a list of selectors, in order.
pub(crate) fn expressions(selectors: &Option<Vec<DeviceSelector>>) -> Vec<String> {
    selectors
        .iter()
        .flatten()
        .map(|s| s.cel.as_ref().expect("a CEL selector").expression.clone())
        .collect()
}

/// The component's DeviceClasses, and a stand-in for NVIDIA's GPU class
/// (its driver and device type), which the GPU example names.
pub(crate) fn classes() -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    for name in ["deviceclass-rdma.yaml", "deviceclass-vf.yaml"] {
        let class: DeviceClass = typed(name, &file(&component(), name));
        out.insert(
            class.metadata.name.unwrap(),
            expressions(&class.spec.selectors),
        );
    }
    out.insert(
        GPU_CLASS.to_string(),
        vec![format!(
            "device.driver == \"{GPU_CLASS}\" && device.attributes[\"{GPU_CLASS}\"].type == \"gpu\""
        )],
    );
    out
}

/// What a request may get, decided as Kubernetes' allocator does: the
/// class's selectors, then the request's, in order, the first false ending
/// it; an evaluation error on any device aborts the allocation (`Err`, in
/// the allocator's words).
pub(crate) fn selected<'a>(
    classes: &BTreeMap<String, Vec<String>>,
    class: &str,
    request: &[String],
    devices: &'a [Candidate],
) -> Result<Vec<&'a Candidate>, String> {
    let of_class = classes
        .get(class)
        .unwrap_or_else(|| panic!("no DeviceClass {class}"));
    let mut out = Vec::new();
    'device: for d in devices {
        let steps = of_class
            .iter()
            .enumerate()
            .map(|(i, e)| (format!("class {class}: selector #{i}"), e))
            .chain(
                request
                    .iter()
                    .enumerate()
                    .map(|(i, e)| (format!("claim: selector #{i}"), e)),
            );
        for (what, expr) in steps {
            match eval(expr, d) {
                Ok(true) => {}
                Ok(false) => continue 'device,
                Err(e) => return Err(format!("{what}: CEL runtime error: {e}")),
            }
        }
        out.push(d);
    }
    Ok(out)
}

/// The devices' labels, sorted.
pub(crate) fn labels(devices: &[&Candidate]) -> Vec<String> {
    let mut v: Vec<String> = devices.iter().map(|d| d.label.clone()).collect();
    v.sort();
    v
}

/// Every allocation of a claim template's requests (one device each, none
/// twice) that its constraints allow, as lists of labels in request order:
/// `matchAttribute` holds when every device has the attribute and the
/// values are equal.
fn allocations(
    template: &ResourceClaimTemplate,
    classes: &BTreeMap<String, Vec<String>>,
    devices: &[Candidate],
    with_constraints: bool,
) -> Result<Vec<Vec<String>>, String> {
    let claim = template.spec.spec.devices.as_ref().unwrap();
    let mut per_request = Vec::new();
    for r in claim.requests.iter().flatten() {
        let exact = r.exactly.as_ref().expect("an exact request");
        assert_eq!(
            exact.count.unwrap_or(1),
            1,
            "one device per request is modelled"
        );
        per_request.push((
            r.name.clone(),
            selected(
                classes,
                &exact.device_class_name,
                &expressions(&exact.selectors),
                devices,
            )?,
        ));
    }
    let mut combos: Vec<Vec<&Candidate>> = vec![vec![]];
    for (_, options) in &per_request {
        let mut longer = Vec::new();
        for chosen in &combos {
            for o in options {
                if !chosen.iter().any(|c| c.label == o.label) {
                    let mut next = chosen.clone();
                    next.push(*o);
                    longer.push(next);
                }
            }
        }
        combos = longer;
    }
    let constraints = if with_constraints {
        claim.constraints.clone().unwrap_or_default()
    } else {
        vec![]
    };
    let index = |name: &str| {
        per_request
            .iter()
            .position(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("a constraint names request {name}, which is not there"))
    };
    Ok(combos
        .into_iter()
        .filter(|combo| {
            constraints.iter().all(|c| {
                let attr = c.match_attribute.as_deref().expect("matchAttribute");
                let values: Vec<Option<&Attribute>> = c
                    .requests
                    .iter()
                    .flatten()
                    .map(|r| combo[index(r)].qualified(attr))
                    .collect();
                values.iter().all(Option::is_some) && values.windows(2).all(|w| w[0] == w[1])
            })
        })
        .map(|combo| combo.iter().map(|d| d.label.clone()).collect())
        .collect())
}

/// An example claim template as its typed object (no unknown field).
pub(crate) fn example(name: &str) -> ResourceClaimTemplate {
    typed(name, &file(&examples(), name))
}

/// Every example in deploy/examples/dra/, sorted.
pub(crate) const EXAMPLES: [&str; 5] = [
    "gpu-and-nearest-nic.yaml",
    "gpu-and-nic-numa.yaml",
    "gpu-and-nic.yaml",
    "nic-on-rail.yaml",
    "one-nic.yaml",
];

/// Every CEL expression of an example's requests, `exactly` or a
/// `firstAvailable` subrequest.
fn example_expressions(name: &str) -> Vec<String> {
    let mut out = Vec::new();
    for r in example(name).spec.spec.devices.unwrap().requests.unwrap() {
        if let Some(exact) = &r.exactly {
            out.extend(expressions(&exact.selectors));
        }
        for sub in r.first_available.iter().flatten() {
            out.extend(expressions(&sub.selectors));
        }
    }
    out
}

/// Every `(domain, name)` a CEL expression reads as
/// `device.attributes["domain"].name`; an `attributes[` in any other shape
/// fails the test, so no lookup escapes the check.
fn attribute_names(expr: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for part in expr.split("attributes[").skip(1) {
        let quote = part.chars().next().unwrap();
        let rest = &part[1..];
        let (domain, rest) = rest
            .split_once(quote)
            .unwrap_or_else(|| panic!("{expr}: a literal domain"));
        let rest = rest.strip_prefix("].").unwrap_or_else(|| {
            panic!("{expr}: `attributes[\"{domain}\"]` not followed by `.name`")
        });
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        assert!(!name.is_empty(), "{expr}");
        out.push((domain.to_string(), name));
    }
    out
}

#[test]
fn the_shipped_classes_and_examples_name_only_the_attributes_the_driver_publishes() {
    // Attribute names live in nodefabric::dra::attributes; a selector or a
    // constraint naming anything else would read a name no device has
    // (aborting the claim's allocation) or pair nothing.
    let mut named: Vec<(String, String, String)> = Vec::new();
    for file_name in ["deviceclass-rdma.yaml", "deviceclass-vf.yaml"] {
        let class: DeviceClass = typed(file_name, &file(&component(), file_name));
        for e in expressions(&class.spec.selectors) {
            for (d, n) in attribute_names(&e) {
                named.push((file_name.into(), d, n));
            }
        }
    }
    for name in EXAMPLES {
        for e in example_expressions(name) {
            for (d, n) in attribute_names(&e) {
                named.push((name.into(), d, n));
            }
        }
        let claim = example(name).spec.spec.devices.unwrap();
        for c in claim.constraints.iter().flatten() {
            let attr = c.match_attribute.clone().unwrap();
            let (d, n) = attr.split_once('/').expect("a qualified matchAttribute");
            named.push((name.into(), d.into(), n.into()));
        }
    }
    assert!(named.len() >= 10, "{named:?}");
    for (file, domain, name) in &named {
        assert!(
            attributes::is_published(DEFAULT_DRIVER, domain, name),
            "{file}: {domain}/{name} is not in nodefabric::dra::attributes"
        );
    }
    // The rule itself: a misspelt name or a foreign domain is refused.
    for (d, n) in attribute_names(
        r#"device.attributes["rdma.gpustack.ai"].linkstate == "OK" && device.attributes["resource.kubernetes.io"].numa == 0"#,
    ) {
        assert!(!attributes::is_published(DEFAULT_DRIVER, &d, &n), "{d}/{n}");
    }
}

#[test]
fn the_fixture_publishes_one_device_of_each_kind_the_classes_tell_apart() {
    // The CEL tests below stand on these facts of the published pool.
    let n = node();
    let attr =
        |c: &Candidate, name: &str| c.qualified(&format!("{DEFAULT_DRIVER}/{name}")).cloned();
    let s = |v: &str| Some(Attribute::String(v.into()));
    let all = n.candidates(true);
    let got: Vec<_> = all
        .iter()
        .filter(|c| c.driver == DEFAULT_DRIVER)
        .map(|c| {
            (
                c.label.as_str(),
                attr(c, "linkState"),
                attr(c, "virtualFunction"),
                attr(c, "rail"),
                c.qualified("resource.kubernetes.io/pcieRoot").cloned(),
            )
        })
        .collect();
    let vf = |b| Some(Attribute::Bool(b));
    assert_eq!(
        got,
        [
            ("mlx5_0", s("OK"), vf(false), s("rail0"), s("pci0000:00")),
            (
                "mlx5_2",
                s("Failed"),
                vf(false),
                s("rail2"),
                s("pci0000:40")
            ),
            (
                "mlx5_3",
                s("Unverified"),
                vf(false),
                s("rail3"),
                s("pci0000:60")
            ),
            ("mlx5_1", s("OK"), vf(false), s("rail1"), s("pci0000:80")),
            ("mlx5_4", s("OK"), vf(true), None, s("pci0000:c0")),
            ("mlx5_5", s("Failed"), vf(true), None, s("pci0000:c0")),
        ]
    );
    assert!(n
        .candidates(false)
        .iter()
        .all(|c| c.qualified(&format!("{DEFAULT_DRIVER}/rail")).is_none()));
    assert_eq!(
        n.gpu().qualified("resource.kubernetes.io/pcieRoot"),
        s("pci0000:00").as_ref(),
        "the GPU shares mlx5_0's root"
    );
    // Every NIC carries its NUMA node under the standard name, which the
    // GPU driver publishes too, and under the driver's own name.
    let numa: Vec<_> = all
        .iter()
        .filter(|c| c.driver == DEFAULT_DRIVER)
        .map(|c| {
            let own = attr(c, attributes::OWN_NUMA_NODE);
            assert_eq!(
                c.qualified(attributes::NUMA_NODE).cloned(),
                own,
                "{}",
                c.label
            );
            (c.label.as_str(), own)
        })
        .collect();
    let i = |v| Some(Attribute::Int(v));
    assert_eq!(
        numa,
        [
            ("mlx5_0", i(0)),
            ("mlx5_2", i(0)),
            ("mlx5_3", i(1)),
            ("mlx5_1", i(1)),
            ("mlx5_4", i(1)),
            ("mlx5_5", i(1)),
        ]
    );
    let gpu1 = n.gpu_at(GPU1, "gpu1");
    assert_eq!(
        gpu1.qualified(attributes::PCIE_ROOT),
        s("pci0000:a0").as_ref()
    );
    assert_eq!(gpu1.qualified(attributes::NUMA_NODE), i(1).as_ref());
    assert_eq!(n.gpu().qualified(attributes::NUMA_NODE), i(0).as_ref());
}

#[test]
fn the_device_classes_take_healthy_whole_interfaces_and_healthy_vfs_and_nothing_else() {
    let n = node();
    let classes = classes();
    for with_rails in [true, false] {
        let devices = n.candidates(with_rails);
        let take = |class: &str| labels(&selected(&classes, class, &[], &devices).unwrap());
        // Failed (mlx5_2, the VF mlx5_5) and Unverified (mlx5_3) in
        // neither; the GPU in neither.
        assert_eq!(take("rdma.gpustack.ai"), ["mlx5_0", "mlx5_1"]);
        assert_eq!(take("vf.rdma.gpustack.ai"), ["mlx5_4"]);
        assert_eq!(take(GPU_CLASS), ["gpu"]);
    }
}

#[test]
fn the_claim_examples_allocate_exactly_the_devices_they_describe() {
    let n = node();
    let classes = classes();
    let devices = n.candidates(true);
    let alloc = |name: &str, devices: &[Candidate], constraints: bool| {
        allocations(&example(name), &classes, devices, constraints)
            .unwrap_or_else(|e| panic!("{name}: {e}"))
    };
    let v = |items: &[&[&str]]| -> Vec<Vec<String>> {
        items
            .iter()
            .map(|a| a.iter().map(|s| s.to_string()).collect())
            .collect()
    };
    assert_eq!(
        alloc("one-nic.yaml", &devices, true),
        v(&[&["mlx5_0"], &["mlx5_1"]])
    );
    // The rail selector: only the NIC the rail record puts on rail0 ...
    assert_eq!(alloc("nic-on-rail.yaml", &devices, true), v(&[&["mlx5_0"]]));
    // ... and with no rail record nothing, without aborting the claim.
    assert_eq!(
        alloc("nic-on-rail.yaml", &n.candidates(false), true),
        Vec::<Vec<String>>::new()
    );
    // The GPU and the NIC on its PCIe root; without the constraint, the
    // other healthy NIC would do too: the constraint is what pairs them.
    assert_eq!(
        alloc("gpu-and-nic.yaml", &devices, true),
        v(&[&["gpu", "mlx5_0"]])
    );
    assert_eq!(
        alloc("gpu-and-nic.yaml", &devices, false),
        v(&[&["gpu", "mlx5_0"], &["gpu", "mlx5_1"]])
    );
}

#[test]
fn a_rail_selector_without_has_aborts_the_claim_when_a_nic_has_no_rail() {
    // Why the example guards the lookup: a healthy NIC on no rail has no
    // `rail` attribute, and reading it is an error that aborts the
    // allocation (Kubernetes: "CEL runtime error"), not a non-match.
    let n = node();
    let bare = r#"device.attributes["rdma.gpustack.ai"].rail == "rail0""#.to_string();
    let err = selected(
        &classes(),
        "rdma.gpustack.ai",
        std::slice::from_ref(&bare),
        &n.candidates(false),
    )
    .unwrap_err();
    assert!(
        err.contains("claim: selector #0: CEL runtime error"),
        "{err}"
    );
    assert!(err.to_lowercase().contains("no such key: rail"), "{err}");
    // With every NIC on a rail the same selector works: the guard is for the node without.
    let on_rails = n.candidates(true);
    let ok = selected(&classes(), "rdma.gpustack.ai", &[bare], &on_rails).unwrap();
    assert_eq!(labels(&ok), ["mlx5_0"]);
}

#[test]
fn a_misspelt_attribute_or_domain_aborts_the_allocation_instead_of_matching() {
    let n = node();
    let devices = n.candidates(true);
    let rdma = classes()["rdma.gpustack.ai"][0].clone();
    let cases: [(String, &[&str]); 3] = [
        (rdma.replace("linkState", "linkstate"), &["linkstate"]),
        (
            rdma.replace("virtualFunction", "virtualfunction"),
            &["virtualfunction"],
        ),
        // An unknown domain reads as an empty map, so each lookup in it
        // fails (which one CEL reports of two failing sides of `&&` is the
        // implementation's choice).
        (
            rdma.replace(
                "attributes[\"rdma.gpustack.ai\"]",
                "attributes[\"rdma.gpustack.io\"]",
            ),
            &["linkState", "virtualFunction"],
        ),
    ];
    for (wrong, missing) in cases {
        assert_ne!(wrong, rdma);
        let mut misspelt = classes();
        misspelt.insert("rdma.gpustack.ai".into(), vec![wrong.clone()]);
        let err = selected(&misspelt, "rdma.gpustack.ai", &[], &devices).unwrap_err();
        let lower = err.to_lowercase();
        assert!(
            err.starts_with("class rdma.gpustack.ai: selector #0: CEL runtime error")
                && missing
                    .iter()
                    .any(|m| lower.contains(&format!("no such key: {}", m.to_lowercase()))),
            "{wrong}: {err}"
        );
    }
    // The class as written evaluates on every device, the GPU included.
    assert!(selected(&classes(), "rdma.gpustack.ai", &[], &devices).is_ok());
}

#[test]
fn every_cel_expression_compiles_never_aborts_on_a_published_device_and_takes_one() {
    let n = node();
    let mut all: Vec<(String, String)> = Vec::new();
    for name in ["deviceclass-rdma.yaml", "deviceclass-vf.yaml"] {
        let class: DeviceClass = typed(name, &file(&component(), name));
        for e in expressions(&class.spec.selectors) {
            all.push((name.to_string(), e));
        }
    }
    let mut names: Vec<String> = fs::read_dir(examples())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    names.sort();
    assert_eq!(names, EXAMPLES);
    for name in &names {
        for e in example_expressions(name) {
            all.push((name.clone(), e));
        }
    }
    assert_eq!(all.len(), 3, "two classes and the rail example: {all:?}");
    for with_rails in [true, false] {
        let devices = n.candidates(with_rails);
        for (file, expr) in &all {
            let mut took = 0;
            for d in &devices {
                let verdict =
                    eval(expr, d).unwrap_or_else(|e| panic!("{file}: {expr}: on {}: {e}", d.label));
                took += usize::from(verdict);
            }
            assert!(
                took > 0 || !with_rails,
                "{file}: {expr} takes no published device"
            );
        }
    }
}

#[test]
fn the_claim_examples_are_typed_v1_templates_of_the_components_classes() {
    let known = classes();
    for name in EXAMPLES {
        let v = file(&examples(), name);
        assert_eq!(v["apiVersion"], "resource.k8s.io/v1", "{name}");
        let t = example(name);
        let claim = t.spec.spec.devices.unwrap();
        let requests = claim.requests.unwrap();
        for r in &requests {
            let mut classes: Vec<&str> = r
                .first_available
                .iter()
                .flatten()
                .map(|s| s.device_class_name.as_str())
                .collect();
            classes.extend(r.exactly.as_ref().map(|e| e.device_class_name.as_str()));
            assert!(!classes.is_empty(), "{name}: request {}", r.name);
            for class in classes {
                assert!(known.contains_key(class), "{name}: class {class}");
            }
        }
        for c in claim.constraints.iter().flatten() {
            // `request` or `request/subrequest`, as the API resolves them.
            for r in c.requests.iter().flatten() {
                let (main, sub) = r
                    .split_once('/')
                    .map_or((r.as_str(), None), |(m, s)| (m, Some(s)));
                let request = requests
                    .iter()
                    .find(|x| x.name == main)
                    .unwrap_or_else(|| panic!("{name}: {r}"));
                if let Some(sub) = sub {
                    assert!(
                        request
                            .first_available
                            .iter()
                            .flatten()
                            .any(|s| s.name == sub),
                        "{name}: {r}"
                    );
                }
            }
            let attr = c.match_attribute.as_deref().unwrap();
            assert!(
                [attributes::PCIE_ROOT, attributes::NUMA_NODE].contains(&attr),
                "{name}: {attr}"
            );
        }
    }
    // The round trip catches a misspelt field here too.
    let mut v = file(&examples(), "one-nic.yaml");
    v["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClass"] = "x".into();
    let t: ResourceClaimTemplate = serde_json::from_value(v.clone()).unwrap();
    assert_ne!(serde_json::to_value(&t).unwrap(), v);
}
