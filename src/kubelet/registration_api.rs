//! The generated kubelet plugin-registration API (`pluginregistration`,
//! "v1"): what kubelet's plugin watcher calls on a socket in
//! `plugins_registry/`, server and client.
#![allow(missing_docs, clippy::all)]

tonic::include_proto!("pluginregistration");
