//! A kubelet stand-in: serves the real `Registration` gRPC service on
//! `kubelet.sock` and hands each registration to the test or benchmark.
#![allow(dead_code)]

use super::wait::within;
use nodefabric::kubelet::socket;
use nodefabric::plugin::api::{
    self,
    registration_server::{Registration, RegistrationServer},
};
use std::path::Path;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

/// Serves `Registration` and hands each request to the test.
struct StandIn(mpsc::UnboundedSender<api::RegisterRequest>);

#[tonic::async_trait]
impl Registration for StandIn {
    async fn register(
        &self,
        request: Request<api::RegisterRequest>,
    ) -> Result<Response<api::Empty>, Status> {
        let _ = self.0.send(request.into_inner());
        Ok(Response::new(api::Empty {}))
    }
}

/// A running kubelet stand-in.
pub struct Kubelet {
    /// Every RegisterRequest received, in arrival order.
    pub registered: mpsc::UnboundedReceiver<api::RegisterRequest>,
    server: tokio::task::JoinHandle<()>,
}

impl Kubelet {
    /// Serves on `dir/kubelet.sock` (replacing a stale one).
    pub fn start(dir: &Path) -> Kubelet {
        let (tx, registered) = mpsc::unbounded_channel();
        let listener = socket::bind(&dir.join("kubelet.sock")).unwrap();
        let server = tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(RegistrationServer::new(StandIn(tx)))
                .serve_with_incoming(UnixListenerStream::new(listener))
                .await
                .unwrap();
        });
        Kubelet { registered, server }
    }

    /// The next `n` registrations, sorted by resource name.
    pub async fn registrations(&mut self, n: usize) -> Vec<api::RegisterRequest> {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(
                within("a registration", self.registered.recv())
                    .await
                    .unwrap(),
            );
        }
        out.sort_by(|a, b| a.resource_name.cmp(&b.resource_name));
        out
    }

    /// Stops serving (the socket file stays, as after a kubelet crash).
    pub fn stop(self) {
        self.server.abort();
    }

    /// [`Kubelet::stop`], once the listener is closed: a kubelet that
    /// binds next may be handed the freed inode.
    pub async fn stopped(self) {
        self.server.abort();
        let _ = self.server.await;
    }
}
