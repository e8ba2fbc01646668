//! Allocation, recomputed from the current catalog on every call: nothing an
//! allocation does is remembered.
//!
//! Preferred allocation answers only with offered IDs and never with more
//! than the size asked, in order:
//! 1. every must-include ID that was offered, as given (up to the size);
//! 2. the rest from one NUMA node: the node most must-include tokens sit on,
//!    or else the smallest node that can supply the whole remainder (best
//!    fit, which keeps larger nodes whole for larger requests), lowest node
//!    number on a tie;
//! 3. if that node runs short, the other nodes from the fullest down, and
//!    tokens without a NUMA node last.
//!
//! Within a node, shared tokens are **spread**: each pick goes to the
//! endpoint granted the fewest tokens so far in this request (must-include
//! counted), then to the one with the most tokens still available (the least
//! loaded), then by name. A request for N shared tokens so lands on N
//! different interfaces where the node has them, which is what a job that
//! asks for several shares wants (one queue pair set per rail).

use super::api;
use super::catalog::{Catalog, Endpoint, Resource};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};
use tonic::Status;

/// The environment variable NCCL reads to choose its HCAs.
pub const NCCL_IB_HCA: &str = "NCCL_IB_HCA";

/// The annotation-key prefix CDI defines for runtimes that read device names
/// from annotations (kubelets before the typed field).
pub const CDI_ANNOTATION_PREFIX: &str = "cdi.k8s.io/";

/// How an allocation hands CDI device names to the runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CdiDelivery {
    /// The typed `cdi_devices` field (kubelet 1.31 and later).
    Field,
    /// The `cdi.k8s.io/nodefabric_<resource>` annotation, for older kubelets.
    Annotations,
}

/// The response to one container's request, or a refusal naming the ID.
pub fn container_response(
    catalog: &Catalog,
    resource: Resource,
    ids: &[String],
    delivery: CdiDelivery,
) -> Result<api::ContainerAllocateResponse, Status> {
    let mut granted: Vec<&Endpoint> = Vec::new();
    for id in ids {
        let ep = catalog.resolve(resource, id).ok_or_else(|| {
            Status::invalid_argument(format!(
                "device ID {id:?} is no {} token of this node (family {})",
                resource.suffix(),
                resource.family().kind()
            ))
        })?;
        if let Some(why) = &ep.unusable {
            return Err(Status::failed_precondition(format!(
                "device ID {id:?}: {why}"
            )));
        }
        if !granted.iter().any(|g| g.name == ep.name) {
            granted.push(ep);
        }
    }
    granted.sort_by_key(|e| natural(&e.name));
    let names: Vec<&str> = granted.iter().map(|e| e.name.as_str()).collect();
    let cdi_names: Vec<String> = granted.iter().map(|e| e.cdi_name.clone()).collect();
    let mut resp = api::ContainerAllocateResponse::default();
    if !names.is_empty() {
        // The leading "=" makes NCCL match names exactly: plain "mlx5_1" would also pick mlx5_10.
        resp.envs
            .insert(NCCL_IB_HCA.into(), format!("={}", names.join(",")));
    }
    match delivery {
        CdiDelivery::Field => {
            resp.cdi_devices = cdi_names
                .into_iter()
                .map(|name| api::CdiDevice { name })
                .collect();
        }
        CdiDelivery::Annotations => {
            if !cdi_names.is_empty() {
                resp.annotations
                    .insert(annotation_key(resource), cdi_names.join(","));
            }
        }
    }
    Ok(resp)
}

/// The CDI annotation key for a resource: `cdi.k8s.io/nodefabric_rdma.shared`.
pub fn annotation_key(resource: Resource) -> String {
    format!("{CDI_ANNOTATION_PREFIX}nodefabric_{}", resource.suffix())
}

/// The offered IDs of one endpoint, in share order: candidates are handled
/// per endpoint (hundreds), not per ID (tens of thousands).
struct Run<'a> {
    endpoint: &'a Endpoint,
    /// The endpoint's place in natural name order.
    rank: usize,
    ids: Vec<&'a str>,
}

/// The preferred IDs for one container (see the module docs for the order):
/// only IDs from `available`, at most `size` of them, exactly `size` when
/// enough were offered. Per ID only a lookup and one integer sort: kubelet may offer tens of
/// thousands.
pub fn preferred(
    catalog: &Catalog,
    resource: Resource,
    available: &[String],
    must_include: &[String],
    size: usize,
) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut chosen: HashSet<&str> = HashSet::new();
    if !must_include.is_empty() {
        // Only what was offered is handed back, and never more than asked:
        // kubelet treats any other answer as a plugin error.
        let offered: HashSet<&str> = available.iter().map(String::as_str).collect();
        for id in must_include {
            if out.len() >= size {
                break;
            }
            if offered.contains(id.as_str()) && chosen.insert(id) {
                out.push(id.clone());
            }
        }
    }
    if out.len() >= size {
        return out;
    }
    // Each endpoint's place in natural order (mlx5_2 before mlx5_10),
    // computed once per endpoint rather than once per ID.
    let eps = catalog.endpoints(resource.family());
    let mut by_name: Vec<usize> = (0..eps.len()).collect();
    by_name.sort_by_cached_key(|&i| natural(&eps[i].name));
    let mut rank = vec![0; eps.len()];
    for (r, &i) in by_name.iter().enumerate() {
        rank[i] = r;
    }
    // Candidates: available, ours, not already chosen, bucketed by endpoint
    // (in natural order), each bucket in share order and each ID once: an
    // (endpoint, share) pair has exactly one spelling. Linear in the IDs,
    // with only small per-endpoint sorts.
    let mut buckets: Vec<Vec<(u32, &str)>> = vec![Vec::new(); eps.len()];
    for id in available.iter().map(String::as_str) {
        // Usually nothing is must-include: then no ID is hashed.
        if !chosen.is_empty() && chosen.contains(id) {
            continue;
        }
        if let Some(place) = catalog.locate(resource, id) {
            buckets[rank[place.endpoint]].push((place.share, id));
        }
    }
    let runs: Vec<Run> = buckets
        .into_iter()
        .zip(by_name.iter())
        .enumerate()
        .filter(|(_, (b, _))| !b.is_empty())
        .map(|(r, (mut b, &i))| {
            b.sort_unstable_by_key(|&(share, _)| share);
            b.dedup_by_key(|&mut (share, _)| share);
            Run {
                endpoint: &eps[i],
                rank: r,
                ids: b.into_iter().map(|(_, id)| id).collect(),
            }
        })
        .collect();
    let need = size - out.len();

    let mut per_node: BTreeMap<i64, usize> = BTreeMap::new();
    for run in &runs {
        if let Some(n) = run.endpoint.numa {
            *per_node.entry(n).or_default() += run.ids.len();
        }
    }
    let mut anchor: BTreeMap<i64, usize> = BTreeMap::new();
    for n in out
        .iter()
        .filter_map(|id| catalog.resolve(resource, id)?.numa)
    {
        *anchor.entry(n).or_default() += 1;
    }
    let target = fullest(&anchor)
        .or_else(|| {
            per_node
                .iter()
                .filter(|(_, c)| **c >= need)
                .min_by_key(|(n, c)| (**c, **n))
                .map(|(n, _)| *n)
        })
        .or_else(|| fullest(&per_node));
    // Node order: the target, then the others fullest first, then no node.
    let node_order = |numa: Option<i64>| -> (u8, i64, i64) {
        match numa {
            Some(n) if Some(n) == target => (0, 0, n),
            Some(n) => (1, -(per_node[&n] as i64), n),
            None => (2, 0, 0),
        }
    };
    // Runs are in rank order, and stay so within each group.
    let mut groups: BTreeMap<(u8, i64, i64), Vec<Run>> = BTreeMap::new();
    for run in runs {
        groups
            .entry(node_order(run.endpoint.numa))
            .or_default()
            .push(run);
    }
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for id in &out {
        if let Some(ep) = catalog.resolve(resource, id) {
            *counts.entry(ep.name.as_str()).or_default() += 1;
        }
    }
    for (_, group) in groups {
        if out.len() >= size {
            break;
        }
        if resource == Resource::Shared {
            spread(&group, &mut counts, &mut out, size);
        } else {
            let room = size - out.len();
            out.extend(
                group
                    .iter()
                    .flat_map(|r| r.ids.iter())
                    .take(room)
                    .map(|id| id.to_string()),
            );
        }
    }
    out
}

/// The node with the most tokens, the lowest number on a tie.
fn fullest(per_node: &BTreeMap<i64, usize>) -> Option<i64> {
    per_node
        .iter()
        .max_by_key(|(n, c)| (**c, -**n))
        .map(|(n, _)| *n)
}

/// A heap entry of [`spread`], greatest first: fewest granted, most left,
/// lowest rank; then the run and how many of its IDs (lowest share first)
/// are taken.
type Pick = (Reverse<usize>, usize, Reverse<usize>, usize, usize);

/// Picks shared tokens one at a time onto the least-used endpoint: fewest
/// granted in this request, then most still available, then first in
/// natural order. A heap keeps each pick O(log endpoints).
fn spread<'a>(
    group: &[Run<'a>],
    counts: &mut HashMap<&'a str, usize>,
    out: &mut Vec<String>,
    size: usize,
) {
    let mut heap: BinaryHeap<Pick> = group
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let granted = counts.get(r.endpoint.name.as_str()).copied().unwrap_or(0);
            (Reverse(granted), r.ids.len(), Reverse(r.rank), i, 0)
        })
        .collect();
    while out.len() < size {
        let Some((Reverse(granted), left, rank, i, taken)) = heap.pop() else {
            break;
        };
        let run = &group[i];
        out.push(run.ids[taken].to_string());
        counts.insert(run.endpoint.name.as_str(), granted + 1);
        if left > 1 {
            heap.push((Reverse(granted + 1), left - 1, rank, i, taken + 1));
        }
    }
}

/// A sort key that orders `mlx5_2` before `mlx5_10`.
fn natural(s: &str) -> Vec<(String, u64)> {
    let mut key = Vec::new();
    let mut text = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            let mut num = c.to_digit(10).unwrap() as u64;
            while let Some(d) = chars.peek().and_then(|d| d.to_digit(10)) {
                num = num.saturating_mul(10).saturating_add(d as u64);
                chars.next();
            }
            key.push((std::mem::take(&mut text), num));
        } else {
            text.push(c);
        }
    }
    key.push((text, 0));
    key
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdi::Family;
    use crate::plugin::catalog::shared_id;

    /// `n` endpoints `ep0…`, the first half on NUMA node 0, the rest on 1.
    fn catalog(n: usize) -> Catalog {
        let eps = (0..n)
            .map(|i| Endpoint {
                name: format!("ep{i}"),
                cdi_name: format!("k=ep{i}"),
                numa: Some(if i < n / 2 { 0 } else { 1 }),
                healthy: true,
                unusable: None,
                annotations: None,
            })
            .collect::<Vec<_>>();
        let mut eps = eps;
        eps.sort_by(|a, b| a.name.cmp(&b.name));
        Catalog::default().with_family(Family::Whole, eps)
    }

    #[test]
    fn forty_thousand_shared_ids_each_come_back_once_spread_over_every_endpoint_first() {
        let c = catalog(625);
        let all: Vec<String> = (0..625)
            .flat_map(|e| (0..64).map(move |s| shared_id(&format!("ep{e}"), s)))
            .collect();
        let got = preferred(&c, Resource::Shared, &all, &[], all.len());
        assert_eq!(got.len(), 40_000);
        assert_eq!(
            got.iter().collect::<HashSet<_>>().len(),
            40_000,
            "no ID twice"
        );
        let endpoint = |id: &String| {
            id.rsplit_once("-shared-").unwrap().0[2..]
                .parse::<usize>()
                .unwrap()
        };
        // Too big for one node: the fuller node 1 (ep312…ep624) first, one
        // share per endpoint before any gets a second.
        let first: HashSet<usize> = got[..313].iter().map(endpoint).collect();
        assert_eq!(first.len(), 313);
        assert!(first.iter().all(|e| *e >= 312));
        // 300 fit on either node: the smaller (node 0), 300 distinct endpoints.
        let some = preferred(&c, Resource::Shared, &all, &[], 300);
        let picked: HashSet<usize> = some.iter().map(endpoint).collect();
        assert_eq!(picked.len(), 300);
        assert!(picked.iter().all(|e| *e < 312));
    }

    #[test]
    fn duplicated_and_unknown_ids_are_neither_repeated_nor_offered() {
        let c = catalog(4);
        let avail = vec!["ep0".to_string(), "ep0".into(), "nope".into(), "ep1".into()];
        let got = preferred(
            &c,
            Resource::Exclusive,
            &avail,
            &["ep1".to_string(), "ep1".into()],
            3,
        );
        assert_eq!(got, ["ep1", "ep0"]);
    }

    #[test]
    fn natural_order() {
        let mut v = vec!["mlx5_10", "mlx5_2", "mlx5_1"];
        v.sort_by_key(|s| natural(s));
        assert_eq!(v, ["mlx5_1", "mlx5_2", "mlx5_10"]);
    }
}
