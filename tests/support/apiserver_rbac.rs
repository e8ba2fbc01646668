//! RBAC as the API server's authorizer evaluates it, loaded from the
//! manifests in deploy/ (or a rendering of it): a ServiceAccount may do what any Role (through a
//! RoleBinding, in that namespace) or ClusterRole (through a
//! ClusterRoleBinding, anywhere; through a RoleBinding, in its namespace)
//! bound to it allows. Used by the in-test API server, so the binaries run
//! under exactly the permissions deploy/ grants, and by tests/node/deploy.rs.

#![allow(dead_code)] // each test binary uses a different part

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use serde_json::Value;
use std::path::Path;

/// One request as the authorizer sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attributes {
    /// get, list, watch, create, patch, …
    pub verb: String,
    /// The API group ("" for core).
    pub group: String,
    /// The resource (plural).
    pub resource: String,
    /// The namespace; `None` for cluster-scoped resources.
    pub namespace: Option<String>,
    /// The object's name; `None` for collections.
    pub name: Option<String>,
}

impl Attributes {
    /// A request for `verb` on `group`/`resource`, optionally namespaced and named.
    pub fn new(
        verb: &str,
        group: &str,
        resource: &str,
        namespace: Option<&str>,
        name: Option<&str>,
    ) -> Attributes {
        Attributes {
            verb: verb.into(),
            group: group.into(),
            resource: resource.into(),
            namespace: namespace.map(str::to_string),
            name: name.map(str::to_string),
        }
    }
}

struct Grant {
    /// `None`: everywhere (a ClusterRoleBinding).
    namespace: Option<String>,
    subjects: Vec<(String, String)>,
    rules: Vec<PolicyRule>,
}

/// Every binding in deploy/, resolved to its rules.
pub struct Rbac {
    grants: Vec<Grant>,
}

fn list_has(list: &[String], v: &str) -> bool {
    list.iter().any(|x| x == v || x == "*")
}

impl Rbac {
    /// Loads every Role, ClusterRole and binding from the deploy/ folder and
    /// its components: the DRA driver's (whose account is the driver's
    /// alone) and the GPU source's exec in the GPU Operator's namespace.
    pub fn from_deploy() -> Rbac {
        Rbac::from_deploy_edited(|_| {})
    }

    /// As [`Rbac::from_deploy`], each manifest changed by `edit` first (a
    /// cluster where a rule was left out).
    pub fn from_deploy_edited(edit: impl Fn(&mut Value)) -> Rbac {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy");
        let mut docs: Vec<Value> = Vec::new();
        let mut names: Vec<_> = [
            dir.clone(),
            dir.join("components/dra"),
            dir.join("components/gpu-exec"),
        ]
        .iter()
        .flat_map(|d| std::fs::read_dir(d).unwrap())
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
        names.sort();
        for p in names {
            let mut v: Value = serde_saphyr::from_str(&std::fs::read_to_string(&p).unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            edit(&mut v);
            docs.push(v);
        }
        Rbac::from_docs(&docs)
    }

    /// Loads every Role, ClusterRole and binding among `docs` (a rendered
    /// kustomization, say); other kinds are ignored.
    pub fn from_docs(docs: &[Value]) -> Rbac {
        let of = |kind: &'static str| docs.iter().filter(move |d| d["kind"] == kind).cloned();
        let roles: Vec<Role> = of("Role")
            .map(|d| serde_json::from_value(d).unwrap())
            .collect();
        let cluster_roles: Vec<ClusterRole> = of("ClusterRole")
            .map(|d| serde_json::from_value(d).unwrap())
            .collect();
        let subjects =
            |s: &Option<Vec<k8s_openapi::api::rbac::v1::Subject>>| -> Vec<(String, String)> {
                s.iter()
                    .flatten()
                    .filter(|s| s.kind == "ServiceAccount")
                    .map(|s| (s.namespace.clone().unwrap_or_default(), s.name.clone()))
                    .collect()
            };
        let cluster_rules = |name: &str| -> Vec<PolicyRule> {
            let r = cluster_roles
                .iter()
                .find(|r| r.metadata.name.as_deref() == Some(name))
                .unwrap_or_else(|| panic!("no ClusterRole {name}"));
            r.rules.clone().unwrap_or_default()
        };
        let mut grants = Vec::new();
        for b in of("ClusterRoleBinding")
            .map(|d| serde_json::from_value::<ClusterRoleBinding>(d).unwrap())
        {
            assert_eq!(b.role_ref.kind, "ClusterRole");
            grants.push(Grant {
                namespace: None,
                subjects: subjects(&b.subjects),
                rules: cluster_rules(&b.role_ref.name),
            });
        }
        for b in of("RoleBinding").map(|d| serde_json::from_value::<RoleBinding>(d).unwrap()) {
            let ns = b
                .metadata
                .namespace
                .clone()
                .expect("a RoleBinding names its namespace");
            let rules = match b.role_ref.kind.as_str() {
                "ClusterRole" => cluster_rules(&b.role_ref.name),
                _ => {
                    let r = roles
                        .iter()
                        .find(|r| {
                            r.metadata.name.as_deref() == Some(b.role_ref.name.as_str())
                                && r.metadata.namespace.as_deref() == Some(ns.as_str())
                        })
                        .unwrap_or_else(|| panic!("no Role {ns}/{}", b.role_ref.name));
                    r.rules.clone().unwrap_or_default()
                }
            };
            grants.push(Grant {
                namespace: Some(ns),
                subjects: subjects(&b.subjects),
                rules,
            });
        }
        Rbac { grants }
    }

    /// Whether ServiceAccount `namespace/name` may make the request.
    pub fn allows(&self, sa: (&str, &str), a: &Attributes) -> bool {
        self.grants.iter().any(|g| {
            let in_scope = match &g.namespace {
                None => true,
                Some(ns) => a.namespace.as_deref() == Some(ns.as_str()),
            };
            in_scope
                && g.subjects.iter().any(|(n, s)| n == sa.0 && s == sa.1)
                && g.rules.iter().any(|r| {
                    list_has(&r.verbs, &a.verb)
                        && list_has(r.api_groups.as_deref().unwrap_or_default(), &a.group)
                        && list_has(r.resources.as_deref().unwrap_or_default(), &a.resource)
                        && match r.resource_names.as_deref() {
                            None | Some([]) => true,
                            Some(names) => a
                                .name
                                .as_deref()
                                .is_some_and(|n| names.iter().any(|x| x == n)),
                        }
                })
        })
    }
}
