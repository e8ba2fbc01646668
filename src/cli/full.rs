//! The parts of the command line that only `nodefabric-full` links: the
//! Kubernetes API (the Node read, the broker's writes, the observer, the
//! probe server of a long-running publisher) and NVML.
//!
//! NFD runs `nodefabric features` on every node every minute, so that binary
//! is kept lean and linked static: it never names [`LINKED`], and the linker
//! leaves kube, tokio, rustls, axum and NVML's loader out of it. A command
//! that needs one of them is handed whole to `nodefabric-full`
//! ([`super::forward`]), whose `main` passes [`LINKED`] in [`super::Cli::full`].

use super::{BrokerArgs, Cli, ObserveArgs, PublishArgs};
use crate::cluster::broker::Target;
use crate::cluster::gpu_exec;
use crate::fabric;
use crate::rails::answers::NvidiaAnswers;
use crate::rails::RailRecord;
use anyhow::Result;
use std::process::ExitCode;
use std::time::Duration;

/// What a command may ask of the parts only `nodefabric-full` links.
pub trait Full: std::fmt::Debug + Sync {
    /// The record's `nodeUID`, read from the Node where the flags ask for it
    /// (see [`crate::cluster::broker::Broker::node_uid`]).
    fn node_uid(&self, broker: &BrokerArgs) -> Result<String>;
    /// Writes this node's cluster record; an error leaves the previous one.
    fn publish_record(
        &self,
        broker: &BrokerArgs,
        target: &Target,
        record: &RailRecord,
    ) -> Result<()>;
    /// `nodefabric observe`: runs the Node Observer until SIGTERM.
    fn observe(&self, args: &ObserveArgs) -> Result<()>;
    /// `nodefabric crd`: the NodeRailRecord CRD as YAML.
    fn crd(&self) -> String;
    /// `publish --interval`: a pass every interval, with probes, until killed.
    fn publish_every(&self, cli: &Cli, args: &PublishArgs, interval: Duration) -> Result<ExitCode>;
    /// NVML's fabric reader (loaded with dlopen, which a static binary cannot do safely).
    fn nvml(&self) -> fabric::NvmlReader;
    /// nvidia-smi's answers from the same-node GPU Operator pod, by exec
    /// (see [`crate::cluster::gpu_exec`]).
    fn gpu_answers(&self, broker: &BrokerArgs, settings: &gpu_exec::Settings) -> NvidiaAnswers;
    /// `topo -o svg`: a DOT graph laid out and drawn as SVG, in-process.
    fn svg(&self, dot: &str) -> Result<String>;
}

/// The real parts, as `nodefabric-full` links them.
#[derive(Debug)]
pub struct Linked;

/// The one instance `nodefabric-full`'s `main` hands to the commands.
pub static LINKED: Linked = Linked;

impl Full for Linked {
    fn node_uid(&self, broker: &BrokerArgs) -> Result<String> {
        Ok(broker.broker().node_uid()?)
    }

    fn publish_record(
        &self,
        broker: &BrokerArgs,
        target: &Target,
        record: &RailRecord,
    ) -> Result<()> {
        Ok(broker.broker().publish(target, record)?)
    }

    fn observe(&self, args: &ObserveArgs) -> Result<()> {
        args.run()
    }

    fn crd(&self) -> String {
        crate::cluster::node_rail_record::crd_yaml()
    }

    fn publish_every(&self, cli: &Cli, args: &PublishArgs, interval: Duration) -> Result<ExitCode> {
        super::publish::publish_loop(cli, args, interval)
    }

    fn nvml(&self) -> fabric::NvmlReader {
        fabric::nvml::read
    }

    fn gpu_answers(&self, broker: &BrokerArgs, settings: &gpu_exec::Settings) -> NvidiaAnswers {
        gpu_exec::answers(&broker.broker().settings.client, settings)
    }

    fn svg(&self, dot: &str) -> Result<String> {
        Ok(crate::views::svg::render(dot)?)
    }
}
