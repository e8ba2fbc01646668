//! Device health to kubelet (KEP-4680, `v1alpha1.DRAResourceHealth`):
//! kubelet opens `NodeWatchResources` after registration and shows what we
//! stream in the pod's `status.containerStatuses[].allocatedResourcesStatus`,
//! so a pod whose NIC's link fails after allocation hears of it.
//!
//! Each message is the complete device list (kubelet reconciles it with its
//! cache): on connect, on every change of a device's health, and at least
//! every [`RESEND`], well inside the [`CHECK_TIMEOUT_SECONDS`] after which
//! kubelet would call a silent device's health unknown.

use super::api::health_v1alpha1 as api;
use super::devices::{DraDevice, Pool};
use crate::record::LinkState;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

/// The service name a driver lists among its supported versions to have
/// kubelet open the stream (`DRAResourceHealth_ServiceDesc.ServiceName`).
pub const SERVICE: &str = "v1alpha1.DRAResourceHealth";

/// How long kubelet may trust a device's last health before calling it
/// unknown: each device says so in `health_check_timeout_seconds`.
pub const CHECK_TIMEOUT_SECONDS: i64 = 90;

/// The longest gap between two complete lists, a third of the timeout.
pub const RESEND: Duration = Duration::from_secs(30);

/// A device's health as kubelet reads it: OK is HEALTHY, Failed is
/// UNHEALTHY with the ports' states, Unverified is UNKNOWN.
pub fn device_health(pool_name: &str, d: &DraDevice, now: i64) -> api::DeviceHealth {
    let (health, message) = match d.link {
        LinkState::Ok => (api::HealthStatus::Healthy, String::new()),
        LinkState::Failed => (
            api::HealthStatus::Unhealthy,
            format!(
                "{}: no port carries the link ({})",
                d.rdma_device,
                d.ports.as_deref().unwrap_or("port states unknown")
            ),
        ),
        LinkState::Unverified => (
            api::HealthStatus::Unknown,
            format!("{}: the link could not be verified", d.rdma_device),
        ),
    };
    api::DeviceHealth {
        device: Some(api::DeviceIdentifier {
            pool_name: pool_name.to_string(),
            device_name: d.name.clone(),
        }),
        health: health as i32,
        last_updated_time: now,
        health_check_timeout_seconds: CHECK_TIMEOUT_SECONDS,
        message,
    }
}

/// The complete list for `pool`, whose pool name is the node's.
fn list(pool_name: &str, pool: &Pool) -> Vec<api::DeviceHealth> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    pool.devices
        .iter()
        .map(|d| device_health(pool_name, d, now))
        .collect()
}

/// What changes a device's health, compared to tell whether kubelet needs
/// a new list.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Verdict {
    /// The device's name.
    device: String,
    /// Its link's verdict.
    link: LinkState,
    /// The message beside it (its ports' states).
    ports: Option<String>,
}

/// Each device's [`Verdict`], in pool order.
fn verdicts(pool: &Pool) -> Vec<Verdict> {
    pool.devices
        .iter()
        .map(|d| Verdict {
            device: d.name.clone(),
            link: d.link,
            ports: d.ports.clone(),
        })
        .collect()
}

/// Streams the pool's health to each kubelet that asks.
pub struct HealthService {
    /// The node's name, each device's pool.
    pub pool_name: String,
    /// The pool as the driver publishes it.
    pub pool: watch::Receiver<Arc<Pool>>,
}

type Stream = Pin<
    Box<
        dyn tokio_stream::Stream<Item = Result<api::NodeWatchResourcesResponse, tonic::Status>>
            + Send,
    >,
>;

#[tonic::async_trait]
impl api::dra_resource_health_server::DraResourceHealth for HealthService {
    type NodeWatchResourcesStream = Stream;

    async fn node_watch_resources(
        &self,
        _: tonic::Request<api::NodeWatchResourcesRequest>,
    ) -> Result<tonic::Response<Stream>, tonic::Status> {
        let (tx, rx) = mpsc::channel(4);
        let mut pool = self.pool.clone();
        let pool_name = self.pool_name.clone();
        tokio::spawn(async move {
            let mut resend = tokio::time::interval(RESEND);
            resend.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut sent = None;
            loop {
                let now = pool.borrow_and_update().clone();
                let state = verdicts(&now);
                // Nothing new to say: wait for a change or the resend.
                if sent.as_ref() == Some(&state) {
                    tokio::select! {
                        _ = resend.tick() => {}
                        changed = pool.changed() => {
                            if changed.is_err() {
                                return;
                            }
                            continue;
                        }
                    }
                }
                let message = api::NodeWatchResourcesResponse {
                    devices: list(&pool_name, &now),
                };
                // kubelet gone: the stream ends with it.
                if tx.send(Ok(message)).await.is_err() {
                    return;
                }
                sent = Some(state);
                resend.reset();
            }
        });
        Ok(tonic::Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdi::Family;

    fn device(link: LinkState, ports: Option<&str>) -> DraDevice {
        DraDevice {
            name: "pci-0000-3b-00-0".into(),
            family: Family::Whole,
            cdi_id: "gpustack.ai/rdma=mlx5_0".into(),
            rdma_device: "mlx5_0".into(),
            link,
            ports: ports.map(str::to_string),
            rail_index: None,
            attributes: Default::default(),
        }
    }

    #[test]
    fn each_verdict_is_the_health_kubelet_reads_and_a_failed_one_names_its_ports() {
        let ok = device_health("node-a", &device(LinkState::Ok, None), 7);
        assert_eq!(ok.health, api::HealthStatus::Healthy as i32);
        assert_eq!(ok.device.as_ref().unwrap().pool_name, "node-a");
        assert_eq!(ok.device.as_ref().unwrap().device_name, "pci-0000-3b-00-0");
        assert_eq!(ok.last_updated_time, 7);
        assert_eq!(ok.health_check_timeout_seconds, CHECK_TIMEOUT_SECONDS);
        let failed = device_health(
            "node-a",
            &device(LinkState::Failed, Some("1=DOWN/Disabled")),
            7,
        );
        assert_eq!(failed.health, api::HealthStatus::Unhealthy as i32);
        assert!(
            failed.message.contains("1=DOWN/Disabled"),
            "{}",
            failed.message
        );
        let unverified = device_health("node-a", &device(LinkState::Unverified, None), 7);
        assert_eq!(unverified.health, api::HealthStatus::Unknown as i32);
        assert!(RESEND.as_secs() as i64 * 3 <= CHECK_TIMEOUT_SECONDS);
    }
}
