//! The API stand-in's pods, DaemonSets and the pod `exec` subresource, as
//! kube-apiserver serves them to a client running a command in a pod:
//!
//! - DaemonSets (`apps/v1`): GET.
//! - Pods: LIST with `labelSelector` (equality `k=v`/`k==v`/`k!=v`,
//!   `k in (…)`, `k notin (…)`, `k`, `!k`; anything else is 400) and
//!   `fieldSelector` (`spec.nodeName`, `metadata.name`, `status.phase`,
//!   with `=`/`==`/`!=`; another field is 400).
//! - `GET …/pods/NAME/exec?command=…&container=…&stdout=true&stderr=true`:
//!   404 for an unknown pod, 400 for a missing container name in a pod of
//!   several or an unknown one, 400 for a request that is no websocket
//!   upgrade; else the HTTP/1.1 upgrade to a websocket with the channel
//!   subprotocol the client offered first among those the server allows
//!   (`v5.channel.k8s.io`, `v4.channel.k8s.io`; a test can allow only v4),
//!   refused with a bare 403 as the server's websocket handshake refuses
//!   when none matches. On the socket: binary messages whose first byte is
//!   the channel (an empty one on stdout first, then 1 stdout, 2 stderr,
//!   3 the error channel's `metav1.Status`: Success, or Failure with reason
//!   `NonZeroExitCode` and cause `ExitCode`), then a close.
//!
//! What each command in each pod answers is scripted by the test ([`Reply`]).

use super::{not_found, query_param, status, State};
use serde_json::{json, Value};

/// The channel subprotocols kube-apiserver speaks for exec, newest first.
pub const PROTOCOLS: [&str; 2] = ["v5.channel.k8s.io", "v4.channel.k8s.io"];

/// How one command in one pod answers.
#[derive(Debug, Clone)]
pub enum Reply {
    /// Prints these bytes, exits with this code (0: Success).
    Exit {
        /// Its standard output.
        stdout: Vec<u8>,
        /// Its standard error.
        stderr: Vec<u8>,
        /// Its exit code.
        code: i32,
    },
    /// Never ends (nvidia-smi stuck on a wedged GPU).
    Hang,
    /// Prints these bytes of standard output, then the connection drops
    /// without a status or a close (a restarted API server or node).
    Drop(Vec<u8>),
}

impl Reply {
    /// A command that prints `stdout` and exits 0.
    pub fn ok(stdout: impl Into<Vec<u8>>) -> Reply {
        Reply::Exit {
            stdout: stdout.into(),
            stderr: Vec::new(),
            code: 0,
        }
    }
}

/// One exec the server upgraded, for assertions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    /// `namespace/pod`.
    pub pod: String,
    /// The container named.
    pub container: String,
    /// The command, word by word.
    pub command: Vec<String>,
    /// The subprotocol agreed.
    pub protocol: String,
}

/// The exec side of the server state.
#[derive(Default)]
pub struct Execs {
    /// (namespace, pod, command joined by spaces) → its answer.
    pub replies: std::collections::BTreeMap<(String, String, String), Reply>,
    /// The subprotocols allowed; empty: [`PROTOCOLS`].
    pub allowed: Vec<&'static str>,
    /// The execs upgraded so far.
    pub served: Vec<Served>,
}

/// Serves GET on DaemonSets and LIST on pods (other requests fall through: `None`).
pub fn route(s: &State, method: &str, seg: &[&str], query: &str) -> Option<(u16, Value)> {
    Some(match (method, seg) {
        ("GET", ["apis", "apps", "v1", "namespaces", ns, "daemonsets", name]) => {
            match s.objects.get(&super::key("daemonsets", ns, name)) {
                Some(d) => (200, d.clone()),
                None => status(
                    404,
                    "NotFound",
                    &format!("daemonsets.apps \"{name}\" not found"),
                    json!({"name": name, "group": "apps", "kind": "daemonsets"}),
                ),
            }
        }
        ("GET", ["api", "v1", "namespaces", ns, "pods"]) => list_pods(s, ns, query),
        ("GET", ["api", "v1", "namespaces", ns, "pods", name]) => {
            match s.objects.get(&super::key("pods", ns, name)) {
                Some(p) => (200, p.clone()),
                None => not_found("pods", name),
            }
        }
        _ => return None,
    })
}

fn list_pods(s: &State, ns: &str, query: &str) -> (u16, Value) {
    let labels = match query_param(query, "labelSelector").map(|l| label_selector(&l)) {
        Some(Err(e)) => return status(400, "BadRequest", &e, Value::Null),
        Some(Ok(sel)) => sel,
        None => Vec::new(),
    };
    let fields = match query_param(query, "fieldSelector").map(|f| field_selector(&f)) {
        Some(Err(e)) => return status(400, "BadRequest", &e, Value::Null),
        Some(Ok(sel)) => sel,
        None => Vec::new(),
    };
    let items: Vec<Value> = s
        .objects
        .iter()
        .filter(|((r, n, _), _)| r == "pods" && n == ns)
        .map(|(_, p)| p)
        .filter(|p| {
            labels
                .iter()
                .all(|req| req.matches(&p["metadata"]["labels"]))
        })
        .filter(|p| {
            fields.iter().all(|(path, want, equal)| {
                let have = p.pointer(path).and_then(Value::as_str).unwrap_or("");
                (have == want) == *equal
            })
        })
        .cloned()
        .collect();
    (
        200,
        json!({"apiVersion": "v1", "kind": "PodList",
               "metadata": {"resourceVersion": s.rv.to_string()}, "items": items}),
    )
}

/// One requirement of a label selector.
enum Requirement {
    Equal(String, String),
    NotEqual(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

impl Requirement {
    fn matches(&self, labels: &Value) -> bool {
        let get = |k: &str| labels.get(k).and_then(Value::as_str);
        match self {
            Requirement::Equal(k, v) => get(k) == Some(v),
            // As the server's: a missing label is "not equal".
            Requirement::NotEqual(k, v) => get(k) != Some(v),
            Requirement::In(k, vs) => get(k).is_some_and(|h| vs.iter().any(|v| v == h)),
            Requirement::NotIn(k, vs) => get(k).is_none_or(|h| vs.iter().all(|v| v != h)),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::DoesNotExist(k) => get(k).is_none(),
        }
    }
}

/// Splits at commas outside parentheses.
fn split_top(s: &str) -> Vec<&str> {
    let (mut depth, mut start, mut out) = (0, 0, Vec::new());
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn label_key(k: &str, whole: &str) -> Result<String, String> {
    let k = k.trim();
    let ok = !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c));
    match ok {
        true => Ok(k.to_string()),
        false => Err(format!(
            "unable to parse requirement: invalid label key {k:?} in {whole:?}"
        )),
    }
}

fn label_selector(sel: &str) -> Result<Vec<Requirement>, String> {
    if sel.trim().is_empty() {
        return Ok(Vec::new());
    }
    let set = |rest: &str| -> Result<Vec<String>, String> {
        let inner = rest
            .trim()
            .strip_prefix('(')
            .and_then(|r| r.strip_suffix(')'))
            .ok_or_else(|| format!("found '{rest}', expected: '(' ... ')'"))?;
        Ok(inner.split(',').map(|v| v.trim().to_string()).collect())
    };
    split_top(sel)
        .into_iter()
        .map(|part| {
            let part = part.trim();
            if let Some((k, v)) = part.split_once("!=") {
                return Ok(Requirement::NotEqual(label_key(k, sel)?, v.trim().into()));
            }
            if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                return Ok(Requirement::Equal(label_key(k, sel)?, v.trim().into()));
            }
            if let Some((k, rest)) = part.split_once(" notin ") {
                return Ok(Requirement::NotIn(label_key(k, sel)?, set(rest)?));
            }
            if let Some((k, rest)) = part.split_once(" in ") {
                return Ok(Requirement::In(label_key(k, sel)?, set(rest)?));
            }
            if let Some(k) = part.strip_prefix('!') {
                return Ok(Requirement::DoesNotExist(label_key(k, sel)?));
            }
            Ok(Requirement::Exists(label_key(part, sel)?))
        })
        .collect()
}

/// `(JSON pointer, value, equal?)` per requirement; the pod fields the server supports.
fn field_selector(sel: &str) -> Result<Vec<(String, String, bool)>, String> {
    sel.split(',')
        .filter(|p| !p.is_empty())
        .map(|part| {
            let (field, value, equal) = if let Some((f, v)) = part.split_once("!=") {
                (f, v, false)
            } else if let Some((f, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                (f, v, true)
            } else {
                return Err(format!(
                    "invalid selector: '{sel}'; can't understand '{part}'"
                ));
            };
            let pointer = match field {
                "spec.nodeName" => "/spec/nodeName",
                "metadata.name" => "/metadata/name",
                "metadata.namespace" => "/metadata/namespace",
                "status.phase" => "/status/phase",
                other => return Err(format!("field label not supported: {other}")),
            };
            Ok((pointer.to_string(), value.to_string(), equal))
        })
        .collect()
}

/// What the exec request asked, checked as the server checks it before the upgrade.
pub struct Asked {
    pub ns: String,
    pub pod: String,
    pub container: String,
    pub command: Vec<String>,
    pub protocol: &'static str,
    pub reply: Reply,
}

/// The checks before the upgrade: the pod, its container, the websocket
/// headers and a subprotocol in common; `Err` is the answer to give instead
/// (`None` body: a bare status, as the websocket handshake's refusal).
pub fn check(
    s: &State,
    seg: &[&str],
    query: &str,
    upgrade: &str,
    offered: &str,
) -> Result<Asked, (u16, Option<Value>)> {
    let (ns, name) = match seg {
        ["api", "v1", "namespaces", ns, "pods", name, "exec"] => (*ns, *name),
        _ => unreachable!("only exec paths come here"),
    };
    let Some(pod) = s.objects.get(&super::key("pods", ns, name)) else {
        return Err(with_body(not_found("pods", name)));
    };
    let containers: Vec<&str> = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str())
        .collect();
    let container = match query_param(query, "container") {
        Some(c) if containers.contains(&c.as_str()) => c,
        Some(c) => {
            return Err(with_body(status(
                400,
                "BadRequest",
                &format!("container {c} is not valid for pod {name}"),
                Value::Null,
            )))
        }
        None if containers.len() == 1 => containers[0].to_string(),
        None => {
            return Err(with_body(status(
                400,
                "BadRequest",
                &format!(
                    "a container name must be specified for pod {name}, choose one of: [{}]",
                    containers.join(" ")
                ),
                Value::Null,
            )))
        }
    };
    let command: Vec<String> = query
        .split('&')
        .filter_map(|kv| kv.strip_prefix("command="))
        .map(super::percent_decode)
        .collect();
    if !upgrade.eq_ignore_ascii_case("websocket") {
        return Err(with_body(status(
            400,
            "BadRequest",
            "Upgrade request required",
            Value::Null,
        )));
    }
    let allowed: &[&'static str] = match s.exec.allowed.is_empty() {
        true => &PROTOCOLS,
        false => &s.exec.allowed,
    };
    // The client's order wins, as the server's handshake walks it.
    let protocol = offered
        .split(',')
        .map(str::trim)
        .find_map(|p| allowed.iter().find(|a| **a == p).copied());
    let Some(protocol) = protocol else {
        return Err((403, None));
    };
    let reply = s
        .exec
        .replies
        .get(&(ns.to_string(), name.to_string(), command.join(" ")))
        .cloned()
        .unwrap_or(Reply::Exit {
            stdout: Vec::new(),
            stderr: format!(
                "exec: \"{}\": executable file not found in $PATH",
                command.first().map(String::as_str).unwrap_or("")
            )
            .into_bytes(),
            code: 127,
        });
    Ok(Asked {
        ns: ns.into(),
        pod: name.into(),
        container,
        command,
        protocol,
        reply,
    })
}

fn with_body((code, body): (u16, Value)) -> (u16, Option<Value>) {
    (code, Some(body))
}

/// Speaks the channel protocol on the upgraded connection until the reply is given.
pub async fn speak(on: hyper::upgrade::OnUpgrade, asked: Asked) {
    let Asked { reply, command, .. } = asked;
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::protocol::Role;
    use tokio_tungstenite::tungstenite::Message;
    let Ok(upgraded) = on.await else { return };
    let ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
        hyper_util::rt::TokioIo::new(upgraded),
        Role::Server,
        None,
    )
    .await;
    let (mut tx, mut rx) = ws.split();
    // What the client sends (v5's stdin close, v4's whole close, pongs) is
    // read and dropped, so its control frames are answered.
    let reader = tokio::spawn(async move { while let Some(Ok(_)) = rx.next().await {} });
    let frame = |channel: u8, data: &[u8]| {
        let mut v = Vec::with_capacity(data.len() + 1);
        v.push(channel);
        v.extend_from_slice(data);
        Message::binary(v)
    };
    // The server's first message: an empty one on the lowest channel it writes.
    if tx.send(frame(1, &[])).await.is_err() {
        return;
    }
    match reply {
        Reply::Hang => {
            let _ = reader.await;
        }
        Reply::Drop(stdout) => {
            for chunk in stdout.chunks(32 * 1024) {
                let _ = tx.send(frame(1, chunk)).await;
            }
            // Dropped with no status and no close.
            reader.abort();
        }
        Reply::Exit {
            stdout,
            stderr,
            code,
        } => {
            for chunk in stdout.chunks(32 * 1024) {
                if tx.send(frame(1, chunk)).await.is_err() {
                    return;
                }
            }
            for chunk in stderr.chunks(32 * 1024) {
                if tx.send(frame(2, chunk)).await.is_err() {
                    return;
                }
            }
            let status = match code {
                0 => json!({"metadata": {}, "status": "Success"}),
                c => json!({"metadata": {}, "status": "Failure",
                    "message": format!("command terminated with non-zero exit code: error executing command [{}], exit code {c}", command.join(" ")),
                    "reason": "NonZeroExitCode",
                    "details": {"causes": [{"reason": "ExitCode", "message": c.to_string()}]}}),
            };
            let _ = tx
                .send(frame(3, &serde_json::to_vec(&status).unwrap()))
                .await;
            let _ = tx.send(Message::Close(None)).await;
            let _ = reader.await;
        }
    }
}
