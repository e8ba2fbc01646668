//! The generated kubelet device-plugin API (v1beta1): messages, the
//! `DevicePlugin` server/client and the `Registration` server/client.
#![allow(missing_docs, clippy::all)]

tonic::include_proto!("v1beta1");
