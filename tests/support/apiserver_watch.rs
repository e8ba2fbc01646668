//! The API stand-in's watches: a chunked stream of `{"type", "object"}`
//! lines from a resourceVersion, `410 Gone` below the retained history,
//! paused and dropped on a test's word.

use super::{query_param, shape, status, Body, State};
use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper::Response;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A watch of one collection (`resource` in namespace `ns`, "" for
/// cluster-scoped; `fieldSelector=metadata.name=…` narrows it to one
/// object): every event after the given resourceVersion, as they come.
pub(super) fn watch(
    state: &Arc<Mutex<State>>,
    wake: tokio::sync::watch::Sender<u64>,
    query: &str,
    partial: bool,
    (resource, ns): (&str, &str),
    log: impl Fn(&mut State, u16),
) -> Response<Body> {
    let (resource, ns) = (resource.to_string(), ns.to_string());
    let only = query_param(query, "fieldSelector")
        .and_then(|f| f.strip_prefix("metadata.name=").map(str::to_string));
    let from: u64 = query_param(query, "resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let timeout = query_param(query, "timeoutSeconds")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1800u64);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(64);
    {
        let mut s = state.lock().unwrap();
        log(&mut s, 200);
        if from < s.compacted {
            let (_, gone) = status(
                410,
                "Expired",
                &format!("too old resource version: {from} ({})", s.compacted),
                Value::Null,
            );
            let line = format!("{}\n", json!({"type": "ERROR", "object": gone}));
            let _ = tx.try_send(Ok(Frame::data(Bytes::from(line))));
            drop(tx);
            return stream_reply(rx);
        }
    }
    let epoch = state.lock().unwrap().watch_epoch;
    let state = state.clone();
    let mut woken = wake.subscribe();
    tokio::spawn(async move {
        let mut last = from;
        let deadline = tokio::time::sleep(Duration::from_secs(timeout));
        tokio::pin!(deadline);
        loop {
            let lines: Vec<(u64, String)> = {
                let s = state.lock().unwrap();
                if s.watch_epoch != epoch {
                    return; // dropped: the stream ends, the client watches again
                }
                let horizon = s.paused_at.unwrap_or(u64::MAX);
                s.events
                    .iter()
                    .filter(|(rv, r, n, _, o)| {
                        *rv > last
                            && *rv <= horizon
                            && *r == resource
                            && *n == ns
                            && only
                                .as_deref()
                                .is_none_or(|name| o["metadata"]["name"] == name)
                    })
                    .map(|(rv, _, _, t, o)| {
                        (
                            *rv,
                            format!("{}\n", json!({"type": t, "object": shape(o, partial)})),
                        )
                    })
                    .collect()
            };
            for (rv, line) in lines {
                if tx.send(Ok(Frame::data(Bytes::from(line)))).await.is_err() {
                    return;
                }
                last = rv;
            }
            tokio::select! {
                r = woken.changed() => if r.is_err() { return },
                _ = &mut deadline => return,
                _ = tx.closed() => return,
            }
        }
    });
    stream_reply(rx)
}

fn stream_reply(
    rx: tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, Infallible>>,
) -> Response<Body> {
    let body = StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    let mut r = Response::new(BodyExt::boxed(body));
    r.headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    r
}
