//! nvidia-smi's two rail answers asked of the GPU Operator's pod on this
//! node (`gpuSource`): the DaemonSet is read for its own selector, its pods
//! on this node are listed (`spec.nodeName`), exactly one must be Running,
//! and both commands run in it through the exec subresource (kube-rs's
//! websocket, channel protocol v5 with v4 fallback). The answers are the
//! same [`NvidiaAnswers`] a local nvidia-smi gives, so the rail build, the
//! capture and its replay treat them alike.
//!
//! Nothing here returns an error: a pod that cannot answer (none, several,
//! a refused exec, a non-zero exit, a timeout, a dropped connection, an
//! answer over the cap) is a failed `--query-gpu` or `topo -m` answer whose
//! words name the pod or the DaemonSet, which fails the rail pass as a
//! failed local nvidia-smi does; it never reads as "no nvidia-smi here".

use super::error::{code, describe, status_message};
use super::{client, ClusterError};
use crate::rails::answers::{Answer, NvidiaAnswers, Origin};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{AttachParams, ListParams};
use kube::core::Selector;
use kube::{Api, Client};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt};

/// The `--query-gpu` command, word for word as a local run asks it.
pub const QUERY: [&str; 3] = [
    "nvidia-smi",
    "--query-gpu=index,uuid,pci.bus_id",
    "--format=csv,noheader",
];

/// The matrix command.
pub const TOPO: [&str; 3] = ["nvidia-smi", "topo", "-m"];

/// The annotation kubectl reads for the container an exec goes to when none
/// is named; the pod's first container otherwise.
pub const DEFAULT_CONTAINER: &str = "kubectl.kubernetes.io/default-container";

/// Which pod to ask, and the bounds of asking it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The GPU Operator's namespace (`gpuSource.gpuOperatorNamespace`).
    pub namespace: String,
    /// The DaemonSet whose pod on this node runs nvidia-smi (`gpuSource.daemonSet`).
    pub daemon_set: String,
    /// This node's name (`--node-name`).
    pub node: String,
    /// Both commands together, from the first exec to the last byte (`--tool-timeout`).
    pub timeout: Duration,
    /// The most either stream of one command may carry; more is refused, not cut.
    pub cap: u64,
}

impl Settings {
    /// The DaemonSet as errors name it.
    fn daemon_set_name(&self) -> String {
        format!("DaemonSet {}/{}", self.namespace, self.daemon_set)
    }
}

/// Asks the pod (see the module text) with the process's one client, on
/// its runtime: the pod lookup within the API timeout of `api`, the two
/// commands within [`Settings::timeout`].
pub fn answers(api: &client::Settings, settings: &Settings) -> NvidiaAnswers {
    let lookup = format!(
        "finding the pod of {} on node {}",
        settings.daemon_set_name(),
        settings.node
    );
    let asked = client::block_on(async {
        let after = api.timeout.unwrap_or(Duration::MAX);
        let client = tokio::time::timeout(after, client::shared(api))
            .await
            .map_err(|_| ClusterError::SetupTimedOut {
                what: lookup.clone(),
                after,
            })??;
        let pod = tokio::time::timeout(after, find_pod(&client, settings))
            .await
            .map_err(|_| ClusterError::TimedOut {
                what: lookup.clone(),
                after,
            })??;
        Ok(ask(&client, &pod, settings).await)
    });
    asked.unwrap_or_else(|e| unanswered(settings, e))
}

/// The answers of a pass whose pod could not be found or asked: a failed
/// query naming the DaemonSet, and no matrix (as locally, it is asked only
/// after a query that printed).
fn unanswered(settings: &Settings, e: ClusterError) -> NvidiaAnswers {
    NvidiaAnswers {
        query: Answer::failed(
            Origin::Exec(format!(
                "{} on node {}: {}",
                settings.daemon_set_name(),
                settings.node,
                QUERY.join(" ")
            )),
            format!("gpuSource: {}", super::error::Chain(&e)),
        ),
        topo: None,
    }
}

/// The one pod to ask, and the container in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The container the commands run in.
    pub container: String,
}

/// The one Running pod of the DaemonSet on this node (its own selector and
/// `spec.nodeName`); none or several is an error naming what was found.
pub async fn find_pod(client: &Client, settings: &Settings) -> Result<Target, ClusterError> {
    let ns = &settings.namespace;
    let ds_name = settings.daemon_set_name();
    let what = format!("GET {ds_name}");
    let ds = Api::<DaemonSet>::namespaced(client.clone(), ns)
        .get(&settings.daemon_set)
        .await
        .map_err(|e| match code(&e) {
            Some(404) => ClusterError::Malformed {
                what: what.clone(),
                message: format!("no such DaemonSet (gpuSource.gpuOperatorNamespace and gpuSource.daemonSet name it; the API server said: {})", status_message(&e)),
            },
            _ => ClusterError::refused(what.clone(), format!("`get` on daemonsets.apps in namespace {ns}"), e),
        })?;
    let selector = ds
        .spec
        .map(|s| s.selector)
        .ok_or_else(|| ClusterError::Malformed {
            what: what.clone(),
            message: "the DaemonSet has no spec.selector".into(),
        })?;
    let selector = Selector::try_from(selector).map_err(|e| ClusterError::Malformed {
        what: what.clone(),
        message: format!("its spec.selector cannot be used: {}", e.0),
    })?;
    let fields = format!("spec.nodeName={}", settings.node);
    let list = format!("LIST pods in {ns} ({selector}, {fields})");
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels_from(&selector).fields(&fields))
        .await
        .map_err(|e| {
            ClusterError::refused(list.clone(), format!("`list` on pods in namespace {ns}"), e)
        })?;
    let phase = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_else(|| "no phase".into())
    };
    let name = |p: &Pod| p.metadata.name.clone().unwrap_or_default();
    let running: Vec<&Pod> = pods
        .items
        .iter()
        .filter(|p| phase(p) == "Running" && p.metadata.deletion_timestamp.is_none())
        .collect();
    let found = || {
        let all: Vec<String> = pods
            .items
            .iter()
            .map(|p| {
                let going = if p.metadata.deletion_timestamp.is_some() {
                    ", terminating"
                } else {
                    ""
                };
                format!("{} ({}{going})", name(p), phase(p))
            })
            .collect();
        match all.is_empty() {
            true => "none found".to_string(),
            false => format!("found {}", all.join(", ")),
        }
    };
    let pod = match running.as_slice() {
        [one] => *one,
        [] => {
            return Err(ClusterError::Malformed {
                what: list,
                message: format!(
                "{ds_name} has no Running pod on node {}: {}; nvidia-smi is asked in exactly one",
                settings.node,
                found()
            ),
            })
        }
        _ => {
            return Err(ClusterError::Malformed {
                what: list,
                message: format!(
                "{ds_name} has {} Running pods on node {}: {}; nvidia-smi is asked in exactly one",
                running.len(),
                settings.node,
                found()
            ),
            })
        }
    };
    let containers = pod.spec.as_ref().map(|s| &s.containers[..]).unwrap_or(&[]);
    let named = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(DEFAULT_CONTAINER))
        .filter(|c| containers.iter().any(|k| &k.name == *c));
    let container = named
        .cloned()
        .or_else(|| containers.first().map(|c| c.name.clone()))
        .ok_or_else(|| ClusterError::Malformed {
            what: list.clone(),
            message: format!("pod {ns}/{} lists no container", name(pod)),
        })?;
    Ok(Target {
        namespace: ns.clone(),
        name: name(pod),
        container,
    })
}

/// Runs both commands in `pod` within the settings' timeout: the query,
/// then the matrix only after a query that printed.
pub async fn ask(client: &Client, pod: &Target, settings: &Settings) -> NvidiaAnswers {
    let deadline = tokio::time::Instant::now() + settings.timeout;
    let query = run(client, pod, &QUERY, settings, deadline).await;
    let topo = match query.text() {
        Some(_) => Some(run(client, pod, &TOPO, settings, deadline).await),
        None => None,
    };
    NvidiaAnswers { query, topo }
}

/// One command's answer; every way it can fail is a failed answer naming the pod.
async fn run(
    client: &Client,
    pod: &Target,
    command: &[&str],
    settings: &Settings,
    deadline: tokio::time::Instant,
) -> Answer {
    let origin = Origin::Exec(format!(
        "pod {}/{} (container {}): {}",
        pod.namespace,
        pod.name,
        pod.container,
        command.join(" ")
    ));
    let out = tokio::time::timeout_at(deadline, exec(client, pod, command, settings.cap)).await;
    match out {
        Ok(Ok(text)) => Answer::printed(origin, text),
        Ok(Err(why)) => {
            let why = format!("{}: {why}", origin.name());
            Answer::failed(origin, why)
        }
        Err(_) => {
            let why = format!(
                "{}: not done within {} (--tool-timeout, both commands together); the exec was abandoned",
                origin.name(),
                humantime::format_duration(settings.timeout)
            );
            Answer::failed(origin, why)
        }
    }
}

/// Why one exec gave no output to parse, kept typed until it becomes the
/// failed answer's text; each variant's text is what the answer has always
/// said.
#[derive(Debug, thiserror::Error)]
enum ExecFailure {
    /// The websocket handshake's bare 403: no channel protocol in common.
    #[error("exec: the API server refused the websocket upgrade (403 without a Status: no channel protocol in common with {})", ["v5.channel.k8s.io", "v4.channel.k8s.io"].join(", "))]
    Upgrade,
    /// RBAC refused `create` on pods/exec.
    #[error(transparent)]
    Refused(ClusterError),
    /// Any other failure to start the exec.
    #[error("exec: {}", describe(.0))]
    Start(kube::Error),
    /// The connection ended without an exit status (and why, when it says).
    #[error("the exec connection closed before the command's exit status{}", .0.as_deref().map(|e| format!(": {}", super::error::Chain(e))).unwrap_or_default())]
    Closed(Option<Box<dyn std::error::Error + Send + Sync>>),
    /// Standard output passed the cap.
    #[error("printed more than {0} bytes on stdout (the cap); refused, not parsed")]
    StdoutCap(u64),
    /// Standard error passed the cap.
    #[error("printed more than {0} bytes on stderr (the cap); refused")]
    StderrCap(u64),
    /// The command succeeded but printed text that is not UTF-8.
    #[error("printed text that is not UTF-8: {0}")]
    NotUtf8(std::string::FromUtf8Error),
    /// The command exited non-zero.
    #[error("exited with exit code {code}: {stderr}")]
    ExitCode {
        /// The exit code, as the status gives it.
        code: String,
        /// Its standard error, trimmed and capped.
        stderr: String,
    },
    /// The exec failed otherwise, as its status says.
    #[error("failed ({reason}): {message}: {stderr}")]
    Failed {
        /// The status's reason (`no reason` when it has none).
        reason: String,
        /// The status's message (`no message` when it has none).
        message: String,
        /// Its standard error, trimmed and capped.
        stderr: String,
    },
}

/// Runs `command` in `pod` and returns its standard output, or why not.
async fn exec(
    client: &Client,
    pod: &Target,
    command: &[&str],
    cap: u64,
) -> Result<String, ExecFailure> {
    let params = AttachParams::default()
        .container(pod.container.clone())
        .stdin(false)
        .stdout(true)
        .stderr(true)
        .tty(false)
        // Larger pipes than kube-rs's 1 KiB: fewer wake-ups for a 100 KiB matrix.
        .max_stdout_buf_size(64 * 1024)
        .max_stderr_buf_size(64 * 1024);
    let mut process = Api::<Pod>::namespaced(client.clone(), &pod.namespace)
        .exec(&pod.name, command.to_vec(), &params)
        .await
        .map_err(|e| match code(&e) {
            // RBAC's refusal is a Forbidden Status; the websocket handshake's
            // (no channel protocol in common) is a bare 403.
            Some(403) if !is_rbac(&e) => ExecFailure::Upgrade,
            Some(403) => ExecFailure::Refused(ClusterError::refused(
                "exec",
                format!("`create` on pods/exec in namespace {}", pod.namespace),
                e,
            )),
            _ => ExecFailure::Start(e),
        })?;
    let stdout = process.stdout().expect("stdout asked");
    let stderr = process.stderr().expect("stderr asked");
    let mut status = Box::pin(process.take_status().expect("status taken once"));
    // Both streams are drained together: kube-rs's message loop waits on a
    // full pipe. They end when the loop ends with a status or a clean
    // close; a loop that fails (a dropped connection) leaves them open, so
    // the status (its sender dropped then) is awaited beside them.
    let mut reads = Box::pin(async { tokio::join!(capped(stdout, cap), capped(stderr, cap)) });
    let first = tokio::select! {
        read = &mut reads => Ok(read),
        got = &mut status => Err(got),
    };
    let (got, (out, err)) = match first {
        Ok(read) => (None, read),
        Err(Some(got)) => (Some(got), reads.await),
        Err(None) => {
            let cause = process.join().await.err().map(|e| e.into());
            return Err(ExecFailure::Closed(cause));
        }
    };
    // Checked before the status is awaited: past the cap the loop waits on
    // a pipe nobody reads.
    let out = out.map_err(ExecFailure::StdoutCap)?;
    let err = err.map_err(ExecFailure::StderrCap)?;
    let status = match got {
        Some(got) => Some(got),
        None => status.await,
    };
    let stderr_text = || {
        let text = String::from_utf8_lossy(&err);
        let text = text.trim();
        crate::tool::cap_text(text, crate::tool::MAX_STDERR_KEPT, text.len() as u64)
    };
    match status {
        Some(s) if s.status.as_deref() == Some("Success") => {
            String::from_utf8(out).map_err(ExecFailure::NotUtf8)
        }
        Some(s) => {
            let exit = s
                .details
                .as_ref()
                .and_then(|d| d.causes.as_ref())
                .and_then(|c| c.iter().find(|c| c.reason.as_deref() == Some("ExitCode")))
                .and_then(|c| c.message.clone());
            Err(match exit {
                Some(code) if s.reason.as_deref() == Some("NonZeroExitCode") => {
                    ExecFailure::ExitCode {
                        code,
                        stderr: stderr_text(),
                    }
                }
                _ => ExecFailure::Failed {
                    reason: s.reason.as_deref().unwrap_or("no reason").to_string(),
                    message: s.message.as_deref().unwrap_or("no message").to_string(),
                    stderr: stderr_text(),
                },
            })
        }
        None => Err(ExecFailure::Closed(None)),
    }
}

/// Whether a 403 is the authorizer's (a `Status` with reason Forbidden).
fn is_rbac(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.reason == "Forbidden")
}

/// Reads `stream` to its end, or stops at more than `cap` bytes (`Err(cap)`).
async fn capped(stream: impl AsyncRead + Unpin, cap: u64) -> Result<Vec<u8>, u64> {
    let mut buf = Vec::new();
    // A read error ends the stream here; the missing status then says why.
    let _ = stream.take(cap + 1).read_to_end(&mut buf).await;
    match buf.len() as u64 > cap {
        true => Err(cap),
        false => Ok(buf),
    }
}
