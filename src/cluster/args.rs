//! The command-line face of the cluster half: the broker's flags (on `rails`
//! and `publish`) and `nodefabric observe`, with the glue from the
//! synchronous command line into the async client.

use super::broker::{self, Publication};
use super::health::Health;
use super::record::GROUP;
use super::{block_on, node, observer, ClusterError, ConfigMapRef, SERVICE_ACCOUNT_DIR};
use crate::rails::RailRecord;
use clap::Args;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The broker's flags: who this node is, and the shared ConfigMap.
#[derive(Debug, Args, Clone)]
pub struct BrokerArgs {
    /// The Node object's UID, recorded so the observer can tell a replaced
    /// node that reuses a name. With --node-name and a cluster to ask
    /// (KUBECONFIG, or in a pod) it is read from the Node instead.
    #[arg(
        long,
        value_name = "UID",
        env = "NODEFABRIC_NODE_UID",
        default_value = ""
    )]
    pub node_uid: String,

    /// This node's name: its key in the shared ConfigMap, and the Node whose
    /// UID the record carries (set NODE_NAME from the downward API's spec.nodeName).
    #[arg(long, value_name = "NAME", env = "NODE_NAME")]
    pub node_name: Option<String>,

    /// Also publish the record under key --node-name of this ConfigMap
    /// (NAME in the pod's namespace, or NAMESPACE/NAME), patching only that
    /// key; an empty rail result removes it. The Node Observer creates the
    /// ConfigMap. Default: configMapName from --rails-config, when a cluster
    /// is configured (KUBECONFIG, or in a pod).
    #[arg(long, value_name = "NAMESPACE/NAME", value_parser = parse_configmap)]
    pub rails_configmap: Option<ConfigMapRef>,

    /// The service-account folder (token, ca.crt, namespace) for the
    /// in-cluster client; KUBECONFIG, when set, is used instead.
    #[arg(long, value_name = "DIR", default_value = SERVICE_ACCOUNT_DIR)]
    pub service_account_dir: PathBuf,

    /// How long to wait for each answer of the API server before the pass
    /// fails (nothing is changed then).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    pub api_timeout: Duration,

    /// The form of the cluster-wide record: `configmap`, this node's key of
    /// the shared ConfigMap (the default; its 1 MiB holds about 370 records
    /// of 8 GPUs and 4 rails, fewer with more rails or GPU UUIDs), or `custom-resource`, a cluster-scoped NodeRailRecord named
    /// after --node-name and owned by its Node (any number of nodes; install
    /// the CRD first: `nodefabric crd | kubectl apply -f -`).
    #[arg(long, value_name = "FORM", value_enum, env = "NODEFABRIC_RAILS_RECORD")]
    pub rails_record: Option<RecordForm>,

    /// What this process last read and published, shared by its passes.
    #[arg(skip)]
    pub memo: Memo,
}

/// How long an interval publisher trusts what it last read and sent: within
/// it, an unchanged record is not sent again and the Node's UID is not read
/// again; after it, both are, which also re-creates a record deleted by hand.
/// At 10,000 nodes and a 60s interval this turns about 330 API requests a
/// second (a Node GET and a write per node and pass) into about 33.
pub const REFRESH: Duration = Duration::from_secs(600);

/// The interval publisher's memory between passes (a one-shot run has one pass).
#[derive(Debug, Clone, Default)]
pub struct Memo(std::sync::Arc<std::sync::Mutex<MemoState>>);

#[derive(Debug, Default)]
struct MemoState {
    /// (node name, its UID, when read).
    uid: Option<(String, String, std::time::Instant)>,
    /// (where, the record's bytes, when sent): the last successful publication.
    sent: Option<(String, String, std::time::Instant)>,
}

impl Memo {
    fn state(&self) -> std::sync::MutexGuard<'_, MemoState> {
        // A panic elsewhere cannot leave this half-written: every update is one assignment.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The UID read for `node` less than [`REFRESH`] ago.
    fn uid(&self, node: &str) -> Option<String> {
        let s = self.state();
        let (n, uid, at) = s.uid.as_ref()?;
        (n == node && at.elapsed() < REFRESH).then(|| uid.clone())
    }

    fn set_uid(&self, node: &str, uid: &str) {
        self.state().uid = Some((node.to_string(), uid.to_string(), std::time::Instant::now()));
    }

    /// Whether exactly `bytes` went to `target` less than [`REFRESH`] ago.
    fn already_sent(&self, target: &str, bytes: &str) -> bool {
        let s = self.state();
        s.sent
            .as_ref()
            .is_some_and(|(t, b, at)| t == target && b == bytes && at.elapsed() < REFRESH)
    }

    /// Records a successful publication, or forgets it (`None`) after a failure.
    fn set_sent(&self, sent: Option<(&str, &str)>) {
        self.state().sent =
            sent.map(|(t, b)| (t.to_string(), b.to_string(), std::time::Instant::now()));
    }
}

/// The two forms of the cluster-wide rail record (`--rails-record`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum RecordForm {
    /// One key per node in the shared ConfigMap (seed 001's form).
    #[default]
    Configmap,
    /// One NodeRailRecord object per node.
    CustomResource,
}

/// Where a broker publishes its record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Its key of this ConfigMap.
    ConfigMap(ConfigMapRef),
    /// Its own NodeRailRecord, named after the node (the name given).
    CustomResource(String),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::ConfigMap(cm) => write!(f, "key of ConfigMap {cm}"),
            Target::CustomResource(node) => write!(f, "NodeRailRecord {node}"),
        }
    }
}

impl Default for BrokerArgs {
    /// The flags' own defaults: no cluster publication.
    fn default() -> BrokerArgs {
        BrokerArgs {
            node_uid: String::new(),
            node_name: None,
            rails_configmap: None,
            service_account_dir: PathBuf::from(SERVICE_ACCOUNT_DIR),
            api_timeout: Duration::from_secs(30),
            rails_record: None,
            memo: Memo::default(),
        }
    }
}

/// Parses `--rails-configmap` for clap.
pub fn parse_configmap(s: &str) -> Result<ConfigMapRef, String> {
    ConfigMapRef::parse(s).map_err(|e| e.to_string())
}

impl BrokerArgs {
    /// The record's `nodeUID`: --node-uid when given; else read from Node
    /// --node-name when a cluster is configured; else empty (node-local use).
    pub fn node_uid(&self) -> anyhow::Result<String> {
        if !self.node_uid.is_empty() {
            return Ok(self.node_uid.clone());
        }
        match &self.node_name {
            Some(name) if super::configured() => {
                if let Some(uid) = self.memo.uid(name) {
                    return Ok(uid);
                }
                let uid = block_on(async {
                    let client =
                        super::connect(&self.service_account_dir, Some(self.api_timeout)).await?;
                    node::uid(&client, name).await
                })
                .map_err(|e| anyhow::Error::new(e).context(format!("reading Node {name}'s UID")))?;
                self.memo.set_uid(name, &uid);
                Ok(uid)
            }
            _ => Ok(String::new()),
        }
    }

    /// Where to publish: with `--rails-record custom-resource`, this node's
    /// NodeRailRecord (a cluster must be configured); else --rails-configmap,
    /// or `config_name` (the config file's configMapName) in the client's
    /// namespace when a cluster is configured, so the same values file still
    /// serves a node-local `rails` run on a machine with no cluster.
    pub fn target(&self, config_name: Option<&str>) -> anyhow::Result<Option<Target>> {
        let target = match self.rails_record.unwrap_or_default() {
            RecordForm::CustomResource => {
                if let Some(cm) = &self.rails_configmap {
                    anyhow::bail!("--rails-configmap {cm} is for --rails-record configmap; with custom-resource each node writes its own NodeRailRecord");
                }
                if !super::configured() {
                    anyhow::bail!("--rails-record custom-resource needs a cluster to write to: set KUBECONFIG, or run in a pod");
                }
                let Some(node) = &self.node_name else {
                    anyhow::bail!("--rails-record custom-resource needs --node-name (or NODE_NAME): the record is named after its node");
                };
                Some(Target::CustomResource(node.clone()))
            }
            RecordForm::Configmap => match (&self.rails_configmap, config_name) {
                (Some(cm), _) => Some(Target::ConfigMap(cm.clone())),
                (None, Some(name)) if super::configured() => Some(Target::ConfigMap(
                    ConfigMapRef::parse(name).map_err(|e| anyhow::anyhow!("configMapName: {e}"))?,
                )),
                (None, _) => None,
            },
        };
        if let (Some(t), None) = (&target, &self.node_name) {
            anyhow::bail!(
                "publishing to a {t} needs --node-name (or NODE_NAME): it is the record's key"
            );
        }
        Ok(target)
    }

    /// Publishes `record` to `target`: patches this node's ConfigMap key, or
    /// applies this node's NodeRailRecord; an empty record (no rail) removes
    /// the key or deletes the object. Any error leaves the previous record.
    pub fn publish(&self, target: &Target, record: &RailRecord) -> anyhow::Result<()> {
        let node = self
            .node_name
            .as_deref()
            .ok_or_else(|| anyhow::anyhow!("publishing to a {target} needs --node-name"))?;
        // Compact JSON, every object's keys sorted (serde_json's Value map is
        // ordered): what the ConfigMap stores, and what tells a change.
        let value = serde_json::to_value(record).expect("the record serialises");
        let text = serde_json::to_string(&value).expect("a JSON value serialises");
        let place = target.to_string();
        if self.memo.already_sent(&place, &text) {
            tracing::debug!(
                "the rail record is unchanged since it was published to {target}: not sent again"
            );
            return Ok(());
        }
        let result = self.send(target, node, record, &text);
        self.memo
            .set_sent(result.is_ok().then_some((place.as_str(), text.as_str())));
        result
    }

    /// Sends one publication (see [`BrokerArgs::publish`]).
    fn send(
        &self,
        target: &Target,
        node: &str,
        record: &RailRecord,
        text: &str,
    ) -> anyhow::Result<()> {
        let empty = record.nics.is_empty();
        match target {
            Target::ConfigMap(cm) => self.publish_configmap(cm, node, text, empty)?,
            Target::CustomResource(_) => {
                if record.node_uid.is_empty() {
                    anyhow::bail!("NodeRailRecord {node} needs its Node's UID for the ownerReference (--node-uid, or a readable Node {node})");
                }
                block_on(async {
                    let client =
                        super::connect(&self.service_account_dir, Some(self.api_timeout)).await?;
                    if empty {
                        broker::delete_record(&client, node).await
                    } else {
                        broker::apply_record(&client, node, record).await
                    }
                })?;
                if empty {
                    tracing::info!("no rail on this node: NodeRailRecord {node} deleted ({GROUP})");
                } else {
                    tracing::info!("applied NodeRailRecord {node} ({GROUP})");
                }
            }
        }
        Ok(())
    }

    /// Patches this node's key of `cm` with `text` (removes it when the
    /// record has no rail). Any error leaves the ConfigMap as it was.
    fn publish_configmap(
        &self,
        cm: &ConfigMapRef,
        node: &str,
        text: &str,
        empty: bool,
    ) -> anyhow::Result<()> {
        // The compact form is about half the bytes of the pretty one `rails`
        // prints, so twice the nodes fit the 1 MiB ConfigMap.
        let what = if empty {
            Publication::Remove
        } else {
            Publication::Record(text)
        };
        block_on(async {
            let client = super::connect(&self.service_account_dir, Some(self.api_timeout)).await?;
            broker::publish(&client, cm, node, what).await
        })?;
        match what {
            Publication::Remove => {
                tracing::info!("no rail on this node: key {node} of ConfigMap {cm} removed")
            }
            Publication::Record(_) => {
                tracing::info!("published the rail record under key {node} of ConfigMap {cm}")
            }
        }
        Ok(())
    }
}

/// Options of `observe`.
#[derive(Debug, Clone, Args)]
pub struct ObserveArgs {
    /// The shared ConfigMap (NAME in the pod's namespace, or
    /// NAMESPACE/NAME); required with --rails-record configmap.
    #[arg(long, value_name = "NAMESPACE/NAME", value_parser = parse_configmap)]
    pub rails_configmap: Option<ConfigMapRef>,

    /// The observer's own Deployment (in the ConfigMap's namespace): the
    /// ConfigMap's controller ownerReference; required with --rails-record
    /// configmap.
    #[arg(long, value_name = "NAME")]
    pub owner_deployment: Option<String>,

    /// Which records to keep clean: `configmap` (the default: keys of
    /// --rails-configmap, which the observer creates and owns) or
    /// `custom-resource` (NodeRailRecords, deleted when their owner Node is
    /// gone or replaced, without waiting for the garbage collector; no
    /// ConfigMap or Deployment is needed).
    #[arg(long, value_name = "FORM", value_enum, env = "NODEFABRIC_RAILS_RECORD")]
    pub rails_record: Option<RecordForm>,

    /// Reconcile every key this often, besides after each list and on each
    /// Node deletion or replacement seen.
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = humantime::parse_duration)]
    pub resync: Duration,

    /// Serve /livez and /readyz on this address (e.g. 0.0.0.0:8080).
    #[arg(long, value_name = "ADDR")]
    pub health_addr: Option<SocketAddr>,

    /// The service-account folder for the in-cluster client; KUBECONFIG,
    /// when set, is used instead.
    #[arg(long, value_name = "DIR", default_value = SERVICE_ACCOUNT_DIR)]
    pub service_account_dir: PathBuf,
}

impl ObserveArgs {
    /// Runs the observer until SIGTERM/SIGINT.
    pub fn run(&self) -> anyhow::Result<()> {
        if self.resync.is_zero() {
            anyhow::bail!("--resync must be longer than 0s");
        }
        let records = match (self.rails_record.unwrap_or_default(), &self.rails_configmap, &self.owner_deployment) {
            (RecordForm::Configmap, Some(cm), Some(owner)) => observer::Records::ConfigMap {
                configmap: cm.clone(),
                owner_deployment: owner.clone(),
            },
            (RecordForm::Configmap, _, _) => anyhow::bail!(
                "observing the shared ConfigMap needs --rails-configmap and --owner-deployment (or --rails-record custom-resource)"
            ),
            (RecordForm::CustomResource, None, None) => observer::Records::CustomResource,
            (RecordForm::CustomResource, _, _) => anyhow::bail!(
                "--rails-configmap and --owner-deployment are for --rails-record configmap; custom-resource needs neither"
            ),
        };
        let health = Health::new();
        if let Some(addr) = self.health_addr {
            let bound = health
                .serve(addr)
                .map_err(|e| anyhow::anyhow!("--health-addr {addr}: {e}"))?;
            tracing::info!("health endpoints on http://{bound}/livez and /readyz");
        }
        let settings = observer::Settings {
            records,
            resync: self.resync,
            service_account_dir: self.service_account_dir.clone(),
            health,
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(ClusterError::Runtime)?;
        runtime.block_on(observer::run(settings))?;
        Ok(())
    }
}
