//! The cluster flags: the broker's (on `rails` and `publish`) and those of
//! `nodefabric observe`, each turned into the plain settings the cluster
//! modules take, with the checks of which flags go together.

use crate::cluster::broker::{self, Broker, Memo, Target};
use crate::cluster::health::Health;
use crate::cluster::{client, observer, ConfigMapRef, SERVICE_ACCOUNT_DIR};
use anyhow::Result;
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
    #[arg(long, value_name = "NAME", env = "NODE_NAME", value_parser = crate::names::parse_node_name)]
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
    /// fails (nothing is changed then; 1s to 10m).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = crate::names::parse_api_timeout)]
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

/// The two forms of the cluster-wide rail record (`--rails-record`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum RecordForm {
    /// One key per node in the shared ConfigMap (seed 001's form).
    #[default]
    Configmap,
    /// One NodeRailRecord object per node.
    CustomResource,
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
    /// The broker these flags describe; clones share its memory ([`Memo`]).
    pub fn broker(&self) -> Broker {
        Broker {
            settings: broker::Settings {
                node_uid: self.node_uid.clone(),
                node_name: self.node_name.clone(),
                client: client::Settings {
                    service_account_dir: self.service_account_dir.clone(),
                    timeout: Some(self.api_timeout),
                },
            },
            memo: self.memo.clone(),
        }
    }

    /// True when these flags may lead to an API request: a cluster is
    /// configured (KUBECONFIG, or in a pod), or a record in one is named.
    pub fn may_use_api(&self) -> bool {
        client::configured() || self.rails_record.is_some() || self.rails_configmap.is_some()
    }

    /// True when the record's `nodeUID` is read from the Node: no
    /// --node-uid, a --node-name, and a cluster configured; else it is
    /// --node-uid, or empty (node-local use). See [`Broker::node_uid`].
    pub fn node_uid_from_api(&self) -> bool {
        self.node_uid.is_empty() && self.node_name.is_some() && client::configured()
    }

    /// Where to publish: with `--rails-record custom-resource`, this node's
    /// NodeRailRecord (a cluster must be configured); else --rails-configmap,
    /// or `config_name` (the config file's configMapName) in the client's
    /// namespace when a cluster is configured, so the same values file still
    /// serves a node-local `rails` run on a machine with no cluster.
    pub fn target(&self, config_name: Option<&str>) -> Result<Option<Target>> {
        let target = match self.rails_record.unwrap_or_default() {
            RecordForm::CustomResource => {
                if let Some(cm) = &self.rails_configmap {
                    anyhow::bail!("--rails-configmap {cm} is for --rails-record configmap; with custom-resource each node writes its own NodeRailRecord");
                }
                if !client::configured() {
                    anyhow::bail!("--rails-record custom-resource needs a cluster to write to: set KUBECONFIG, or run in a pod");
                }
                let Some(node) = &self.node_name else {
                    anyhow::bail!("--rails-record custom-resource needs --node-name (or NODE_NAME): the record is named after its node");
                };
                Some(Target::CustomResource(node.clone()))
            }
            RecordForm::Configmap => match (&self.rails_configmap, config_name) {
                (Some(cm), _) => Some(Target::ConfigMap(cm.clone())),
                (None, Some(name)) if client::configured() => Some(Target::ConfigMap(
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
    pub fn run(&self) -> Result<()> {
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
            health,
        };
        // No timeout: the Node watch answers only when something changes.
        let api = client::Settings {
            service_account_dir: self.service_account_dir.clone(),
            timeout: None,
        };
        client::run(&api, "observing Nodes", |c| observer::run(c, settings))?;
        Ok(())
    }
}
