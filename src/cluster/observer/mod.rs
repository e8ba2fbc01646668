//! The Node Observer: owns the shared ConfigMap ([`claim`]) and removes
//! records of deleted or replaced Nodes ([`stale_keys`]; or, with
//! `--rails-record custom-resource`, deletes the NodeRailRecords of such
//! Nodes: [`stale_records`]).
//!
//! It watches Node metadata (kube-runtime's watcher: a list, then a watch
//! from its resourceVersion, re-listing when the watch falls too far
//! behind). After every complete list it reconciles every key, which cleans
//! deletions missed while it was down; each Node deletion or UID change seen
//! on the watch reconciles that one key; a periodic full pass catches
//! records a broker wrote for a Node already gone.
//!
//! With the ConfigMap form it also watches the one ConfigMap it owns (a
//! metadata watch narrowed to its name): deleted (`kubectl delete`, a
//! clean-up script), it is created again at once, empty, with the same
//! labels and controller, and every broker writes its key back at its next
//! interval; the resync and the retry of a failed pass create it too.

pub mod claim;
pub mod stale_keys;
pub mod stale_records;

use super::client::retry::Backoff;
use super::error::Chain;
use super::{ClusterError, ConfigMapRef};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::{self, Event};
use kube::runtime::{watcher as watch, WatchStreamExt};
use kube::{Api, Client};
use stale_keys::Nodes;
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};

/// Which form of the record the observer keeps clean.
#[derive(Debug, Clone)]
pub enum Records {
    /// Keys of the shared ConfigMap, which the observer creates and owns.
    ConfigMap {
        /// The shared ConfigMap.
        configmap: ConfigMapRef,
        /// The observer's own Deployment, in the ConfigMap's namespace.
        owner_deployment: String,
    },
    /// NodeRailRecord objects, one per node.
    CustomResource,
}

/// The ConfigMap form, resolved: the ConfigMap with its namespace, and the
/// Deployment that controls it.
struct Claimed {
    cm: ConfigMapRef,
    owner: claim::Owner,
}

/// What `nodefabric observe` was asked to do.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The records to keep clean.
    pub records: Records,
    /// How often to reconcile every key besides the watch-driven passes.
    pub resync: Duration,
    /// Readiness: set once the first reconciliation has succeeded.
    pub health: super::health::Health,
}

/// Runs with `client` until SIGTERM or SIGINT (then `Ok`), or until the
/// ConfigMap cannot be claimed, at the start or at any later reconcile (an
/// error, with nothing changed).
pub async fn run(client: Client, settings: Settings) -> Result<(), ClusterError> {
    let mut term = signal(SignalKind::terminate()).map_err(ClusterError::Runtime)?;
    let mut int = signal(SignalKind::interrupt()).map_err(ClusterError::Runtime)?;
    tokio::select! {
        r = observe(&client, &settings) => r,
        _ = term.recv() => Ok(()),
        _ = int.recv() => Ok(()),
    }
}

async fn observe(client: &Client, settings: &Settings) -> Result<(), ClusterError> {
    let claimed = match &settings.records {
        Records::ConfigMap {
            configmap,
            owner_deployment,
        } => {
            let cm = configmap.resolved(client);
            let ns = cm.namespace.clone().unwrap_or_default();
            let owner = claim::deployment(client, &ns, owner_deployment).await?;
            claim::ensure(client, &cm, &owner).await?;
            Some(Claimed { cm, owner })
        }
        Records::CustomResource => None,
    };
    let claimed = claimed.as_ref();
    settings.health.set_live(true);

    let mut events = watch(
        Api::<PartialObjectMeta<Node>>::all(client.clone()),
        watcher::Config::default(),
    )
    // The re-list/re-watch waits of the one API policy, endless: the
    // observer has nothing else to do.
    .backoff(Backoff::API.endless())
    .boxed();
    let mut own = own_watch(client, claimed);
    // Whether the ConfigMap was in the current (re)list of its watch.
    let mut listed = false;
    let mut nodes = Nodes::new();
    let mut listing = Nodes::new();
    let mut synced = false;
    let mut state = Readiness::default();
    let mut resync = tokio::time::interval(settings.resync);
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    resync.tick().await; // the first tick is immediate; the initial list does that pass

    loop {
        let retry_at = state.retry.map(|(at, _)| at);
        let quiet_at = state.watch_failing;
        let event = tokio::select! {
            e = events.next() => e,
            Some(e) = own.next() => {
                let gone = match e {
                    Ok(Event::Init) => {
                        listed = false;
                        false
                    }
                    Ok(Event::InitApply(_)) => {
                        listed = true;
                        false
                    }
                    Ok(Event::InitDone) => !listed,
                    Ok(Event::Apply(_)) => false,
                    Ok(Event::Delete(_)) => true,
                    // The watcher backs off and retries by itself; the resync
                    // still re-creates a ConfigMap deleted meanwhile.
                    Err(e) => {
                        if let Some(c) = claimed {
                            tracing::warn!("watching ConfigMap {}: {}", c.cm, Chain(&e));
                        }
                        false
                    }
                };
                if let (true, Some(c)) = (gone, claimed) {
                    tracing::warn!("ConfigMap {} was deleted; creating it again", c.cm);
                    let ok = recreate(client, c).await?;
                    // A failure is retried (a full pass, which creates it)
                    // with backoff, unready meanwhile; a success changes no
                    // record, so readiness stays as the last pass left it.
                    state.passed(ok, false, &settings.health);
                }
                continue;
            }
            _ = resync.tick(), if synced => {
                let ok = pass(client, claimed, &nodes, None).await?;
                state.passed(ok, true, &settings.health);
                continue;
            }
            // A failed reconcile is tried again (all of it) after a jittered
            // backoff, not left until the resync.
            _ = tokio::time::sleep_until(retry_at.unwrap_or_else(tokio::time::Instant::now)), if synced && retry_at.is_some() => {
                let ok = pass(client, claimed, &nodes, None).await?;
                state.passed(ok, true, &settings.health);
                continue;
            }
            // No watch error for a while: the watch is taken as working again.
            _ = tokio::time::sleep_until(quiet_at.unwrap_or_else(tokio::time::Instant::now)), if quiet_at.is_some() => {
                state.watch_works(&settings.health);
                continue;
            }
        };
        let event = match event {
            Some(Ok(e)) => e,
            // The watcher backs off and retries by itself; say why meanwhile,
            // and that the records may be behind.
            Some(Err(e)) => {
                tracing::warn!("watching Nodes: {}", Chain(&e));
                state.watch_failed(&settings.health);
                continue;
            }
            None => {
                return Err(ClusterError::Malformed {
                    what: "WATCH Nodes".into(),
                    message: "the watch stream ended".into(),
                })
            }
        };
        state.watch_works(&settings.health);
        match event {
            Event::Init => listing.clear(),
            Event::InitApply(n) => {
                if let Some((name, uid)) = name_uid(&n.metadata) {
                    listing.insert(name, uid);
                }
            }
            Event::InitDone => {
                nodes = std::mem::take(&mut listing);
                synced = true;
                tracing::info!(
                    "Node cache synced ({} Nodes); reconciling every record",
                    nodes.len()
                );
                let ok = pass(client, claimed, &nodes, None).await?;
                state.passed(ok, true, &settings.health);
            }
            Event::Apply(n) => {
                let Some((name, uid)) = name_uid(&n.metadata) else {
                    continue;
                };
                let before = nodes.insert(name.clone(), uid.clone());
                if synced && before.is_some_and(|b| b != uid) {
                    let ok = pass(client, claimed, &nodes, Some(&name)).await?;
                    state.passed(ok, false, &settings.health);
                }
            }
            Event::Delete(n) => {
                let Some((name, _)) = name_uid(&n.metadata) else {
                    continue;
                };
                nodes.remove(&name);
                if synced {
                    let ok = pass(client, claimed, &nodes, Some(&name)).await?;
                    state.passed(ok, false, &settings.health);
                }
            }
        }
    }
}

/// The watch of the observer's own ConfigMap (metadata only, narrowed to
/// its name, so RBAC can grant it by resourceNames); a stream that never
/// yields without one.
fn own_watch(
    client: &Client,
    claimed: Option<&Claimed>,
) -> futures::stream::BoxStream<'static, Result<Event<PartialObjectMeta<ConfigMap>>, watcher::Error>>
{
    let Some(Claimed { cm, .. }) = claimed else {
        return futures::stream::pending().boxed();
    };
    let api = Api::<PartialObjectMeta<ConfigMap>>::namespaced(
        client.clone(),
        cm.namespace.as_deref().unwrap_or_default(),
    );
    watch(
        api,
        watcher::Config::default().fields(&format!("metadata.name={}", cm.name)),
    )
    .backoff(Backoff::API.endless())
    .boxed()
}

/// Creates the ConfigMap again after its deletion was seen; whether that
/// succeeded (failures are logged). One made meanwhile by someone else is
/// the one error returned, as in [`pass`].
async fn recreate(client: &Client, c: &Claimed) -> Result<bool, ClusterError> {
    match claim::ensure(client, &c.cm, &c.owner).await {
        Ok(()) => Ok(true),
        Err(e @ ClusterError::NotOwned { .. }) => {
            tracing::error!("re-creating ConfigMap {}: {}; stopping", c.cm, Chain(&e));
            Err(e)
        }
        Err(e) => {
            tracing::error!("re-creating ConfigMap {}: {}", c.cm, Chain(&e));
            Ok(false)
        }
    }
}

/// How long a watch that failed must go without another error to count as
/// working again: longer than the longest wait between its retries, so a
/// watch that keeps failing never looks well in between.
const WATCH_QUIET: Duration = Duration::from_secs(2 * Backoff::API.cap.as_secs());

/// What readiness is made of: the last reconcile, the watch, and the retry
/// of a failed reconcile.
#[derive(Debug, Default)]
struct Readiness {
    /// Whether the last full reconcile succeeded and no later one failed.
    reconciled: bool,
    /// Set while the watch is failing: when it counts as working again if
    /// no other error comes.
    watch_failing: Option<tokio::time::Instant>,
    /// When to reconcile again after a failure, and how many failed in a row.
    retry: Option<(tokio::time::Instant, u32)>,
}

impl Readiness {
    /// Takes in a reconcile's outcome (`full`: of every record).
    fn passed(&mut self, ok: bool, full: bool, health: &super::health::Health) {
        match (ok, full) {
            (true, true) => {
                self.reconciled = true;
                self.retry = None;
            }
            (true, false) => {}
            (false, _) => {
                self.reconciled = false;
                let n = self.retry.map_or(0, |(_, n)| n.saturating_add(1));
                let wait = Backoff::API.delay(n);
                tracing::info!("reconciling again in {wait:?}");
                self.retry = Some((tokio::time::Instant::now() + wait, n));
            }
        }
        self.show(health);
    }

    fn watch_failed(&mut self, health: &super::health::Health) {
        self.watch_failing = Some(tokio::time::Instant::now() + WATCH_QUIET);
        self.show(health);
    }

    fn watch_works(&mut self, health: &super::health::Health) {
        if self.watch_failing.take().is_some() {
            tracing::info!("watching Nodes works again");
            self.show(health);
        }
    }

    fn show(&self, health: &super::health::Health) {
        health.set_ready(self.reconciled && self.watch_failing.is_none());
    }
}

/// One reconciliation of every record, or of the one for Node `key`;
/// whether it succeeded. Failures are logged. A ConfigMap deleted under the
/// observer is created again. A ConfigMap it no longer controls is the one
/// error returned: the observer stops, as a restart would refuse it.
async fn pass(
    client: &Client,
    claimed: Option<&Claimed>,
    nodes: &Nodes,
    key: Option<&str>,
) -> Result<bool, ClusterError> {
    let result = match claimed {
        Some(Claimed { cm, owner }) => {
            let mut result = stale_keys::clean(client, cm, owner, nodes, key).await;
            if let Err(ClusterError::NoConfigMap(_)) = result {
                tracing::warn!("ConfigMap {cm} is gone; creating it again");
                result = match claim::ensure(client, cm, owner).await {
                    Ok(()) => Ok(Default::default()),
                    Err(e) => Err(e),
                };
            }
            result
        }
        None => stale_records::clean(client, nodes, key).await,
    };
    let what = match claimed {
        Some(c) => format!("ConfigMap {}", c.cm),
        None => "NodeRailRecords".to_string(),
    };
    match result {
        Ok(out) => {
            tracing::debug!(
                "reconciled {}: removed {:?}, changed meanwhile {:?}",
                key.unwrap_or("every key"),
                out.removed,
                out.changed
            );
            Ok(true)
        }
        Err(e @ ClusterError::NotOwned { .. }) => {
            tracing::error!("reconciling {what}: {}; stopping", Chain(&e));
            Err(e)
        }
        Err(e) => {
            tracing::error!("reconciling {what}: {}", Chain(&e));
            Ok(false)
        }
    }
}

fn name_uid(
    m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Option<(String, String)> {
    Some((m.name.clone()?, m.uid.clone()?))
}
