//! kubelet's DRA service: NodePrepareResources and NodeUnprepareResources,
//! served in `v1` and `v1beta1` over one [`Preparer`], which does the work.
//! This module only converts: kubelet's messages to claims, the call's
//! `grpc-timeout` to the Preparer's deadline, typed errors to the per-claim
//! `error` strings kubelet reads.

use super::claims::PreparedDevice;
use super::preparer::{ClaimRef, Preparer};
use std::sync::Arc;
use std::time::Duration;

/// The deadline kubelet's grpc-go sent as `grpc-timeout` (`<digits><unit>`,
/// at most 8 digits, unit `H M S m u n`), if any and well formed.
pub fn grpc_timeout(metadata: &tonic::metadata::MetadataMap) -> Option<Duration> {
    let value = metadata.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

impl From<PreparedDevice> for super::api::v1::Device {
    fn from(d: PreparedDevice) -> Self {
        Self {
            request_names: d.request_names,
            pool_name: d.pool_name,
            device_name: d.device_name,
            cdi_device_ids: d.cdi_device_ids,
            // Set only for a share of a shared NIC (consumable capacity):
            // kubelet keys the prepared device by it beside the claim.
            share_id: d.share_id,
        }
    }
}

impl From<PreparedDevice> for super::api::v1beta1::Device {
    /// v1beta1 has no `share_id`: kubelets that speak only v1beta1 (1.32,
    /// 1.33) predate consumable capacity, so no share reaches them.
    fn from(d: PreparedDevice) -> Self {
        Self {
            request_names: d.request_names,
            pool_name: d.pool_name,
            device_name: d.device_name,
            cdi_device_ids: d.cdi_device_ids,
        }
    }
}

/// The two API versions' services over one [`Preparer`]: their messages are
/// field for field the same (v1 adds a device's `share_id`), so one macro
/// writes both.
macro_rules! service {
    ($version:ident, $name:ident) => {
        /// The DRA service of this API version.
        pub struct $name(pub Arc<Preparer>);

        impl From<super::api::$version::Claim> for ClaimRef {
            fn from(c: super::api::$version::Claim) -> ClaimRef {
                ClaimRef {
                    namespace: c.namespace,
                    uid: c.uid,
                    name: c.name,
                }
            }
        }

        #[tonic::async_trait]
        impl super::api::$version::dra_plugin_server::DraPlugin for $name {
            async fn node_prepare_resources(
                &self,
                request: tonic::Request<super::api::$version::NodePrepareResourcesRequest>,
            ) -> Result<
                tonic::Response<super::api::$version::NodePrepareResourcesResponse>,
                tonic::Status,
            > {
                use super::api::$version as api;
                let deadline = grpc_timeout(request.metadata());
                let claims = request
                    .into_inner()
                    .claims
                    .into_iter()
                    .map(ClaimRef::from)
                    .collect();
                let claims = self
                    .0
                    .prepare(claims, deadline)
                    .await
                    .into_iter()
                    .map(|(uid, answer)| {
                        let one = match answer {
                            Ok(devices) => api::NodePrepareResourceResponse {
                                devices: devices.into_iter().map(api::Device::from).collect(),
                                error: String::new(),
                            },
                            Err(error) => api::NodePrepareResourceResponse {
                                devices: Vec::new(),
                                error: error.to_string(),
                            },
                        };
                        (uid, one)
                    })
                    .collect();
                Ok(tonic::Response::new(api::NodePrepareResourcesResponse {
                    claims,
                }))
            }

            async fn node_unprepare_resources(
                &self,
                request: tonic::Request<super::api::$version::NodeUnprepareResourcesRequest>,
            ) -> Result<
                tonic::Response<super::api::$version::NodeUnprepareResourcesResponse>,
                tonic::Status,
            > {
                use super::api::$version as api;
                let claims = request
                    .into_inner()
                    .claims
                    .into_iter()
                    .map(ClaimRef::from)
                    .collect();
                let claims = self
                    .0
                    .unprepare(claims)
                    .await
                    .into_iter()
                    .map(|(uid, answer)| {
                        let error = answer.err().map(|e| e.to_string()).unwrap_or_default();
                        (uid, api::NodeUnprepareResourceResponse { error })
                    })
                    .collect();
                Ok(tonic::Response::new(api::NodeUnprepareResourcesResponse {
                    claims,
                }))
            }
        }
    };
}

service!(v1, ServiceV1);
service!(v1beta1, ServiceV1beta1);

#[cfg(test)]
mod tests {
    use super::*;

    fn with(value: &str) -> tonic::metadata::MetadataMap {
        let mut m = tonic::metadata::MetadataMap::new();
        m.insert("grpc-timeout", value.parse().unwrap());
        m
    }

    #[test]
    fn kubelets_grpc_timeout_is_read_in_every_unit_and_a_bad_one_is_none() {
        assert_eq!(
            grpc_timeout(&with("44999931u")),
            Some(Duration::from_micros(44_999_931))
        );
        assert_eq!(grpc_timeout(&with("45S")), Some(Duration::from_secs(45)));
        assert_eq!(grpc_timeout(&with("2H")), Some(Duration::from_secs(7200)));
        assert_eq!(
            grpc_timeout(&with("300m")),
            Some(Duration::from_millis(300))
        );
        for bad in ["", "u", "123456789u", "12x", "-1S", "1.5S"] {
            let m = if bad.is_empty() {
                tonic::metadata::MetadataMap::new()
            } else {
                with(bad)
            };
            assert_eq!(grpc_timeout(&m), None, "{bad:?}");
        }
    }
}
