//! Every manifest in deploy/ is a typed Kubernetes object with no field the
//! API does not know, and every container names only flags its binary
//! accepts (parsed with the binaries' own clap parsers), on paths it mounts.

use crate::support::apiserver_rbac;
use apiserver_rbac::{Attributes, Rbac};
use clap::Parser;
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Container, Namespace, ServiceAccount, Volume};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use nodefabric::cli::{Cli, Command};
use nodefabric::plugin::cli::PluginCli;
use serde_json::Value;
use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

fn yaml(file: &str) -> Value {
    let text = fs::read_to_string(deploy().join(file)).unwrap();
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// Parses `value` as `T` and checks the typed object serialises back to the
/// same document: typed parsing alone ignores unknown (or misspelt) keys.
pub(crate) fn typed<T: serde::de::DeserializeOwned + serde::Serialize>(
    file: &str,
    value: &Value,
) -> T {
    let obj: T = serde_json::from_value(value.clone()).unwrap_or_else(|e| panic!("{file}: {e}"));
    let back = serde_json::to_value(&obj).unwrap();
    assert_eq!(
        &back, value,
        "{file}: keys the API does not know were dropped in the typed round trip"
    );
    obj
}

/// Checks a rendered manifest as the typed object its `kind` names (see
/// [`typed`]), refusing a kind outside `allowed`: the kinds this render may
/// hold.
pub(crate) fn check_kind(what: &str, doc: &Value, allowed: &[&str]) {
    let kind = doc["kind"].as_str().unwrap_or_default();
    assert!(allowed.contains(&kind), "{what}: unexpected kind {kind:?}");
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::api::resource::v1::DeviceClass;
    match kind {
        "DaemonSet" => drop(typed::<DaemonSet>(what, doc)),
        "Deployment" => drop(typed::<Deployment>(what, doc)),
        "Namespace" => drop(typed::<Namespace>(what, doc)),
        "ServiceAccount" => drop(typed::<ServiceAccount>(what, doc)),
        "ConfigMap" => drop(typed::<ConfigMap>(what, doc)),
        "ClusterRole" => drop(typed::<ClusterRole>(what, doc)),
        "ClusterRoleBinding" => drop(typed::<ClusterRoleBinding>(what, doc)),
        "Role" => drop(typed::<Role>(what, doc)),
        "RoleBinding" => drop(typed::<RoleBinding>(what, doc)),
        "CustomResourceDefinition" => drop(typed::<CustomResourceDefinition>(what, doc)),
        "DeviceClass" => drop(typed::<DeviceClass>(what, doc)),
        other => panic!("{what}: no typed check for kind {other:?}"),
    }
}

fn manifests() -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(deploy())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml") && n != "kustomization.yaml")
        .collect();
    v.sort();
    v
}

fn daemonsets() -> Vec<(String, DaemonSet)> {
    manifests()
        .into_iter()
        .filter_map(|f| {
            let v = yaml(&f);
            (v["kind"] == "DaemonSet").then(|| {
                let ds = typed::<DaemonSet>(&f, &v);
                (f, ds)
            })
        })
        .collect()
}

#[test]
fn every_manifest_is_a_typed_object_with_only_known_fields() {
    for f in manifests() {
        let v = yaml(&f);
        match v["kind"].as_str() {
            Some("DaemonSet") => drop(typed::<DaemonSet>(&f, &v)),
            Some("Namespace") => drop(typed::<Namespace>(&f, &v)),
            Some("ServiceAccount") => drop(typed::<ServiceAccount>(&f, &v)),
            Some("ClusterRole") => drop(typed::<ClusterRole>(&f, &v)),
            Some("ClusterRoleBinding") => drop(typed::<ClusterRoleBinding>(&f, &v)),
            Some("Role") => drop(typed::<Role>(&f, &v)),
            Some("RoleBinding") => drop(typed::<RoleBinding>(&f, &v)),
            Some("Deployment") => drop(typed::<Deployment>(&f, &v)),
            other => panic!("{f}: unexpected kind {other:?}"),
        }
    }
}

#[test]
fn the_crd_in_deploy_is_the_one_the_rust_type_derives() {
    let file = fs::read_to_string(deploy().join("crds/noderailrecords.yaml")).unwrap();
    assert!(
        file == nodefabric::cluster::node_rail_record::crd_yaml(),
        "deploy/crds/noderailrecords.yaml is not current: run `cargo run -- crd > deploy/crds/noderailrecords.yaml`"
    );
    let crd: CustomResourceDefinition = typed(
        "crds/noderailrecords.yaml",
        &yaml("crds/noderailrecords.yaml"),
    );
    assert_eq!(crd.spec.scope, "Cluster");
    assert_eq!(crd.spec.group, "nodefabric.gpustack.ai");
}

#[test]
fn the_optional_admission_policy_is_typed_and_holds_the_broker_to_its_node() {
    let text =
        fs::read_to_string(deploy().join("optional/noderailrecord-own-node-policy.yaml")).unwrap();
    let docs: Vec<Value> = text
        .split("\n---\n")
        .map(|d| serde_saphyr::from_str(d).unwrap())
        .collect();
    let policy: ValidatingAdmissionPolicy = typed("optional policy", &docs[0]);
    let binding: ValidatingAdmissionPolicyBinding = typed("optional binding", &docs[1]);
    let spec = policy.spec.unwrap();
    assert_eq!(
        binding.spec.unwrap().policy_name.as_deref(),
        policy.metadata.name.as_deref()
    );
    let sa: ServiceAccount = typed("serviceaccount.yaml", &yaml("serviceaccount.yaml"));
    let user = format!(
        "system:serviceaccount:{}:{}",
        sa.metadata.namespace.unwrap(),
        sa.metadata.name.unwrap()
    );
    assert!(
        spec.match_conditions.unwrap()[0].expression.contains(&user),
        "the policy names the broker's account"
    );
    let rule = &spec.match_constraints.unwrap().resource_rules.unwrap()[0];
    assert_eq!(
        rule.resources.as_deref(),
        Some(&["noderailrecords".to_string()][..])
    );
    let validations = spec.validations.unwrap();
    assert!(validations.iter().all(|v| v
        .expression
        .contains("authentication.kubernetes.io/node-name")));
    assert!(
        validations[1].expression.contains("request.name"),
        "the second compares the claim with the record's name"
    );
}

#[test]
fn the_kustomization_lists_every_manifest() {
    let k = yaml("kustomization.yaml");
    assert_eq!(k["kind"], "Kustomization");
    let listed: BTreeSet<String> = k["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().to_string())
        .collect();
    let mut present: BTreeSet<String> = manifests().into_iter().collect();
    present.insert("crds/noderailrecords.yaml".into());
    assert_eq!(listed, present);
}

/// True when `path` lies under one of the container's mounts.
pub(crate) fn mounted(c: &Container, path: &Path) -> bool {
    c.volume_mounts
        .iter()
        .flatten()
        .any(|m| path.starts_with(&m.mount_path))
}

pub(crate) fn host_path<'a>(volumes: &'a [Volume], c: &Container, mount: &Path) -> Option<&'a str> {
    let m = c
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| Path::new(&m.mount_path) == mount)?;
    volumes
        .iter()
        .find(|v| v.name == m.name)?
        .host_path
        .as_ref()
        .map(|h| h.path.as_str())
}

#[test]
fn containers_name_only_flags_the_binaries_accept_on_mounted_paths() {
    let mut seen = BTreeSet::new();
    let mut cdi_host_paths = BTreeSet::new();
    for (file, ds) in daemonsets() {
        let spec = ds.spec.unwrap().template.spec.unwrap();
        let volumes = spec.volumes.clone().unwrap_or_default();
        assert_eq!(
            spec.priority_class_name.as_deref(),
            Some("system-node-critical"),
            "{file}"
        );
        let tolerations: Vec<String> = spec
            .tolerations
            .iter()
            .flatten()
            .filter_map(|t| t.key.clone())
            .collect();
        assert!(
            tolerations.iter().any(|k| k == "nvidia.com/gpu")
                && tolerations.iter().any(|k| k == "amd.com/gpu"),
            "{file}"
        );
        for c in &spec.containers {
            let sc = c
                .security_context
                .as_ref()
                .unwrap_or_else(|| panic!("{file}: no securityContext"));
            assert_eq!(sc.read_only_root_filesystem, Some(true), "{file}");
            assert_eq!(sc.allow_privilege_escalation, Some(false), "{file}");
            assert_eq!(
                sc.capabilities.as_ref().and_then(|c| c.drop.clone()),
                Some(vec!["ALL".to_string()]),
                "{file}"
            );
            let res = c.resources.as_ref().unwrap();
            assert!(
                res.limits
                    .as_ref()
                    .is_some_and(|l| l.contains_key("memory")),
                "{file}: no memory limit"
            );
            let command = c.command.clone().unwrap();
            let mut argv = command.clone();
            argv.extend(c.args.clone().unwrap_or_default());
            let bin = Path::new(&command[0])
                .file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .to_string();
            match bin.as_str() {
                "nodefabric-full" => {
                    let cli = Cli::try_parse_from(&argv)
                        .unwrap_or_else(|e| panic!("{file}: {argv:?}: {e}"));
                    assert!(
                        mounted(c, &cli.sysfs_root),
                        "{file}: {} not mounted",
                        cli.sysfs_root.display()
                    );
                    assert_eq!(host_path(&volumes, c, &cli.sysfs_root), Some("/sys"));
                    let Command::Publish(p) = &cli.command else {
                        panic!("{file}: the agent must run publish")
                    };
                    assert_eq!(p.interval, Some(std::time::Duration::from_secs(60)));
                    for dir in [&p.features_dir, &p.cdi_dir, &p.state_dir] {
                        assert!(mounted(c, dir), "{file}: {} not mounted", dir.display());
                    }
                    assert_eq!(
                        host_path(&volumes, c, &p.features_dir),
                        Some("/etc/kubernetes/node-feature-discovery/features.d")
                    );
                    // The in-cluster Node read: NODE_NAME from the downward API, under an account allowed to get nodes.
                    let node_name = c
                        .env
                        .iter()
                        .flatten()
                        .find(|e| e.name == "NODE_NAME")
                        .expect("NODE_NAME env");
                    let field = node_name
                        .value_from
                        .as_ref()
                        .and_then(|v| v.field_ref.as_ref())
                        .map(|f| f.field_path.as_str());
                    assert_eq!(field, Some("spec.nodeName"));
                    assert_eq!(spec.service_account_name.as_deref(), Some("nodefabric"));
                    cdi_host_paths.insert(host_path(&volumes, c, &p.cdi_dir).unwrap().to_string());
                }
                "nodefabric-device-plugin" => {
                    let cli = PluginCli::try_parse_from(&argv)
                        .unwrap_or_else(|e| panic!("{file}: {argv:?}: {e}"));
                    for dir in [&cli.kubelet_dir, &cli.cdi.cdi_dir] {
                        assert!(mounted(c, dir), "{file}: {} not mounted", dir.display());
                    }
                    assert_eq!(
                        host_path(&volumes, c, &cli.kubelet_dir),
                        Some("/var/lib/kubelet/device-plugins")
                    );
                    cdi_host_paths.insert(
                        host_path(&volumes, c, &cli.cdi.cdi_dir)
                            .unwrap()
                            .to_string(),
                    );
                }
                other => panic!("{file}: unknown binary {other}"),
            }
            seen.insert(bin);
        }
    }
    assert_eq!(
        seen.into_iter().collect::<Vec<_>>(),
        ["nodefabric-device-plugin", "nodefabric-full"]
    );
    assert_eq!(
        cdi_host_paths.into_iter().collect::<Vec<_>>(),
        ["/var/run/cdi"],
        "both agents share one CDI folder"
    );
}

#[test]
fn a_misspelt_field_is_caught() {
    // The round-trip check is what catches typos; prove it is not vacuous.
    let mut v = yaml("device-plugin.yaml");
    v["spec"]["template"]["spec"]["priorityClass"] = "system-node-critical".into();
    let obj: DaemonSet = serde_json::from_value(v.clone()).unwrap();
    assert_ne!(serde_json::to_value(&obj).unwrap(), v);
}

/// Every verb RBAC knows, to prove each account may do only what it needs.
pub(crate) const VERBS: [&str; 8] = [
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
];

/// The verbs `sa` may use on one object (or collection, `name` None).
pub(crate) fn verbs(
    rbac: &Rbac,
    sa: (&str, &str),
    group: &str,
    resource: &str,
    ns: Option<&str>,
    name: Option<&str>,
) -> Vec<&'static str> {
    VERBS
        .into_iter()
        .filter(|v| rbac.allows(sa, &Attributes::new(v, group, resource, ns, name)))
        .collect()
}

#[test]
fn the_publisher_account_may_get_nodes_and_read_and_patch_only_the_rail_configmap() {
    let rbac = Rbac::from_deploy();
    let sa: ServiceAccount = typed("serviceaccount.yaml", &yaml("serviceaccount.yaml"));
    let me = (
        sa.metadata.namespace.as_deref().unwrap(),
        sa.metadata.name.as_deref().unwrap(),
    );
    assert_eq!(verbs(&rbac, me, "", "nodes", None, Some("node-a")), ["get"]);
    assert_eq!(
        verbs(&rbac, me, "", "nodes", None, None),
        ["get"],
        "no list or watch of nodes"
    );
    let cm = rails_configmap();
    assert_eq!(
        verbs(&rbac, me, "", "configmaps", Some("nodefabric"), Some(&cm)),
        ["get", "patch"]
    );
    assert!(verbs(
        &rbac,
        me,
        "",
        "configmaps",
        Some("nodefabric"),
        Some("other")
    )
    .is_empty());
    assert!(
        verbs(&rbac, me, "", "configmaps", Some("nodefabric"), None).is_empty(),
        "the broker never creates it"
    );
    assert!(verbs(&rbac, me, "", "configmaps", Some("default"), Some(&cm)).is_empty());
    assert!(verbs(&rbac, me, "", "pods", Some("nodefabric"), None).is_empty());
    // --rails-record custom-resource: write its NodeRailRecord and read it
    // back (to skip an unchanged write); never list or watch them.
    assert_eq!(
        verbs(
            &rbac,
            me,
            "nodefabric.gpustack.ai",
            "noderailrecords",
            None,
            Some("node-a")
        ),
        ["get", "create", "patch", "delete"]
    );
    assert!(verbs(
        &rbac,
        me,
        "nodefabric.gpustack.ai",
        "noderailrecords",
        None,
        None
    )
    .iter()
    .all(|v| !["list", "watch", "deletecollection"].contains(v)));
}

/// The observer's Deployment, parsed.
fn observer() -> (Deployment, nodefabric::cli::ObserveArgs) {
    let d: Deployment = typed("observer.yaml", &yaml("observer.yaml"));
    let c = &d
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0];
    let mut argv = c.command.clone().unwrap();
    argv.extend(c.args.clone().unwrap_or_default());
    let cli = Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("observer.yaml: {argv:?}: {e}"));
    let Command::Observe(o) = cli.command else {
        panic!("observer.yaml must run observe")
    };
    (d, o)
}

/// The shared ConfigMap's name, as the observer is told it.
fn rails_configmap() -> String {
    observer()
        .1
        .rails_configmap
        .expect("--rails-configmap")
        .name
}

#[test]
fn the_observer_deployment_owns_the_configmap_the_broker_may_patch_and_probes_its_health_port() {
    let (d, args) = observer();
    let spec = d.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(1));
    assert_eq!(
        args.owner_deployment,
        d.metadata.name.clone(),
        "--owner-deployment names this Deployment"
    );
    let (cm, owner_deployment) = (
        args.rails_configmap.clone().unwrap(),
        args.owner_deployment.clone().unwrap(),
    );
    let ns = d.metadata.namespace.as_deref().unwrap();
    assert!(cm.namespace.is_none() || cm.namespace.as_deref() == Some(ns));
    let broker: Role = typed("broker-role.yaml", &yaml("broker-role.yaml"));
    assert_eq!(
        broker.rules.unwrap()[0].resource_names.as_deref(),
        Some(&[cm.name.clone()][..])
    );
    let pod = spec.template.spec.as_ref().unwrap();
    let c = &pod.containers[0];
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(
        (
            sc.read_only_root_filesystem,
            sc.allow_privilege_escalation,
            sc.run_as_non_root
        ),
        (Some(true), Some(false), Some(true))
    );
    assert!(c
        .resources
        .as_ref()
        .unwrap()
        .limits
        .as_ref()
        .is_some_and(|l| l.contains_key("memory")));
    let port = args.health_addr.expect("--health-addr").port() as i32;
    let declared = c
        .ports
        .iter()
        .flatten()
        .find(|p| p.container_port == port)
        .expect("the health port is declared");
    for (probe, path) in [
        (&c.liveness_probe, "/livez"),
        (&c.readiness_probe, "/readyz"),
    ] {
        let get = probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .expect("an HTTP probe");
        assert_eq!(get.path.as_deref(), Some(path));
        let by_name = matches!(&get.port, k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(n) if Some(n) == declared.name.as_ref());
        assert!(
            by_name
                || get.port == k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(port),
            "{path}"
        );
    }

    // Its account: watch Nodes, read its own Deployment, own ConfigMaps in its namespace; nothing else.
    let rbac = Rbac::from_deploy();
    let me = (ns, pod.service_account_name.as_deref().unwrap());
    assert_eq!(verbs(&rbac, me, "", "nodes", None, None), ["list", "watch"]);
    assert_eq!(
        verbs(&rbac, me, "", "nodes", None, Some("node-a")),
        ["list", "watch"],
        "no get or write of a Node"
    );
    assert_eq!(
        verbs(
            &rbac,
            me,
            "apps",
            "deployments",
            Some(ns),
            Some(&owner_deployment)
        ),
        ["get"]
    );
    assert!(verbs(&rbac, me, "apps", "deployments", Some(ns), Some("other")).is_empty());
    assert_eq!(
        verbs(&rbac, me, "", "configmaps", Some(ns), None),
        ["get", "create", "patch"]
    );
    // Its own ConfigMap it may also list and watch (by field selector), to
    // re-create it on deletion; no other.
    assert_eq!(
        verbs(&rbac, me, "", "configmaps", Some(ns), Some(&cm.name)),
        ["get", "list", "watch", "create", "patch"]
    );
    assert_eq!(
        verbs(&rbac, me, "", "configmaps", Some(ns), Some("other")),
        ["get", "create", "patch"]
    );
    assert!(verbs(&rbac, me, "", "configmaps", Some("kube-system"), None).is_empty());
    assert!(verbs(&rbac, me, "", "secrets", Some(ns), None).is_empty());
    // --rails-record custom-resource: list records (metadata) and delete stale ones; no writes.
    assert_eq!(
        verbs(
            &rbac,
            me,
            "nodefabric.gpustack.ai",
            "noderailrecords",
            None,
            None
        ),
        ["list", "delete"]
    );
}

#[test]
fn the_publisher_probes_match_its_health_address() {
    for (file, ds) in daemonsets()
        .into_iter()
        .filter(|(f, _)| f == "nodefabric.yaml")
    {
        let c = &ds.spec.unwrap().template.spec.unwrap().containers[0];
        let mut argv = c.command.clone().unwrap();
        argv.extend(c.args.clone().unwrap_or_default());
        let Command::Publish(p) = Cli::try_parse_from(&argv).unwrap().command else {
            panic!("{file}")
        };
        let port = p.health_addr.expect("--health-addr").port() as i32;
        assert!(
            c.ports.iter().flatten().any(|p| p.container_port == port),
            "{file}"
        );
        for probe in [&c.liveness_probe, &c.readiness_probe] {
            assert!(
                probe.as_ref().and_then(|p| p.http_get.as_ref()).is_some(),
                "{file}: an HTTP probe"
            );
        }
    }
}

#[test]
fn rbac_evaluation_is_not_vacuous() {
    // A request for another verb, group or namespace is refused: the checks above can fail.
    let rbac = Rbac::from_deploy();
    assert!(rbac.allows(
        ("nodefabric", "nodefabric"),
        &Attributes::new("get", "", "nodes", None, Some("n"))
    ));
    assert!(!rbac.allows(
        ("nodefabric", "nodefabric"),
        &Attributes::new("get", "apps", "nodes", None, Some("n"))
    ));
    assert!(!rbac.allows(
        ("other", "nodefabric"),
        &Attributes::new("get", "", "nodes", None, Some("n"))
    ));
}

/// scripts/test.sh takes containerd from the machine's own Debian mirror:
/// the URI comes from the apt sources (deb822 and one-line, options and
/// disabled stanzas included), never a fixed public address.
#[test]
fn the_test_command_takes_containerd_from_the_machines_own_debian_mirror() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/debian-mirror.sh");
    let run = |apt: &Path, os: &Path| {
        let out = std::process::Command::new("bash")
            .arg(&script)
            .arg(apt)
            .arg(os)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let apt = dir.path().join("apt");
    fs::create_dir_all(apt.join("sources.list.d")).unwrap();
    let os = dir.path().join("os-release");
    fs::write(&os, "ID=debian\nVERSION_CODENAME=bookworm\n").unwrap();

    // nothing configured: an error naming what was searched
    let (code, out, err) = run(&apt, &os);
    assert_eq!((code, out.as_str()), (Some(1), ""));
    assert!(
        err.contains("bookworm") && err.contains("sources.list.d"),
        "{err}"
    );

    // one-line form with options; the security suite and deb-src do not count
    fs::write(
        apt.join("sources.list"),
        "# local\ndeb-src http://src.example/debian bookworm main\n\
         deb http://sec.example/debian-security bookworm-security main\n\
         deb [arch=amd64 signed-by=/k.gpg] http://mirror.corp.example/debian bookworm main\n",
    )
    .unwrap();
    assert_eq!(run(&apt, &os).1, "http://mirror.corp.example/debian");

    // deb822 wins over one-line; a disabled stanza and another suite are skipped
    fs::write(
        apt.join("sources.list.d/debian.sources"),
        "Types: deb\nURIs: http://off.example/debian\nSuites: bookworm\nComponents: main\nEnabled: no\n\n\
         Types: deb\n# http://snapshot.example\nURIs: http://local.mirror/debian\nSuites: bookworm bookworm-updates\nComponents: main\n\n\
         Types: deb\nURIs: http://sec.example/debian-security\nSuites: bookworm-security\nComponents: main\n",
    )
    .unwrap();
    assert_eq!(
        run(&apt, &os),
        (Some(0), "http://local.mirror/debian".into(), String::new())
    );
}

#[test]
fn the_gpu_exec_component_grants_the_publisher_exactly_the_exec_in_the_gpu_operator_namespace() {
    let dir = deploy().join("components/gpu-exec");
    let kustomization = fs::read_to_string(dir.join("kustomization.yaml")).unwrap();
    for file in ["role.yaml", "rolebinding.yaml"] {
        assert!(kustomization.contains(file), "{file} listed");
    }
    let role: Role = typed("gpu-exec role", &yaml("components/gpu-exec/role.yaml"));
    let binding: RoleBinding = typed(
        "gpu-exec binding",
        &yaml("components/gpu-exec/rolebinding.yaml"),
    );
    assert_eq!(role.metadata.namespace.as_deref(), Some("gpu-operator"));
    assert_eq!(binding.metadata.namespace.as_deref(), Some("gpu-operator"));
    let rbac = Rbac::from_deploy();
    let me = ("nodefabric", "nodefabric");
    let ns = Some("gpu-operator");
    let pod = Some("nvidia-device-plugin-daemonset-x7k2p");
    assert_eq!(
        verbs(&rbac, me, "apps", "daemonsets", ns, Some("ds")),
        ["get"]
    );
    assert_eq!(verbs(&rbac, me, "", "pods", ns, None), ["list"]);
    assert_eq!(verbs(&rbac, me, "", "pods", ns, pod), ["list"]);
    assert_eq!(
        verbs(&rbac, me, "", "pods/exec", ns, pod),
        ["get", "create"]
    );
    // Nowhere else, and no other account.
    assert!(verbs(&rbac, me, "", "pods/exec", Some("nodefabric"), pod).is_empty());
    assert!(verbs(&rbac, me, "", "pods/exec", None, pod).is_empty());
    assert!(verbs(
        &rbac,
        ("nodefabric", "nodefabric-observer"),
        "",
        "pods/exec",
        ns,
        pod
    )
    .is_empty());
    assert!(verbs(&rbac, me, "", "secrets", ns, None).is_empty());
}
