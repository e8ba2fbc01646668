//! The device-plugin binary under test, started the way kubelet meets it:
//! beside a kubelet stand-in on a kubelet folder, serving a CDI folder.

use super::kubelet::Kubelet;
use super::published::Dirs;
use nodefabric::kubelet::socket;
use nodefabric::plugin::api::{self, device_plugin_client::DevicePluginClient};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use tonic::transport::Channel;
use tonic::Streaming;

/// How many resources the plugin registers with every family on.
pub const RESOURCES: usize = 3;

/// The plugin binary; killed on drop if a test did not stop it. Its stderr
/// is collected line by line as it runs, so a test can see what it logs
/// while idle.
pub struct Plugin {
    pub child: Child,
    pub kubelet_dir: PathBuf,
    pub log: Arc<Mutex<Vec<String>>>,
    pub reader: Option<std::thread::JoinHandle<()>>,
}

impl Plugin {
    pub fn start(kubelet_dir: &Path, cdi_dir: &Path, extra: &[&str]) -> Plugin {
        let mut child = Command::new(env!("CARGO_BIN_EXE_nodefabric-device-plugin"))
            .arg("--kubelet-dir")
            .arg(kubelet_dir)
            .arg("--cdi-dir")
            .arg(cdi_dir)
            .args(extra)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (log, reader) = super::os::collect_stderr(&mut child);
        Plugin {
            child,
            kubelet_dir: kubelet_dir.to_path_buf(),
            log,
            reader: Some(reader),
        }
    }

    /// A kubelet stand-in on `d`'s kubelet folder and the plugin (with
    /// `extra` flags) on `d`'s folders, before it registered.
    pub fn beside_kubelet(d: &Dirs, extra: &[&str]) -> (Kubelet, Plugin) {
        let kubelet = Kubelet::start(&d.kubelet());
        let plugin = Plugin::start(&d.kubelet(), &d.cdi(), extra);
        (kubelet, plugin)
    }

    /// [`Plugin::beside_kubelet`], once all [`RESOURCES`] registered.
    pub async fn registered(d: &Dirs, extra: &[&str]) -> (Kubelet, Plugin) {
        let (mut kubelet, plugin) = Plugin::beside_kubelet(d, extra);
        kubelet.registrations(RESOURCES).await;
        (kubelet, plugin)
    }

    pub async fn client(&self, socket: &str) -> DevicePluginClient<Channel> {
        DevicePluginClient::new(
            socket::connect(&self.kubelet_dir.join(socket))
                .await
                .unwrap(),
        )
    }

    /// Opens a ListAndWatch stream on `socket`, as kubelet does after registering.
    pub async fn watch(&self, socket: &str) -> Streaming<api::ListAndWatchResponse> {
        self.client(socket)
            .await
            .list_and_watch(api::Empty {})
            .await
            .unwrap()
            .into_inner()
    }

    /// Every line logged so far.
    pub fn log_lines(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// A field of /proc/PID/status in KiB (`VmRSS:`, `VmHWM:`).
    pub fn memory_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status.lines().find(|l| l.starts_with(field)).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    /// SIGTERM, then the exit status and everything logged.
    pub fn terminate(mut self) -> (std::process::ExitStatus, String) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().unwrap();
        self.reader.take().unwrap().join().unwrap();
        (status, self.log_lines().join("\n"))
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
