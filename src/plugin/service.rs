//! The `DevicePlugin` gRPC service for one resource.

use super::allocate::{self, CdiDelivery};
use super::api::{self, device_plugin_server::DevicePlugin};
use super::catalog::{shared_id, Catalog, Endpoint, Resource, HEALTHY, SHARED_TOKENS, UNHEALTHY};
use super::metrics::{Observed, ResourceLabel};
use crate::kubelet::conn::Hangup;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use tokio_stream::{wrappers::ReceiverStream, Stream};
use tonic::{Request, Response, Status};
use tracing::{debug, info, warn};

/// How the services of one server generation are set up.
#[derive(Clone)]
pub struct Shared {
    /// The always-current catalog.
    pub catalog: watch::Receiver<Arc<Catalog>>,
    /// How allocations hand CDI names to the runtime.
    pub delivery: CdiDelivery,
    /// Flips to true when this server generation stops, ending open streams
    /// so a re-registration does not leave kubelet reading a dead list.
    pub stop: watch::Receiver<bool>,
    /// Metrics.
    pub observed: Arc<Observed>,
    /// How long a ListAndWatch client may leave a list untaken before its
    /// connection is closed.
    pub drain_timeout: Duration,
}

/// Serves one resource from the shared, always-current catalog.
///
/// ListAndWatch streams are not counted against a cap: kubelet opens a new
/// one after every registration, and a cap that other clients' idle streams
/// fill would refuse it. An idle stream holds the catalog it last sent (an
/// `Arc` shared with every other stream) and no list; one whose client stops
/// reading holds at most two lists (one waiting here, one in the HTTP/2
/// buffer) until `--drain-timeout` closes its connection.
#[derive(Clone)]
pub struct ResourceService {
    resource: Resource,
    label: ResourceLabel,
    shared: Shared,
}

impl ResourceService {
    /// A service for `resource`, named `name` in metrics.
    pub fn new(resource: Resource, name: String, shared: Shared) -> Self {
        ResourceService {
            resource,
            label: ResourceLabel { resource: name },
            shared,
        }
    }
}

/// Counts an open stream in the gauge for as long as it lives.
struct StreamGauge {
    observed: Arc<Observed>,
    label: ResourceLabel,
}

impl StreamGauge {
    fn new(observed: Arc<Observed>, label: ResourceLabel) -> StreamGauge {
        observed.streams.get_or_create(&label).inc();
        StreamGauge { observed, label }
    }
}

impl Drop for StreamGauge {
    fn drop(&mut self) {
        self.observed.streams.get_or_create(&self.label).dec();
    }
}

/// The largest ListAndWatch message kubelet takes: its gRPC client keeps
/// the default 4 MiB receive limit and rejects a larger list whole, so a
/// list over it is never sent (see [`list_bytes`]).
pub const MAX_LIST_BYTES: usize = 4 * 1024 * 1024;

/// One token as kubelet is sent it.
fn device(id: String, endpoint: &Endpoint) -> api::Device {
    api::Device {
        id,
        health: if endpoint.healthy { HEALTHY } else { UNHEALTHY }.into(),
        // No NUMA node known means no hint at all, never a stand-in node 0.
        topology: endpoint.numa.map(|id| api::TopologyInfo {
            nodes: vec![api::NumaNode { id }],
        }),
    }
}

/// The device list kubelet is sent for a resource.
pub fn device_list(catalog: &Catalog, resource: Resource) -> Vec<api::Device> {
    catalog
        .tokens(resource)
        .into_iter()
        .map(|t| device(t.id, t.endpoint))
        .collect()
}

/// The encoded size of the ListAndWatch message for a resource, computed
/// one token at a time so that a list too large to send is never built.
pub fn list_bytes(catalog: &Catalog, resource: Resource) -> usize {
    use prost::Message;
    let framed = |d: api::Device| {
        let len = d.encoded_len();
        1 + prost::encoding::encoded_len_varint(len as u64) + len
    };
    catalog
        .endpoints(resource.family())
        .iter()
        .map(|ep| match resource {
            Resource::Shared => (0..SHARED_TOKENS)
                .map(|i| framed(device(shared_id(&ep.name, i), ep)))
                .sum(),
            _ => framed(device(ep.name.clone(), ep)),
        })
        .sum()
}

/// How long after sending a list its freed buffers are handed back (by then
/// the message has been encoded and written).
const TRIM_AFTER: Duration = Duration::from_secs(1);

type DeviceStream = Pin<Box<dyn Stream<Item = Result<api::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for ResourceService {
    async fn get_device_plugin_options(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<api::DevicePluginOptions>, Status> {
        Ok(Response::new(api::DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true,
        }))
    }

    type ListAndWatchStream = DeviceStream;

    async fn list_and_watch(
        &self,
        request: Request<api::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let hangup = request.extensions().get::<Hangup>().cloned();
        // One slot: at most one list waits here for the client; the next is
        // built only once that one is taken.
        let (tx, rx) = mpsc::channel(1);
        let mut catalog = self.shared.catalog.clone();
        let mut stop = self.shared.stop.clone();
        let drain = self.shared.drain_timeout;
        let resource = self.resource;
        let gauge = StreamGauge::new(self.shared.observed.clone(), self.label.clone());
        tokio::spawn(async move {
            // The list is a function of the family's endpoints alone, so the
            // catalog they came from is what is remembered, not the list (a
            // shared list holds tens of thousands of tokens, and idle memory
            // is the budget): every idle stream shares the one current
            // catalog. A change to the other family builds nothing.
            let mut last: Option<Arc<Catalog>> = None;
            let mut trim_pending = false;
            loop {
                let current = catalog.borrow_and_update().clone();
                let endpoints = current.endpoints(resource.family());
                if last.as_ref().map(|l| l.endpoints(resource.family())) != Some(endpoints) {
                    let slot = match tokio::time::timeout(drain, tx.reserve()).await {
                        Ok(Ok(slot)) => slot,
                        Ok(Err(_)) => {
                            debug!("ListAndWatch client went away");
                            return;
                        }
                        Err(_) => {
                            warn!(
                                resource = %gauge.label.resource,
                                "a ListAndWatch client left a device list untaken for {drain:?}: closing its connection"
                            );
                            gauge.observed.dropped.get_or_create(&gauge.label).inc();
                            if let Some(h) = &hangup {
                                h.hang_up();
                            }
                            return;
                        }
                    };
                    let devices = device_list(&current, resource);
                    info!(
                        resource = resource.suffix(),
                        devices = devices.len(),
                        "sending device list"
                    );
                    slot.send(Ok(api::ListAndWatchResponse { devices }));
                    last = Some(current.clone());
                    trim_pending = true;
                }
                loop {
                    tokio::select! {
                        changed = catalog.changed() => if changed.is_err() { return } else { break },
                        _ = stop.wait_for(|s| *s) => return,
                        _ = tx.closed() => return,
                        _ = tokio::time::sleep(TRIM_AFTER), if trim_pending => {
                            trim_pending = false;
                            crate::heap::release_freed_memory();
                        }
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<api::PreferredAllocationRequest>,
    ) -> Result<Response<api::PreferredAllocationResponse>, Status> {
        let started = Instant::now();
        let catalog = self.shared.catalog.borrow().clone();
        let resource = self.resource;
        let requests = request.into_inner().container_requests;
        // Off the runtime thread: a request naming tens of thousands of IDs
        // must not hold up ListAndWatch, Allocate or registration meanwhile.
        let container_responses = tokio::task::spawn_blocking(move || {
            requests
                .iter()
                .map(|r| api::ContainerPreferredAllocationResponse {
                    device_i_ds: allocate::preferred(
                        &catalog,
                        resource,
                        &r.available_device_i_ds,
                        &r.must_include_device_i_ds,
                        usize::try_from(r.allocation_size).unwrap_or(0),
                    ),
                })
                .collect()
        })
        .await
        .map_err(|e| Status::internal(format!("preferred allocation failed: {e}")))?;
        self.shared
            .observed
            .preferred
            .get_or_create(&self.label)
            .observe(started.elapsed().as_secs_f64());
        Ok(Response::new(api::PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<api::AllocateRequest>,
    ) -> Result<Response<api::AllocateResponse>, Status> {
        let started = Instant::now();
        // Recomputed from the specs as they are now; nothing is remembered.
        let catalog = self.shared.catalog.borrow().clone();
        let container_responses = request
            .into_inner()
            .container_requests
            .iter()
            .map(|r| {
                allocate::container_response(
                    &catalog,
                    self.resource,
                    &r.devices_ids,
                    self.shared.delivery,
                )
            })
            .collect::<Result<Vec<_>, _>>();
        self.shared
            .observed
            .allocate
            .get_or_create(&self.label)
            .observe(started.elapsed().as_secs_f64());
        let container_responses = container_responses?;
        Ok(Response::new(api::AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<api::PreStartContainerRequest>,
    ) -> Result<Response<api::PreStartContainerResponse>, Status> {
        Ok(Response::new(api::PreStartContainerResponse {}))
    }
}
