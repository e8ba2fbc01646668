//! What a claim's CDI spec tells NCCL: `NCCL_IB_HCA`, one variable per
//! container. A container given NICs by two claims gets two specs that each
//! set it, and containerd applies CDI devices in order, a later value of a
//! variable replacing an earlier one: a spec that named only its own
//! claim's NICs would leave NCCL seeing one claim's. So each claim's value
//! is the union of every NIC of this driver the container was given, by
//! all its claims, each once, as `name:port` after NCCL's exact-match `=`
//! (`=mlx5_0:1,mlx5_1:1`), or `name:port:rail` where the rail record gives
//! every one's rail an index; every claim of the container then sets the
//! same value, and whichever is applied last is right.
//!
//! The containers come from the claim's `status.reservedFor` pods: each
//! container whose `resources.claims` names this claim, its other claims
//! resolved through the pod's `spec.resourceClaims` (and, for claims made
//! from templates, `status.resourceClaimStatuses`), and their allocations.
//! When the union cannot be known (no pod reserved, a pod or claim
//! unreadable, containers given this claim with different others) the
//! claim's own NICs are told, which is exact for a container with this
//! claim alone, and the driver says why and counts it.

use super::devices::{DraDevice, Pool};
use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The port an entry names when the spec gives no readable port: an mlx5
/// RDMA device is one port (a dual-port card is two devices).
pub const DEFAULT_PORT: u32 = 1;

/// One `NCCL_IB_HCA` entry, `mlx5_0:1`: the device's first port whose state
/// is `ACTIVE`, else its first port, else [`DEFAULT_PORT`]; `mlx5_0:1:0`
/// when the rail record gives the NIC's rail an index (NCCL 2.30.7+ reads
/// the third field as the rail; older releases read up to the port).
pub fn entry(device: &DraDevice) -> String {
    let ports: Vec<(u32, bool)> = device
        .ports
        .as_deref()
        .unwrap_or_default()
        .split(',')
        .filter_map(|p| {
            let (n, state) = p.split_once('=')?;
            Some((n.parse().ok()?, state.starts_with("ACTIVE")))
        })
        .collect();
    let port = ports
        .iter()
        .find(|(_, active)| *active)
        .or(ports.first())
        .map_or(DEFAULT_PORT, |(n, _)| *n);
    match device.rail_index {
        Some(rail) => format!("{}:{port}:{rail}", device.rdma_device),
        None => format!("{}:{port}", device.rdma_device),
    }
}

/// The variable's value for these entries: NCCL's exact-match `=` (plain
/// `mlx5_1` would also match `mlx5_10`), each entry once, in natural order
/// so every claim of a container writes the same bytes. Rails are told for
/// every NIC or for none: where one entry has no rail index (a NIC on no
/// rail, or on two) the others' are dropped too, so NCCL never pairs a
/// NIC of a known rail with one whose rail it must guess.
pub fn value(entries: &[String]) -> String {
    let every_rail = entries.iter().all(|e| e.splitn(3, ':').nth(2).is_some());
    let told: Vec<String> = entries
        .iter()
        .map(|e| match every_rail {
            true => e.clone(),
            false => e.splitn(3, ':').take(2).collect::<Vec<_>>().join(":"),
        })
        .collect();
    let unique: BTreeSet<&String> = told.iter().collect();
    let mut sorted: Vec<&String> = unique.into_iter().collect();
    // By the device name's number (`mlx5_2` before `mlx5_10`), then port.
    sorted.sort_by_key(|e| {
        let (name, port) = e.split_once(':').unwrap_or((e.as_str(), ""));
        (
            crate::views::natural_key(name),
            crate::views::natural_key(port),
        )
    });
    let joined: Vec<&str> = sorted.iter().map(|e| e.as_str()).collect();
    format!("={}", joined.join(","))
}

/// Why one API read for the union gave no object.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ReadError {
    /// The object is not there (deleted, or not created yet).
    #[error("not found")]
    NotFound,
    /// The API server gave no answer within the bound.
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
    /// The API server refused or the connection failed (shared: one read's
    /// error may be named by several containers).
    #[error(transparent)]
    Api(Arc<crate::cluster::ClusterError>),
}

/// Why a claim's allocation cannot be read as this driver's devices.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AllocationError {
    /// The claim has no allocation (yet).
    #[error("not allocated")]
    NotAllocated,
    /// A device of its results is not in the pool published now.
    #[error("device {0} is no longer published")]
    Unpublished(String),
}

/// Why another claim a container holds gave no NICs.
#[derive(Debug, Clone, thiserror::Error)]
pub enum HeldClaimError {
    /// The pod's status does not name the claim's object yet.
    #[error("not in the pod's status.resourceClaimStatuses yet")]
    NotNamedYet,
    /// It was not among the claims read (a pod changed between reads).
    #[error("not read")]
    NotRead,
    /// Reading it failed.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// Its allocation is not readable as this driver's devices.
    #[error(transparent)]
    Allocation(#[from] AllocationError),
}

/// Why the union of a claim's containers' NICs is not known.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Inexact {
    /// No pod holds the claim reserved yet.
    #[error("no pod is in its status.reservedFor")]
    NoPod,
    /// A pod reserving it could not be read.
    #[error("pod {namespace}/{name} could not be read: {cause}")]
    PodUnreadable {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// Why.
        cause: ReadError,
    },
    /// A claim a container also holds could not be read or resolved.
    #[error("claim {name} of pod {pod}, container {container}: {cause}")]
    ClaimUnreadable {
        /// The pod, `ns/name`.
        pod: String,
        /// The container.
        container: String,
        /// The claim's name (the object's, or the pod's name for it).
        name: String,
        /// Why.
        cause: HeldClaimError,
    },
    /// The claim's own allocation cannot be read as this driver's devices.
    #[error("its allocation: {cause}")]
    Allocation {
        /// Why.
        cause: AllocationError,
    },
    /// Containers given this claim were given different other NICs: one
    /// value cannot be right for all of them.
    #[error("containers {first} and {second} hold it beside different NICs ({first_value} and {second_value})")]
    Disagree {
        /// `pod/container`.
        first: String,
        /// Its union.
        first_value: String,
        /// `pod/container`.
        second: String,
        /// Its union.
        second_value: String,
    },
}

/// Where the devices of an allocation are: this driver's results in this
/// node's pool.
#[derive(Debug, Clone, Copy)]
pub struct Place<'a> {
    /// The driver name.
    pub driver: &'a str,
    /// The pool (the node's name).
    pub pool_name: &'a str,
    /// The pool as published now.
    pub pool: &'a Pool,
}

impl Place<'_> {
    /// The entries of `claim`'s results of this driver and pool, only those
    /// of `request` (or its subrequests) when given; a device no longer
    /// published is an error naming it.
    pub fn entries(
        &self,
        claim: &ResourceClaim,
        request: Option<&str>,
    ) -> Result<Vec<String>, AllocationError> {
        let results = claim
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.as_ref())
            .ok_or(AllocationError::NotAllocated)?;
        let mut out = Vec::new();
        for r in results {
            if r.driver != self.driver || r.pool != self.pool_name {
                continue;
            }
            let of_request = request.is_none_or(|q| {
                r.request == q
                    || r.request
                        .strip_prefix(q)
                        .is_some_and(|s| s.starts_with('/'))
            });
            if !of_request {
                continue;
            }
            let device = self
                .pool
                .device(&r.device)
                .ok_or_else(|| AllocationError::Unpublished(r.device.clone()))?;
            out.push(entry(device));
        }
        Ok(out)
    }
}

/// The ResourceClaim object a pod's claim `pod_claim` names: its own name
/// for `resourceClaimName`, the generated one from the pod's status for a
/// template's.
pub fn object_name(pod: &Pod, pod_claim: &str) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    let declared = spec
        .resource_claims
        .iter()
        .flatten()
        .find(|c| c.name == pod_claim)?;
    if let Some(name) = &declared.resource_claim_name {
        return Some(name.clone());
    }
    pod.status
        .as_ref()?
        .resource_claim_statuses
        .iter()
        .flatten()
        .find(|s| s.name == pod_claim)?
        .resource_claim_name
        .clone()
}

/// One claim a container names.
struct Held {
    /// The ResourceClaim object, `None` while the pod's status does not name
    /// the one made from its template.
    object: Option<String>,
    /// The pod's name for it.
    pod_claim: String,
    /// The one request of it the container is limited to, if any.
    request: Option<String>,
}

/// Every container (init containers too) of `pod` with the claims it names.
fn containers(pod: &Pod) -> Vec<(&Container, Vec<Held>)> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    spec.init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .map(|c| {
            let claims = c
                .resources
                .as_ref()
                .and_then(|r| r.claims.as_ref())
                .into_iter()
                .flatten()
                .map(|r| Held {
                    object: object_name(pod, &r.name),
                    pod_claim: r.name.clone(),
                    request: r.request.clone(),
                })
                .collect();
            (c, claims)
        })
        .collect()
}

/// The claim objects the containers holding `claim_name` (in `pods`) also
/// hold: what must be read to know the union.
pub fn others(claim_name: &str, pods: &[Pod]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for pod in pods {
        for (_, claims) in containers(pod) {
            if claims
                .iter()
                .any(|h| h.object.as_deref() == Some(claim_name))
            {
                out.extend(claims.into_iter().filter_map(|h| h.object));
            }
        }
    }
    out.remove(claim_name);
    out
}

/// The entries every container holding `claim` was given by all its
/// claims (`read`: the other claims by object name, each read or why not).
/// Its own entries when no container names it.
pub fn union(
    place: Place<'_>,
    claim: &ResourceClaim,
    pods: &[Pod],
    read: &BTreeMap<String, Result<ResourceClaim, ReadError>>,
) -> Result<Vec<String>, Inexact> {
    let name = claim.metadata.name.as_deref().unwrap_or_default();
    let mut agreed: Option<(String, Vec<String>)> = None;
    for pod in pods {
        let pod_name = format!(
            "{}/{}",
            pod.metadata.namespace.as_deref().unwrap_or_default(),
            pod.metadata.name.as_deref().unwrap_or_default()
        );
        for (container, claims) in containers(pod) {
            if !claims.iter().any(|h| h.object.as_deref() == Some(name)) {
                continue;
            }
            let unreadable = |name: &str, cause: HeldClaimError| Inexact::ClaimUnreadable {
                pod: pod_name.clone(),
                container: container.name.clone(),
                name: name.to_string(),
                cause,
            };
            let mut entries = Vec::new();
            for Held {
                object,
                pod_claim,
                request,
            } in &claims
            {
                let Some(object) = object else {
                    return Err(unreadable(pod_claim, HeldClaimError::NotNamedYet));
                };
                let held = if object == name {
                    claim
                } else {
                    match read.get(object) {
                        Some(Ok(c)) => c,
                        Some(Err(cause)) => return Err(unreadable(object, cause.clone().into())),
                        None => return Err(unreadable(object, HeldClaimError::NotRead)),
                    }
                };
                entries.extend(
                    place
                        .entries(held, request.as_deref())
                        .map_err(|cause| unreadable(object, cause.into()))?,
                );
            }
            let here = format!("{pod_name}/{}", container.name);
            match &agreed {
                None => agreed = Some((here, entries)),
                Some((first, before)) if value(before) != value(&entries) => {
                    return Err(Inexact::Disagree {
                        first: first.clone(),
                        first_value: value(before),
                        second: here,
                        second_value: value(&entries),
                    })
                }
                Some(_) => {}
            }
        }
    }
    match agreed {
        Some((_, entries)) => Ok(entries),
        // No container names it: its own NICs are what anyone gets.
        None => place
            .entries(claim, None)
            .map_err(|cause| Inexact::Allocation { cause }),
    }
}

/// The pods that hold `claim` reserved (`status.reservedFor` entries of
/// core `pods`), by name in the claim's namespace.
pub fn reserving_pods(claim: &ResourceClaim) -> Vec<String> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.reserved_for.as_ref())
        .into_iter()
        .flatten()
        .filter(|r| r.resource == "pods" && r.api_group.as_deref().unwrap_or_default().is_empty())
        .map(|r| r.name.clone())
        .collect()
}

/// Reads what [`union`] needs (the reserving pods, then the other claims
/// their containers hold), each read within `api_timeout` and what is left
/// until `until`, and returns the union for `claim`.
pub async fn read_union(
    client: &kube::Client,
    claim: &ResourceClaim,
    place: Place<'_>,
    until: Instant,
    api_timeout: Duration,
) -> Result<Vec<String>, Inexact> {
    let namespace = claim.metadata.namespace.clone().unwrap_or_default();
    let names = reserving_pods(claim);
    if names.is_empty() {
        return Err(Inexact::NoPod);
    }
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let mut pods = Vec::new();
    for name in names {
        let what = format!("reading Pod {namespace}/{name}");
        let read = bounded(&what, pods_api.get_opt(&name), until, api_timeout).await;
        match read {
            Ok(Some(pod)) => pods.push(pod),
            Ok(None) => {
                return Err(Inexact::PodUnreadable {
                    namespace,
                    name,
                    cause: ReadError::NotFound,
                })
            }
            Err(cause) => {
                return Err(Inexact::PodUnreadable {
                    namespace,
                    name,
                    cause,
                })
            }
        }
    }
    let claim_name = claim.metadata.name.as_deref().unwrap_or_default();
    let claims_api: Api<ResourceClaim> = Api::namespaced(client.clone(), &namespace);
    let mut read = BTreeMap::new();
    for other in others(claim_name, &pods) {
        let what = format!("reading ResourceClaim {namespace}/{other}");
        let got = match bounded(&what, claims_api.get_opt(&other), until, api_timeout).await {
            Ok(Some(c)) => Ok(c),
            Ok(None) => Err(ReadError::NotFound),
            Err(cause) => Err(cause),
        };
        read.insert(other, got);
    }
    union(place, claim, &pods, &read)
}

/// One API read within `api_timeout` and what is left until `until`.
async fn bounded<T>(
    what: &str,
    read: impl std::future::Future<Output = Result<T, kube::Error>>,
    until: Instant,
    api_timeout: Duration,
) -> Result<T, ReadError> {
    let left = until.saturating_duration_since(Instant::now());
    match tokio::time::timeout(left.min(api_timeout), read).await {
        Err(_) => Err(ReadError::TimedOut(left.min(api_timeout))),
        Ok(Err(e)) => Err(ReadError::Api(Arc::new(crate::cluster::ClusterError::api(
            what, e,
        )))),
        Ok(Ok(v)) => Ok(v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdi::Family;
    use crate::record::LinkState;
    use serde_json::json;

    fn nic(i: usize, ports: Option<&str>) -> DraDevice {
        DraDevice {
            name: format!("nic-{i}"),
            family: Family::Whole,
            cdi_id: format!("gpustack.ai/rdma=mlx5_{i}"),
            rdma_device: format!("mlx5_{i}"),
            link: LinkState::Ok,
            ports: ports.map(str::to_string),
            rail_index: None,
            attributes: Default::default(),
        }
    }

    fn pool() -> Pool {
        Pool {
            // The pool's order: by name.
            devices: {
                let mut d: Vec<DraDevice> = (0..12).map(|i| nic(i, None)).collect();
                d.sort_by(|a, b| a.name.cmp(&b.name));
                d
            },
            refused: vec![],
        }
    }

    fn claim(name: &str, devices: &[(&str, &str)]) -> ResourceClaim {
        let results: Vec<_> = devices
            .iter()
            .map(|(request, device)| json!({"driver": "rdma.gpustack.ai", "pool": "node-a", "device": device, "request": request}))
            .collect();
        serde_json::from_value(json!({
            "metadata": {"namespace": "team", "name": name},
            "spec": {},
            "status": {"allocation": {"devices": {"results": results}},
                       "reservedFor": [{"resource": "pods", "name": "job", "uid": "u"}]},
        }))
        .unwrap()
    }

    /// A pod whose containers hold these pod claims, the pod claims naming
    /// objects directly or (`tmpl:`) through the pod's status.
    fn pod(containers: &[(&str, &[&str])], claims: &[(&str, &str)]) -> Pod {
        let spec_claims: Vec<_> = claims
            .iter()
            .map(|(n, o)| match o.strip_prefix("tmpl:") {
                Some(_) => json!({"name": n, "resourceClaimTemplateName": "t"}),
                None => json!({"name": n, "resourceClaimName": o}),
            })
            .collect();
        let statuses: Vec<_> = claims
            .iter()
            .filter_map(|(n, o)| {
                o.strip_prefix("tmpl:")
                    .map(|o| json!({"name": n, "resourceClaimName": o}))
            })
            .collect();
        let containers: Vec<_> = containers
            .iter()
            .map(|(c, held)| {
                let held: Vec<_> = held
                    .iter()
                    .map(|h| match h.split_once('#') {
                        Some((n, r)) => json!({"name": n, "request": r}),
                        None => json!({"name": h}),
                    })
                    .collect();
                json!({"name": c, "resources": {"claims": held}})
            })
            .collect();
        serde_json::from_value(json!({
            "metadata": {"namespace": "team", "name": "job"},
            "spec": {"containers": containers, "resourceClaims": spec_claims},
            "status": {"resourceClaimStatuses": statuses},
        }))
        .unwrap()
    }

    fn place(pool: &Pool) -> Place<'_> {
        Place {
            driver: "rdma.gpustack.ai",
            pool_name: "node-a",
            pool,
        }
    }

    #[test]
    fn an_entry_names_the_active_port_and_the_value_each_nic_once_in_natural_order() {
        assert_eq!(entry(&nic(0, None)), "mlx5_0:1");
        assert_eq!(
            entry(&nic(0, Some("1=DOWN/Disabled,2=ACTIVE/LinkUp"))),
            "mlx5_0:2"
        );
        assert_eq!(entry(&nic(0, Some("2=DOWN/Polling"))), "mlx5_0:2");
        let entries = ["mlx5_10:1", "mlx5_2:1", "mlx5_10:1"].map(String::from);
        assert_eq!(value(&entries), "=mlx5_2:1,mlx5_10:1");
    }

    #[test]
    fn a_nic_whose_rail_has_an_index_is_told_it_as_the_third_field() {
        let mut d = nic(0, Some("1=ACTIVE/LinkUp"));
        d.rail_index = Some(3);
        assert_eq!(entry(&d), "mlx5_0:1:3");
        let entries = ["mlx5_10:1:1", "mlx5_2:1:0"].map(String::from);
        assert_eq!(value(&entries), "=mlx5_2:1:0,mlx5_10:1:1");
    }

    #[test]
    fn one_nic_without_a_rail_index_drops_the_rails_of_every_entry() {
        // A NIC on no rail among railed ones: NCCL gets no partial rail map.
        let entries = ["mlx5_0:1:0", "mlx5_1:1", "mlx5_0:1:0"].map(String::from);
        assert_eq!(value(&entries), "=mlx5_0:1,mlx5_1:1");
    }

    #[test]
    fn a_container_with_two_claims_gets_their_union_from_each_of_them() {
        let pool = pool();
        let a = claim("a", &[("nic", "nic-0")]);
        let b = claim("b-generated", &[("nic", "nic-10"), ("other", "nic-3")]);
        let p = pod(
            &[("train", &["a", "b#nic"]), ("sidecar", &[])],
            &[("a", "a"), ("b", "tmpl:b-generated")],
        );
        assert_eq!(
            others("a", std::slice::from_ref(&p)),
            BTreeSet::from(["b-generated".to_string()])
        );
        let read = BTreeMap::from([("b-generated".to_string(), Ok(b.clone()))]);
        let told = union(place(&pool), &a, std::slice::from_ref(&p), &read).unwrap();
        // Only b's request `nic` is the container's: nic-3 is not.
        assert_eq!(value(&told), "=mlx5_0:1,mlx5_10:1");
        let read = BTreeMap::from([("a".to_string(), Ok(a.clone()))]);
        let told_b = union(place(&pool), &b, &[p], &read).unwrap();
        assert_eq!(value(&told_b), value(&told));
    }

    #[test]
    fn an_unreadable_claim_or_containers_that_disagree_are_inexact_naming_why() {
        let pool = pool();
        let a = claim("a", &[("nic", "nic-0")]);
        let p = pod(&[("train", &["a", "b"])], &[("a", "a"), ("b", "b")]);
        let read = BTreeMap::from([(
            "b".to_string(),
            Err(ReadError::TimedOut(Duration::from_secs(3))),
        )]);
        let e = union(place(&pool), &a, std::slice::from_ref(&p), &read).unwrap_err();
        assert!(matches!(e, Inexact::ClaimUnreadable { .. }), "{e}");
        assert!(
            e.to_string().contains("claim b of pod ")
                && e.to_string().contains("train: no answer within 3s"),
            "{e}"
        );

        let two = pod(
            &[("x", &["a", "b"]), ("y", &["a"])],
            &[("a", "a"), ("b", "b")],
        );
        let read = BTreeMap::from([("b".to_string(), Ok(claim("b", &[("nic", "nic-1")])))]);
        let e = union(place(&pool), &a, &[two], &read).unwrap_err();
        assert!(matches!(e, Inexact::Disagree { .. }), "{e}");
        // A claim no container names: its own NICs, exactly.
        let unused = pod(&[("x", &[])], &[]);
        assert_eq!(
            union(place(&pool), &a, &[unused], &BTreeMap::new()).unwrap(),
            ["mlx5_0:1"]
        );
        assert_eq!(reserving_pods(&a), ["job"]);
    }
}
