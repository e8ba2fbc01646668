//! The token catalog: what the device plugin advertises, read from the CDI
//! specs `nodefabric` writes and from nothing else.
//!
//! | resource | CDI kind | tokens per endpoint | token ID |
//! |---|---|---|---|
//! | `rdma` (exclusive) | `gpustack.ai/rdma` | 1 | `mlx5_0` |
//! | `rdma.shared` | `gpustack.ai/rdma` | [`SHARED_TOKENS`] | `mlx5_0-shared-07` |
//! | `rdma.partitioned` | `gpustack.ai/rdma-vf` | 1 per VF | `mlx5_1` |

use crate::cdi::{self, Family, Spec};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tracing::warn;

/// Concurrent holders one whole interface serves as `rdma.shared`.
pub const SHARED_TOKENS: u32 = 64;

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

/// An RDMA endpoint as its CDI device describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The RDMA device name (the CDI device name and the `NCCL_IB_HCA` entry).
    pub name: String,
    /// The fully qualified CDI device name, `kind=name`.
    pub cdi_name: String,
    /// The NUMA node for the topology hint; `None` attaches no hint.
    pub numa: Option<i64>,
    /// False when the link verdict is `Failed`: tokens stay, marked Unhealthy.
    pub healthy: bool,
    /// Why this endpoint cannot be allocated even though it is advertised.
    pub unusable: Option<String>,
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

/// Why a family's spec file was not taken.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file exists but could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The spec file.
        path: PathBuf,
        /// The read error.
        source: std::io::Error,
    },
    /// The file is not a CDI spec of the expected kind.
    #[error("{path}: {reason}")]
    Malformed {
        /// The spec file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}

impl Catalog {
    /// The catalog built from parsed specs (one per family at most).
    pub fn from_specs<'a>(specs: impl IntoIterator<Item = &'a Spec>) -> Catalog {
        let mut families = BTreeMap::new();
        for spec in specs {
            let Some(family) = Family::ALL.into_iter().find(|f| f.kind() == spec.kind) else {
                continue;
            };
            families.insert(family, endpoints_of(spec));
        }
        Catalog { families }
    }

    /// Reads both families' spec files from `cdi_dir`. A missing file is a
    /// family with no endpoints; a file that cannot be read or parsed is
    /// logged with its path and that family keeps what `previous` held, so a
    /// torn or hand-broken file never withdraws tokens kubelet checkpointed.
    pub fn load(cdi_dir: &Path, previous: &Catalog) -> Catalog {
        let mut families = BTreeMap::new();
        for family in Family::ALL {
            let endpoints = match read_family(cdi_dir, family) {
                Ok(Some(spec)) => endpoints_of(&spec),
                Ok(None) => Vec::new(),
                Err(e) => {
                    warn!("skipping CDI spec: {e}; keeping the {} tokens already served", family.kind());
                    previous.families.get(&family).cloned().unwrap_or_default()
                }
            };
            families.insert(family, endpoints);
        }
        Catalog { families }
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
                .flat_map(|ep| (0..SHARED_TOKENS).map(move |i| Token { id: shared_id(&ep.name, i), endpoint: ep }))
                .collect(),
            _ => eps.iter().map(|ep| Token { id: ep.name.clone(), endpoint: ep }).collect(),
        }
    }

    /// The endpoint a token ID stands for in a resource, if any.
    pub fn resolve(&self, resource: Resource, id: &str) -> Option<&Endpoint> {
        let name = match resource {
            Resource::Shared => {
                let (name, share) = id.rsplit_once(SHARED_INFIX)?;
                // Only the exact spelling we advertise: "07", never "7" or "007".
                let n: u32 = share.parse().ok()?;
                if n >= SHARED_TOKENS || share != format!("{n:02}") {
                    return None;
                }
                name
            }
            _ => id,
        };
        self.endpoints(resource.family()).iter().find(|ep| ep.name == name)
    }
}

/// A shared token's ID: the endpoint name and a two-digit share number.
pub fn shared_id(endpoint: &str, share: u32) -> String {
    format!("{endpoint}{SHARED_INFIX}{share:02}")
}

/// Reads and parses one family's file; `Ok(None)` when it does not exist.
fn read_family(cdi_dir: &Path, family: Family) -> Result<Option<Spec>, LoadError> {
    let path = cdi_dir.join(family.file_name());
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(LoadError::Io { path, source }),
    };
    let spec: Spec = serde_json::from_slice(&bytes).map_err(|e| LoadError::Malformed {
        path: path.clone(),
        reason: format!("not a CDI spec: {e}"),
    })?;
    if spec.kind != family.kind() {
        return Err(LoadError::Malformed {
            path,
            reason: format!("kind is {:?}, expected {:?}", spec.kind, family.kind()),
        });
    }
    Ok(Some(spec))
}

fn endpoints_of(spec: &Spec) -> Vec<Endpoint> {
    let key = |k: &str| format!("{}/{k}", cdi::ANNOTATION_PREFIX);
    let mut eps: Vec<Endpoint> = spec
        .devices
        .iter()
        .map(|d| {
            let numa = d.annotations.get(&key("numa")).and_then(|v| v.parse::<i64>().ok()).filter(|n| *n >= 0);
            let link = d.annotations.get(&key("link")).map(String::as_str);
            let unusable = d
                .container_edits
                .device_nodes
                .is_empty()
                .then(|| format!("CDI device {}={} injects no verbs device", spec.kind, d.name));
            Endpoint {
                name: d.name.clone(),
                cdi_name: format!("{}={}", spec.kind, d.name),
                numa,
                healthy: link != Some("Failed") && unusable.is_none(),
                unusable,
            }
        })
        .collect();
    eps.sort_by(|a, b| a.name.cmp(&b.name));
    eps.dedup_by(|a, b| a.name == b.name);
    eps
}
