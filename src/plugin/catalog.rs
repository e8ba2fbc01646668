//! The token catalog: what the device plugin advertises, read from the CDI
//! specs `nodefabric` writes and from nothing else.
//!
//! | resource | CDI kind | tokens per endpoint | token ID |
//! |---|---|---|---|
//! | `rdma` (exclusive) | `gpustack.ai/rdma` | 1 | `mlx5_0` |
//! | `rdma.shared` | `gpustack.ai/rdma` | [`SHARED_TOKENS`] | `mlx5_0-shared-07` |
//! | `rdma.partitioned` | `gpustack.ai/rdma-vf` | 1 per VF | `mlx5_1` |

use crate::cdi::{Device, EndpointAnnotations, Family, Spec};
use crate::kubelet::specs::Change;
use crate::names;
use crate::record::LinkState;
use std::collections::BTreeMap;
use std::path::Path;
use tracing::warn;

/// Concurrent holders one whole interface serves as `rdma.shared`.
pub const SHARED_TOKENS: u32 = 64;

/// Health strings kubelet understands: a token's health is the catalog's
/// verdict, which the service reports and the metrics count (here, so
/// that neither of those two imports the other for it).
pub const HEALTHY: &str = "Healthy";
/// See [`HEALTHY`].
pub const UNHEALTHY: &str = "Unhealthy";

/// The separator between an endpoint and its share number in a shared token.
const SHARED_INFIX: &str = "-shared-";

/// One of the three resources the plugin serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Resource {
    /// One token is one whole interface.
    Exclusive,
    /// One token is one concurrent use of one whole interface.
    Shared,
    /// One token is one SR-IOV virtual function.
    Partitioned,
}

impl Resource {
    /// Every resource, in registration order.
    pub const ALL: [Resource; 3] = [Resource::Exclusive, Resource::Shared, Resource::Partitioned];

    /// The resource name after the prefix (`<prefix>/rdma`).
    pub fn suffix(self) -> &'static str {
        match self {
            Resource::Exclusive => "rdma",
            Resource::Shared => "rdma.shared",
            Resource::Partitioned => "rdma.partitioned",
        }
    }

    /// The socket file this resource's server listens on in the kubelet folder.
    pub fn socket_name(self) -> &'static str {
        match self {
            Resource::Exclusive => "nodefabric-rdma.sock",
            Resource::Shared => "nodefabric-rdma-shared.sock",
            Resource::Partitioned => "nodefabric-rdma-partitioned.sock",
        }
    }

    /// The CDI family whose devices back this resource.
    pub fn family(self) -> Family {
        match self {
            Resource::Exclusive | Resource::Shared => Family::Whole,
            Resource::Partitioned => Family::Partitioned,
        }
    }
}

/// An RDMA endpoint as its CDI device describes it: a view of the device's
/// typed annotations ([`EndpointAnnotations`]) with what serving needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The RDMA device name (the CDI device name and the `NCCL_IB_HCA` entry).
    pub name: String,
    /// The fully qualified CDI device name, `kind=name`.
    pub cdi_name: String,
    /// The NUMA node for the topology hint; `None` attaches no hint.
    pub numa: Option<i64>,
    /// False when the link verdict is `Failed` or the endpoint is unusable:
    /// tokens stay, marked Unhealthy.
    pub healthy: bool,
    /// Why this endpoint cannot be allocated even though it is advertised.
    pub unusable: Option<String>,
    /// The device's annotations; `None` when they break the contract (then
    /// `unusable` names the spec file, the device and the annotation).
    pub annotations: Option<EndpointAnnotations>,
}

impl Endpoint {
    /// The view of one CDI device of a spec of `kind` read from `path`.
    fn of_device(device: &Device, kind: &str, path: &Path) -> Endpoint {
        let read = device.endpoint(kind, path);
        let unusable = match &read {
            Err(e) => Some(e.to_string()),
            Ok(_) if device.container_edits.device_nodes.is_empty() => Some(format!(
                "CDI device {kind}={} injects no verbs device",
                device.name
            )),
            Ok(_) => None,
        };
        let annotations = read.ok();
        Endpoint {
            name: device.name.clone(),
            cdi_name: format!("{kind}={}", device.name),
            numa: annotations.as_ref().and_then(|a| a.numa).map(i64::from),
            healthy: unusable.is_none()
                && annotations
                    .as_ref()
                    .is_some_and(|a| a.link != LinkState::Failed),
            unusable,
            annotations,
        }
    }
}

/// One advertised token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token<'a> {
    /// The device ID kubelet sees.
    pub id: String,
    /// The endpoint it stands for.
    pub endpoint: &'a Endpoint,
}

/// The endpoints of both families, each sorted by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Catalog {
    families: BTreeMap<Family, Vec<Endpoint>>,
}

impl Catalog {
    /// This catalog with one family's endpoints replaced.
    pub fn with_family(&self, family: Family, endpoints: Vec<Endpoint>) -> Catalog {
        let mut families = self.families.clone();
        families.insert(family, endpoints);
        Catalog { families }
    }

    /// This catalog with each family whose spec changed replaced by the
    /// endpoints of its new spec (none when its file is gone); a family
    /// whose spec is unreadable is not among `changed` and keeps its
    /// endpoints, since kubelet has checkpointed their IDs.
    pub fn with_changes(&self, changed: &[(Family, Change)]) -> Catalog {
        let mut catalog = self.clone();
        for (family, change) in changed {
            let endpoints = match change {
                Change::Spec { path, spec } => endpoints_of(spec, path),
                Change::Gone => Vec::new(),
            };
            catalog = catalog.with_family(*family, endpoints);
        }
        catalog
    }

    /// The endpoints of one family, sorted by name.
    pub fn endpoints(&self, family: Family) -> &[Endpoint] {
        self.families.get(&family).map_or(&[], Vec::as_slice)
    }

    /// Every token of a resource, in a stable order.
    pub fn tokens(&self, resource: Resource) -> Vec<Token<'_>> {
        let eps = self.endpoints(resource.family());
        match resource {
            Resource::Shared => eps
                .iter()
                .flat_map(|ep| {
                    (0..SHARED_TOKENS).map(move |i| Token {
                        id: shared_id(&ep.name, i),
                        endpoint: ep,
                    })
                })
                .collect(),
            _ => eps
                .iter()
                .map(|ep| Token {
                    id: ep.name.clone(),
                    endpoint: ep,
                })
                .collect(),
        }
    }

    /// The endpoint a token ID stands for in a resource, if any.
    pub fn resolve(&self, resource: Resource, id: &str) -> Option<&Endpoint> {
        let place = self.locate(resource, id)?;
        Some(&self.endpoints(resource.family())[place.endpoint])
    }

    /// Where a token ID points: the index of its endpoint in
    /// [`Self::endpoints`] and its share number (0 outside `rdma.shared`).
    /// A binary search (endpoints are sorted by name), so locating every ID
    /// of a 40,000-token request stays cheap.
    pub fn locate(&self, resource: Resource, id: &str) -> Option<TokenPlace> {
        let (name, share) = match resource {
            Resource::Shared => {
                // Only the exact spelling we advertise, "<endpoint>-shared-07":
                // two ASCII digits (never "7" or "007") after the infix. Checked
                // from the end, with no substring search per ID.
                let b = id.as_bytes();
                if b.len() < SHARED_INFIX.len() + 2
                    || !b[b.len() - 2..].iter().all(u8::is_ascii_digit)
                {
                    return None;
                }
                // The last two bytes are ASCII, so this is a char boundary.
                let (head, _) = id.split_at(id.len() - 2);
                let name = head.strip_suffix(SHARED_INFIX)?;
                let n = u32::from(b[b.len() - 2] - b'0') * 10 + u32::from(b[b.len() - 1] - b'0');
                if n >= SHARED_TOKENS {
                    return None;
                }
                (name, n)
            }
            _ => (id, 0),
        };
        let eps = self.endpoints(resource.family());
        let endpoint = eps.binary_search_by(|ep| ep.name.as_str().cmp(name)).ok()?;
        Some(TokenPlace { endpoint, share })
    }
}

/// Where a token ID points, as [`Catalog::locate`] finds it: named fields
/// rather than a pair of numbers a caller could swap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenPlace {
    /// The index of its endpoint in [`Catalog::endpoints`] of the resource's family.
    pub endpoint: usize,
    /// Its share number (0 outside `rdma.shared`).
    pub share: u32,
}

/// A shared token's ID: the endpoint name and a two-digit share number.
pub fn shared_id(endpoint: &str, share: u32) -> String {
    format!("{endpoint}{SHARED_INFIX}{share:02}")
}

/// The endpoints a parsed spec describes, sorted by name. A device whose
/// name is outside the CDI name grammar is skipped (one warning per spec
/// content, naming `path`): in the annotation form a `,` or `=` in it would
/// make the runtime inject devices nobody was granted. A device whose
/// annotations break the contract is advertised unusable and Unhealthy, with
/// a warning naming the file, the device and the annotation: its tokens are
/// never withdrawn for it, and it is never handed out.
pub fn endpoints_of(spec: &Spec, path: &Path) -> Vec<Endpoint> {
    let (good, bad): (Vec<_>, Vec<_>) = spec
        .devices
        .iter()
        .partition(|d| names::is_cdi_device_name(&d.name));
    if !bad.is_empty() {
        let shown: Vec<&str> = bad.iter().map(|d| d.name.as_str()).collect();
        warn!(
            "{}: skipping CDI devices whose names CDI does not allow: {shown:?}",
            path.display()
        );
    }
    let mut eps: Vec<Endpoint> = good
        .into_iter()
        .map(|d| Endpoint::of_device(d, &spec.kind, path))
        .collect();
    for ep in &eps {
        if ep.annotations.is_none() {
            if let Some(why) = &ep.unusable {
                warn!("{why}; advertised Unhealthy");
            }
        }
    }
    eps.sort_by(|a, b| a.name.cmp(&b.name));
    eps.dedup_by(|a, b| a.name == b.name);
    eps
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubelet::specs::testing::spec;

    #[test]
    fn a_device_breaking_the_annotation_contract_is_advertised_unhealthy_naming_why() {
        let spec: Spec = serde_json::from_str(
            r#"{"cdiVersion":"0.6.0","kind":"gpustack.ai/rdma","devices":[
              {"name":"mlx5_0","annotations":{"rdma.gpustack.ai/rdma-device":"mlx5_0",
                "rdma.gpustack.ai/link":"OK","rdma.gpustack.ai/numa":"1"},
               "containerEdits":{"deviceNodes":[{"path":"/dev/infiniband/uverbs0","type":"c","major":231,"minor":192,"permissions":"rw"}]}},
              {"name":"mlx5_1","annotations":{"rdma.gpustack.ai/rdma-device":"mlx5_1",
                "rdma.gpustack.ai/link":"Broken"},
               "containerEdits":{"deviceNodes":[{"path":"/dev/infiniband/uverbs1","type":"c","major":231,"minor":193,"permissions":"rw"}]}}]}"#,
        )
        .unwrap();
        let eps = endpoints_of(&spec, Path::new("/cdi/nodefabric-rdma.json"));
        assert!(eps[0].healthy && eps[0].unusable.is_none());
        assert_eq!(eps[0].numa, Some(1));
        assert!(!eps[1].healthy && eps[1].annotations.is_none());
        assert_eq!(
            eps[1].unusable.as_deref(),
            Some(
                "/cdi/nodefabric-rdma.json: CDI device gpustack.ai/rdma=mlx5_1: \
                 annotation rdma.gpustack.ai/link is \"Broken\", expected OK, Unverified or Failed"
            )
        );
    }

    fn names(c: &Catalog) -> Vec<&str> {
        c.endpoints(Family::Whole)
            .iter()
            .map(|e| e.name.as_str())
            .collect()
    }

    #[test]
    fn an_unreadable_spec_keeps_the_served_tokens_and_a_removed_one_withdraws_them() {
        use crate::kubelet::specs::Loader;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("cdi");
        std::fs::create_dir(&dir).unwrap();
        let file = dir.join("nodefabric-rdma.json");
        std::fs::write(&file, spec(&["mlx5_1", "mlx5_0"], "Failed")).unwrap();
        let mut loader = Loader::new(dir.clone(), 1 << 20);
        let served = Catalog::default().with_changes(&loader.load().changed);
        assert_eq!(names(&served), ["mlx5_0", "mlx5_1"]);
        assert!(served.endpoints(Family::Whole).iter().all(|e| !e.healthy));

        std::fs::remove_file(&file).unwrap();
        std::os::unix::fs::symlink(dir.join("elsewhere.json"), &file).unwrap();
        let c = served.with_changes(&loader.load().changed);
        assert_eq!(c, served, "Failed tokens included, nothing withdrawn");
        std::fs::remove_dir_all(&dir).unwrap();
        let c = served.with_changes(&loader.load().changed);
        assert_eq!(c, served, "a missing folder withdraws nothing");

        std::fs::create_dir(&dir).unwrap();
        let c = served.with_changes(&loader.load().changed);
        assert!(
            names(&c).is_empty(),
            "the folder without the spec: zero devices"
        );
    }

    #[test]
    fn a_device_name_outside_the_cdi_grammar_is_skipped() {
        let spec: Spec =
            serde_json::from_str(&spec(&["mlx5_0,nvidia.com/gpu=all", "mlx5_1", "a=b"], "OK"))
                .unwrap();
        let c = Catalog::default().with_changes(&[(
            Family::Whole,
            Change::Spec {
                path: "/cdi/nodefabric-rdma.json".into(),
                spec,
            },
        )]);
        assert_eq!(names(&c), ["mlx5_1"]);
    }

    #[test]
    fn a_token_id_resolves_only_in_its_exact_spelling_and_hostile_ids_do_not_panic() {
        let ep = |name: &str| Endpoint {
            name: name.into(),
            cdi_name: format!("k={name}"),
            numa: None,
            healthy: true,
            unusable: None,
            annotations: None,
        };
        let c = Catalog::default().with_family(Family::Whole, vec![ep("mlx5_0"), ep("mlx5_1")]);
        assert_eq!(
            c.locate(Resource::Shared, "mlx5_1-shared-07"),
            Some(TokenPlace {
                endpoint: 1,
                share: 7
            })
        );
        assert_eq!(
            c.locate(Resource::Shared, "mlx5_0-shared-63"),
            Some(TokenPlace {
                endpoint: 0,
                share: 63
            })
        );
        assert_eq!(
            c.locate(Resource::Exclusive, "mlx5_1"),
            Some(TokenPlace {
                endpoint: 1,
                share: 0
            })
        );
        for bad in [
            "mlx5_0-shared-64",
            "mlx5_0-shared-7",
            "mlx5_0-shared-007",
            "mlx5_0-shared-0é",
            "é-shared-07",
            "-shared-07",
            "shared-07",
            "mlx5_0",
            "mlx5_2-shared-00",
            "",
        ] {
            assert_eq!(c.locate(Resource::Shared, bad), None, "{bad:?}");
        }
        assert_eq!(c.locate(Resource::Exclusive, "mlx5_0-shared-00"), None);
        assert_eq!(
            c.locate(Resource::Partitioned, "mlx5_0"),
            None,
            "another family"
        );
    }
}
