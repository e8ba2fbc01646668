//! What the DRA driver tells an operator: Prometheus metrics and the state
//! behind `/healthz` and `/readyz` (served by [`crate::kubelet::probes`]).
//!
//! Metric names, all prefixed `nodefabric_dra_`:
//!
//! | name | type | meaning |
//! |---|---|---|
//! | `devices` | gauge | devices in the pool now |
//! | `registered` | gauge (0/1) | kubelet accepted the registration |
//! | `slice_writes_total` | counter | ResourceSlice creates and deletes |
//! | `pool_generation` | gauge | the pool generation on the server |
//! | `reconcile_errors_total` | counter | reconciles that failed |
//! | `prepared_claims` | gauge | claims prepared (checkpointed) now |
//! | `prepare_total` | counter, `outcome` | claims prepared (ok/error) |
//! | `unprepare_total` | counter, `outcome` | claims unprepared (ok/error) |
//! | `prepare_duration_seconds` | histogram | one claim's Prepare |
//! | `prepared_failed_link_total` | counter | devices prepared whose link had failed since allocation |
//! | `nccl_inexact_total` | counter | claims prepared whose `NCCL_IB_HCA` names only their own NICs, the NICs their container holds beside them not being known (pod unreadable, containers disagreeing) |
//! | `server_dropped_fields` | gauge (0/1), `gate` | the API server dropped fields of the last slice write (the gate named is off: `DRADeviceTaints` or `DRAConsumableCapacity`) |
//! | `swept_claims_total` | counter | stale claims unprepared by the sweep (their pods gone without an Unprepare) |
//! | `socket_check_failures_total` | counter | self-checks in which the registration or DRA socket did not answer |

use super::selfcheck::SelfCheckError;
use crate::cluster::ClusterError;
use crate::kubelet::probes::Probes;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The outcome label of the Prepare and Unprepare counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

fn outcome(ok: bool) -> OutcomeLabel {
    OutcomeLabel {
        outcome: if ok { "ok" } else { "error" },
    }
}

/// The feature-gate label of the dropped-fields gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GateLabel {
    gate: &'static str,
}

/// Why the driver is not ready, one entry per cause.
#[derive(Debug, Default)]
struct Readiness {
    registered: bool,
    /// The last reconcile's error; `None` once slices are in place.
    slices: Option<ClusterError>,
    /// Whether any reconcile has succeeded yet.
    published: bool,
    /// The unreadable CDI specs, with why.
    specs: Vec<String>,
    /// A folder deleted on the host under the driver's mount, with why.
    stale: Option<String>,
    /// The driver's own socket that did not answer its last self-check.
    silent_socket: Option<Arc<SelfCheckError>>,
}

/// Why `/healthz` fails: what only a restart of the driver mends. Text only
/// in the probe's answer, one cause a line.
#[derive(Debug, Clone)]
pub struct Unhealthy {
    /// A folder deleted on the host under the driver's mount, with why.
    stale: Option<String>,
    /// The driver's own socket that did not answer its last self-check.
    silent_socket: Option<Arc<SelfCheckError>>,
}

impl std::fmt::Display for Unhealthy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.stale, &self.silent_socket) {
            (Some(stale), Some(silent)) => write!(f, "{stale}\n{silent}"),
            (Some(stale), None) => write!(f, "{stale}"),
            (None, Some(silent)) => write!(f, "{silent}"),
            (None, None) => Ok(()),
        }
    }
}

impl std::error::Error for Unhealthy {}

/// Every metric and the readiness facts, shared by the loop, the services
/// and the HTTP server.
pub struct Observed {
    registry: Registry,
    devices: Gauge,
    registered: Gauge,
    slice_writes: Counter,
    generation: Gauge,
    reconcile_errors: Counter,
    prepared_claims: Gauge,
    prepare: Family<OutcomeLabel, Counter>,
    unprepare: Family<OutcomeLabel, Counter>,
    prepare_seconds: Histogram,
    failed_link: Counter,
    nccl_inexact: Counter,
    dropped: Family<GateLabel, Gauge>,
    swept: Counter,
    socket_check_failures: Counter,
    readiness: Mutex<Readiness>,
}

impl Default for Observed {
    fn default() -> Observed {
        Observed::new()
    }
}

impl Observed {
    /// Every metric at zero, not ready.
    pub fn new() -> Observed {
        let mut registry = Registry::with_prefix("nodefabric_dra");
        let o = Observed {
            devices: Gauge::default(),
            registered: Gauge::default(),
            slice_writes: Counter::default(),
            generation: Gauge::default(),
            reconcile_errors: Counter::default(),
            prepared_claims: Gauge::default(),
            prepare: Family::default(),
            unprepare: Family::default(),
            // 50 µs to about 0.8 s: a checkpointed claim, or one API read.
            prepare_seconds: Histogram::new(exponential_buckets(50e-6, 2.0, 15)),
            failed_link: Counter::default(),
            nccl_inexact: Counter::default(),
            dropped: Family::default(),
            swept: Counter::default(),
            socket_check_failures: Counter::default(),
            readiness: Mutex::new(Readiness::default()),
            registry: Registry::default(),
        };
        registry.register("devices", "Devices in the pool", o.devices.clone());
        registry.register(
            "registered",
            "Whether kubelet accepted the registration",
            o.registered.clone(),
        );
        registry.register(
            "slice_writes",
            "ResourceSlice creates and deletes",
            o.slice_writes.clone(),
        );
        registry.register(
            "pool_generation",
            "The pool generation on the API server",
            o.generation.clone(),
        );
        registry.register(
            "reconcile_errors",
            "ResourceSlice reconciles that failed",
            o.reconcile_errors.clone(),
        );
        registry.register(
            "prepared_claims",
            "Claims prepared on this node now",
            o.prepared_claims.clone(),
        );
        registry.register("prepare", "Claims prepared", o.prepare.clone());
        registry.register("unprepare", "Claims unprepared", o.unprepare.clone());
        registry.register(
            "prepare_duration_seconds",
            "One claim's Prepare",
            o.prepare_seconds.clone(),
        );
        registry.register(
            "prepared_failed_link",
            "Devices prepared whose link had failed since allocation",
            o.failed_link.clone(),
        );
        registry.register(
            "nccl_inexact",
            "Claims prepared whose NCCL_IB_HCA names only their own NICs (their container's other NICs not known)",
            o.nccl_inexact.clone(),
        );
        registry.register(
            "server_dropped_fields",
            "The API server dropped fields of the last slice write (a feature gate off)",
            o.dropped.clone(),
        );
        registry.register(
            "swept_claims",
            "Stale claims unprepared by the sweep",
            o.swept.clone(),
        );
        registry.register(
            "socket_check_failures",
            "Self-checks in which the registration or DRA socket did not answer",
            o.socket_check_failures.clone(),
        );
        Observed { registry, ..o }
    }

    /// The readiness facts. A panic while they were held (none is known)
    /// poisons the lock; the facts are plain values, each write complete,
    /// so they are taken as they are rather than failing every probe, as
    /// the device plugin's metrics do.
    fn readiness(&self) -> std::sync::MutexGuard<'_, Readiness> {
        self.readiness
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The pool now has this many devices.
    pub fn pool(&self, devices: usize) {
        self.devices.set(devices as i64);
    }

    /// kubelet's verdict on the registration.
    pub fn registered(&self, yes: bool) {
        self.registered.set(i64::from(yes));
        self.readiness().registered = yes;
    }

    /// A reconcile succeeded with this many writes at this generation.
    pub fn reconciled(&self, writes: usize, generation: i64) {
        self.slice_writes.inc_by(writes as u64);
        self.generation.set(generation);
        let mut r = self.readiness();
        r.slices = None;
        r.published = true;
    }

    /// A reconcile failed.
    pub fn reconcile_failed(&self, why: ClusterError) {
        self.reconcile_errors.inc();
        self.readiness().slices = Some(why);
    }

    /// The CDI specs that cannot be read now, with why.
    pub fn specs(&self, unreadable: Vec<String>) {
        self.readiness().specs = unreadable;
    }

    /// A folder the driver serves from was deleted on the host under its
    /// mount (`Some(why)`), or is in place again (`None`).
    pub fn stale_folder(&self, why: Option<String>) {
        self.readiness().stale = why;
    }

    /// The number of claims prepared now.
    pub fn prepared_claims(&self, n: usize) {
        self.prepared_claims.set(n as i64);
    }

    /// One claim's Prepare ended.
    pub fn prepared(&self, ok: bool, took: Duration) {
        self.prepare.get_or_create(&outcome(ok)).inc();
        self.prepare_seconds.observe(took.as_secs_f64());
    }

    /// A device was prepared whose link failed after it was allocated.
    pub fn prepared_failed_link(&self) {
        self.failed_link.inc();
    }

    /// A claim was prepared with only its own NICs in `NCCL_IB_HCA`.
    pub fn nccl_inexact(&self) {
        self.nccl_inexact.inc();
    }

    /// The server dropped fields of the last slice write, those of the
    /// feature gates `gates` (none: it kept everything). Each gate the
    /// driver tells apart has its series, 0 while its fields are kept.
    pub fn dropped_fields(&self, gates: &[&'static str]) {
        for gate in [super::taints::GATE, super::shares::GATE] {
            self.dropped
                .get_or_create(&GateLabel { gate })
                .set(i64::from(gates.contains(&gate)));
        }
    }

    /// The sweep unprepared a stale claim.
    pub fn swept(&self) {
        self.swept.inc();
    }

    /// The last self-check's verdict on the driver's own sockets: `Some`
    /// names the one that did not answer, and fails liveness.
    pub fn sockets_answer(&self, silent: Option<SelfCheckError>) {
        if silent.is_some() {
            self.socket_check_failures.inc();
        }
        self.readiness().silent_socket = silent.map(Arc::new);
    }

    /// One claim's Unprepare ended.
    pub fn unprepared(&self, ok: bool) {
        self.unprepare.get_or_create(&outcome(ok)).inc();
    }
}

impl Probes for Observed {
    type Unhealthy = Unhealthy;

    fn healthy(&self) -> Result<(), Unhealthy> {
        let r = self.readiness();
        if r.stale.is_none() && r.silent_socket.is_none() {
            return Ok(());
        }
        Err(Unhealthy {
            stale: r.stale.clone(),
            silent_socket: r.silent_socket.clone(),
        })
    }

    fn ready(&self) -> Result<(), Vec<String>> {
        let r = self.readiness();
        let mut why = Vec::new();
        if !r.registered {
            why.push("not registered with kubelet".to_string());
        }
        match (&r.slices, r.published) {
            (Some(e), _) => why.push(format!("ResourceSlices not published: {e}")),
            (None, false) => why.push("ResourceSlices not published yet".to_string()),
            (None, true) => {}
        }
        why.extend(r.specs.iter().cloned());
        if why.is_empty() {
            Ok(())
        } else {
            Err(why)
        }
    }

    fn metrics(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_readiness_lock_still_answers_the_probes() {
        let observed = std::sync::Arc::new(Observed::new());
        observed.registered(true);
        let held = observed.clone();
        let _ = std::thread::spawn(move || {
            let _guard = held.readiness.lock().unwrap();
            panic!("a panic while the readiness facts are held");
        })
        .join();
        assert!(observed.readiness.is_poisoned());
        observed.stale_folder(Some("the CDI folder was deleted".into()));
        assert_eq!(
            observed.healthy().unwrap_err().to_string(),
            "the CDI folder was deleted"
        );
        let why = observed.ready().unwrap_err();
        assert!(
            why.iter().any(|w| w.contains("not published yet")),
            "{why:?}"
        );
    }
}
