//! What the plugin tells an operator: Prometheus metrics and the state
//! behind `/healthz` and `/readyz` (served by [`crate::kubelet::probes`]).
//!
//! Metric names, all prefixed `nodefabric_plugin_`:
//!
//! | name | type | labels |
//! |---|---|---|
//! | `tokens` | gauge | `resource`, `health` (`Healthy`/`Unhealthy`) |
//! | `spec_reloads_total` | counter | `family` (CDI kind) |
//! | `spec_read_errors_total` | counter | `family`, `cause` |
//! | `spec_readable` | gauge (0/1) | `family` |
//! | `registrations_total` | counter | `resource` |
//! | `registered` | gauge (0/1) | `resource` |
//! | `list_and_watch_streams` | gauge | `resource` |
//! | `list_and_watch_dropped_total` | counter | `resource` |
//! | `allocate_duration_seconds` | histogram | `resource` |
//! | `preferred_allocation_duration_seconds` | histogram | `resource` |

use super::catalog::{Catalog, Resource, HEALTHY, SHARED_TOKENS, UNHEALTHY};
use crate::cdi::Family as CdiFamily;
use crate::kubelet::probes::Probes;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Labels naming one served resource.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabel {
    /// The full resource name (`device.gpustack.ai/rdma`).
    pub resource: String,
}

/// Labels of the token gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TokenLabels {
    resource: String,
    health: &'static str,
}

/// Labels naming one CDI family.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FamilyLabel {
    family: &'static str,
}

/// Labels of the read-error counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    family: &'static str,
    cause: &'static str,
}

/// Latency buckets from 20 µs to about 0.3 s: Allocate takes a tenth of a
/// millisecond, a 40,000-ID preferred allocation tens of milliseconds.
fn latency() -> Histogram {
    Histogram::new(exponential_buckets(20e-6, 2.0, 15))
}

/// Every metric and the readiness facts, shared by the loop, the gRPC
/// Why `/livez` fails: the plugin must be restarted to recover.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Unhealthy {
    /// The CDI folder was deleted on the host under the mount, with why.
    #[error("{0}")]
    Stale(String),
    /// A look at the CDI folder has not returned for this long.
    #[error("reading the CDI specs has not returned for {}s", .0.as_secs())]
    LookStalled(std::time::Duration),
}

/// services and the HTTP server.
pub struct Observed {
    registry: Registry,
    tokens: Family<TokenLabels, Gauge>,
    reloads: Family<FamilyLabel, Counter>,
    read_errors: Family<ErrorLabels, Counter>,
    readable: Family<FamilyLabel, Gauge>,
    registrations: Family<ResourceLabel, Counter>,
    registered_gauge: Family<ResourceLabel, Gauge>,
    /// Open ListAndWatch streams per resource.
    pub streams: Family<ResourceLabel, Gauge>,
    /// ListAndWatch streams dropped because the client did not drain them.
    pub dropped: Family<ResourceLabel, Counter>,
    /// Allocate latency per resource.
    pub allocate: Family<ResourceLabel, Histogram, fn() -> Histogram>,
    /// GetPreferredAllocation latency per resource.
    pub preferred: Family<ResourceLabel, Histogram, fn() -> Histogram>,
    state: Mutex<State>,
}

/// What readiness and liveness are decided from.
#[derive(Debug, Default)]
struct State {
    /// Resources served, by full name.
    served: BTreeSet<String>,
    /// Resources kubelet has accepted a registration for, since the last
    /// time their sockets were replaced.
    registered: BTreeSet<String>,
    /// Spec files that cannot be read now, with why.
    unreadable: Vec<String>,
    /// When the current look at the CDI folder began, if one is running.
    loading_since: Option<Instant>,
    /// Why the CDI or kubelet folder this process sees is a deleted one
    /// (see [`crate::mounts`]), if one is.
    stale: Option<String>,
}

/// A look at the CDI folder running longer than this (a hung filesystem)
/// makes `/healthz` fail, so kubelet restarts the container.
pub const STALL_LIMIT: Duration = Duration::from_secs(60);

impl Observed {
    /// Metrics for the resources `served` (full names), all at zero.
    pub fn new(served: &[String]) -> Observed {
        let mut registry = Registry::with_prefix("nodefabric_plugin");
        let o = Observed {
            tokens: Family::default(),
            reloads: Family::default(),
            read_errors: Family::default(),
            readable: Family::default(),
            registrations: Family::default(),
            registered_gauge: Family::default(),
            streams: Family::default(),
            dropped: Family::default(),
            allocate: Family::new_with_constructor(latency),
            preferred: Family::new_with_constructor(latency),
            registry: Registry::default(),
            state: Mutex::new(State {
                served: served.iter().cloned().collect(),
                ..State::default()
            }),
        };
        registry.register(
            "tokens",
            "Tokens advertised to kubelet, by resource and health",
            o.tokens.clone(),
        );
        registry.register(
            "spec_reloads",
            "CDI spec files parsed because their bytes changed",
            o.reloads.clone(),
        );
        registry.register(
            "spec_read_errors",
            "CDI spec files refused, by cause",
            o.read_errors.clone(),
        );
        registry.register(
            "spec_readable",
            "1 when the family's CDI spec is readable (or absent)",
            o.readable.clone(),
        );
        registry.register(
            "registrations",
            "Registrations kubelet accepted",
            o.registrations.clone(),
        );
        registry.register(
            "registered",
            "1 while the resource is registered with kubelet",
            o.registered_gauge.clone(),
        );
        registry.register(
            "list_and_watch_streams",
            "Open ListAndWatch streams",
            o.streams.clone(),
        );
        registry.register(
            "list_and_watch_dropped",
            "ListAndWatch streams dropped because the client did not drain them",
            o.dropped.clone(),
        );
        registry.register(
            "allocate_duration_seconds",
            "Allocate latency",
            o.allocate.clone(),
        );
        registry.register(
            "preferred_allocation_duration_seconds",
            "GetPreferredAllocation latency",
            o.preferred.clone(),
        );
        for name in served {
            let label = ResourceLabel {
                resource: name.clone(),
            };
            o.registered_gauge.get_or_create(&label).set(0);
            o.streams.get_or_create(&label).set(0);
            let _ = o.registrations.get_or_create(&label);
        }
        for family in CdiFamily::ALL {
            o.readable
                .get_or_create(&FamilyLabel {
                    family: family.kind(),
                })
                .set(1);
            let _ = o.reloads.get_or_create(&FamilyLabel {
                family: family.kind(),
            });
        }
        Observed { registry, ..o }
    }

    /// The metrics in the OpenMetrics text format Prometheus scrapes.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// Records the catalog now served: token counts per resource and health.
    pub fn catalog(&self, catalog: &Catalog, resources: &[(Resource, String)]) {
        for (r, name) in resources {
            // Counted from the endpoints: building a shared list (64 IDs per
            // endpoint) just to count it would be a needless spike.
            let per = if *r == Resource::Shared {
                i64::from(SHARED_TOKENS)
            } else {
                1
            };
            let eps = catalog.endpoints(r.family());
            let healthy = eps.iter().filter(|e| e.healthy).count() as i64 * per;
            let unhealthy = eps.len() as i64 * per - healthy;
            self.tokens
                .get_or_create(&TokenLabels {
                    resource: name.clone(),
                    health: HEALTHY,
                })
                .set(healthy);
            self.tokens
                .get_or_create(&TokenLabels {
                    resource: name.clone(),
                    health: UNHEALTHY,
                })
                .set(unhealthy);
        }
    }

    /// Records one look at the folder: what was parsed, what was refused
    /// (new causes only) and which families are unreadable now.
    pub fn look(
        &self,
        reloaded: &[CdiFamily],
        new_errors: &[(CdiFamily, &'static str)],
        unreadable: Vec<(CdiFamily, String)>,
    ) {
        for f in reloaded {
            self.reloads
                .get_or_create(&FamilyLabel { family: f.kind() })
                .inc();
        }
        for (f, cause) in new_errors {
            self.read_errors
                .get_or_create(&ErrorLabels {
                    family: f.kind(),
                    cause,
                })
                .inc();
        }
        for f in CdiFamily::ALL {
            let bad = unreadable.iter().any(|(u, _)| *u == f);
            self.readable
                .get_or_create(&FamilyLabel { family: f.kind() })
                .set(i64::from(!bad));
        }
        self.lock().unreadable = unreadable.into_iter().map(|(_, why)| why).collect();
    }

    /// Marks the start (`true`) or the end of a look at the CDI folder.
    pub fn loading(&self, busy: bool) {
        self.lock().loading_since = busy.then(Instant::now);
    }

    /// Records whether the CDI or the kubelet folder is one deleted under
    /// this container's mount (`Some(why)`), which only a restart mends.
    pub fn stale_folder(&self, why: Option<String>) {
        self.lock().stale = why;
    }

    /// Records that kubelet accepted `resource`'s registration.
    pub fn registered(&self, resource: &str) {
        let label = ResourceLabel {
            resource: resource.into(),
        };
        self.registrations.get_or_create(&label).inc();
        self.registered_gauge.get_or_create(&label).set(1);
        self.lock().registered.insert(resource.into());
    }

    /// Records that every registration lapsed (sockets replaced, kubelet gone).
    pub fn unregistered(&self) {
        let mut state = self.lock();
        for name in std::mem::take(&mut state.registered) {
            self.registered_gauge
                .get_or_create(&ResourceLabel { resource: name })
                .set(0);
        }
    }

    /// `Ok` when the plugin is alive: this runs on the runtime (so it is not
    /// stalled), no look at the CDI folder has hung, and the folder is not
    /// one deleted under the mount.
    pub fn healthy(&self) -> Result<(), Unhealthy> {
        let state = self.lock();
        if let Some(why) = &state.stale {
            return Err(Unhealthy::Stale(why.clone()));
        }
        match state.loading_since {
            Some(t) if t.elapsed() > STALL_LIMIT => Err(Unhealthy::LookStalled(t.elapsed())),
            _ => Ok(()),
        }
    }

    /// `Ok` when every served resource is registered and every spec is
    /// readable; otherwise every reason it is not.
    pub fn ready(&self) -> Result<(), Vec<String>> {
        let state = self.lock();
        let mut why: Vec<String> = state
            .served
            .difference(&state.registered)
            .map(|r| format!("{r} is not registered with kubelet"))
            .collect();
        why.extend(state.unreadable.iter().cloned());
        if why.is_empty() {
            Ok(())
        } else {
            Err(why)
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding this lock leaves plain data behind: keep going.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Probes for Observed {
    type Unhealthy = Unhealthy;
    fn healthy(&self) -> Result<(), Unhealthy> {
        Observed::healthy(self)
    }

    fn ready(&self) -> Result<(), Vec<String>> {
        Observed::ready(self)
    }

    fn metrics(&self) -> String {
        self.encode()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_needs_every_resource_registered_and_every_spec_readable() {
        let names = vec!["p/rdma".to_string(), "p/rdma.shared".to_string()];
        let o = Observed::new(&names);
        assert_eq!(o.ready().unwrap_err().len(), 2);
        o.registered("p/rdma");
        o.registered("p/rdma.shared");
        assert!(o.ready().is_ok());
        o.look(
            &[],
            &[(CdiFamily::Whole, "too_large")],
            vec![(CdiFamily::Whole, "/cdi/x.json: too large".into())],
        );
        assert_eq!(o.ready().unwrap_err(), ["/cdi/x.json: too large"]);
        o.look(&[CdiFamily::Whole], &[], vec![]);
        assert!(o.ready().is_ok());
        o.unregistered();
        assert_eq!(o.ready().unwrap_err().len(), 2);
        let text = o.encode();
        assert!(text.contains("nodefabric_plugin_spec_read_errors_total{family=\"gpustack.ai/rdma\",cause=\"too_large\"} 1"), "{text}");
        assert!(
            text.contains("nodefabric_plugin_spec_reloads_total{family=\"gpustack.ai/rdma\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("nodefabric_plugin_registrations_total{resource=\"p/rdma\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("nodefabric_plugin_registered{resource=\"p/rdma\"} 0"),
            "{text}"
        );
    }

    #[test]
    fn a_look_that_has_not_returned_fails_liveness() {
        let o = Observed::new(&[]);
        assert!(o.healthy().is_ok());
        o.loading(true);
        assert!(o.healthy().is_ok(), "a look just begun is not a stall");
        o.lock().loading_since = Some(Instant::now() - STALL_LIMIT - Duration::from_secs(1));
        assert!(o
            .healthy()
            .unwrap_err()
            .to_string()
            .contains("has not returned"));
        o.loading(false);
        assert!(o.healthy().is_ok());
    }
}
