//! The DRA driver binary under test, started the way a DaemonSet runs it:
//! a kubelet root folder, the publisher's CDI folder, a state folder and a
//! kubeconfig for the API stand-in.
#![allow(dead_code)]

use super::apiserver::ApiServer;
use super::wait;
use nodefabric::dra::api::{v1, v1beta1};
use nodefabric::kubelet::socket;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tonic::transport::Channel;

/// The driver name the tests run with.
pub const DRIVER: &str = "rdma.gpustack.ai";

/// kubelet's deadline on each NodePrepareResources and NodeUnprepareResources
/// call: `defaultClientCallTimeout` in kubelet's `pkg/kubelet/cm/dra/plugin`
/// (1.34 to 1.36), one `context.WithTimeout` per call, which grpc-go sends
/// as `grpc-timeout` (docs/conformance.md).
pub const KUBELET_DRA_DEADLINE: Duration = Duration::from_secs(45);

/// Gives each call [`KUBELET_DRA_DEADLINE`], sent as `grpc-timeout`.
#[derive(Clone, Copy)]
pub struct KubeletDeadline;

impl tonic::service::Interceptor for KubeletDeadline {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        request.set_timeout(KUBELET_DRA_DEADLINE);
        Ok(request)
    }
}

/// A channel whose calls carry kubelet's deadline.
pub type AsKubelet = tonic::service::interceptor::InterceptedService<Channel, KubeletDeadline>;

/// Where one driver lives: its folders and its API access.
#[derive(Clone)]
pub struct Place {
    pub kubelet_root: PathBuf,
    pub cdi_dir: PathBuf,
    pub state_dir: PathBuf,
    pub kubeconfig: PathBuf,
    pub node: String,
}

impl Place {
    /// The registration socket kubelet's plugin watcher finds.
    pub fn registration(&self) -> PathBuf {
        self.kubelet_root
            .join("plugins_registry")
            .join(format!("{DRIVER}-reg.sock"))
    }

    /// The DRA service socket.
    pub fn service(&self) -> PathBuf {
        self.kubelet_root
            .join("plugins")
            .join(DRIVER)
            .join("dra.sock")
    }
}

/// The driver process; killed on drop. Its stderr is collected as it runs.
pub struct Driver {
    pub child: Child,
    pub place: Place,
    pub log: Arc<Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Driver {
    /// Starts the driver with `extra` flags (after the folder flags).
    pub fn start(place: &Place, extra: &[&str]) -> Driver {
        let mut child = Command::new(env!("CARGO_BIN_EXE_nodefabric-dra"))
            .arg("--node-name")
            .arg(&place.node)
            .arg("--kubelet-root-dir")
            .arg(&place.kubelet_root)
            .arg("--cdi-dir")
            .arg(&place.cdi_dir)
            .arg("--state-dir")
            .arg(&place.state_dir)
            .args(["--poll-interval", "100ms", "--api-timeout", "5s"])
            .args(extra)
            .env("KUBECONFIG", &place.kubeconfig)
            .env_remove("NODE_NAME")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (log, reader) = super::os::collect_stderr(&mut child);
        Driver {
            child,
            place: place.clone(),
            log,
            reader: Some(reader),
        }
    }

    /// Every line logged so far.
    pub fn log_lines(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// A v1 DRA client on the service socket, calling as kubelet does:
    /// authority `localhost`, each call with kubelet's deadline.
    pub async fn v1(&self) -> v1::dra_plugin_client::DraPluginClient<AsKubelet> {
        v1::dra_plugin_client::DraPluginClient::with_interceptor(
            socket::connect(&self.place.service()).await.unwrap(),
            KubeletDeadline,
        )
    }

    /// A v1beta1 DRA client on the service socket, as [`Driver::v1`].
    pub async fn v1beta1(&self) -> v1beta1::dra_plugin_client::DraPluginClient<AsKubelet> {
        v1beta1::dra_plugin_client::DraPluginClient::with_interceptor(
            socket::connect(&self.place.service()).await.unwrap(),
            KubeletDeadline,
        )
    }

    /// SIGKILL: nothing is cleaned up, the sockets stay.
    pub fn kill9(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.reader.take().unwrap().join().unwrap();
        self.log_lines().join("\n")
    }

    /// SIGTERM, then the exit status and everything logged.
    pub fn terminate(mut self) -> (std::process::ExitStatus, String) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().unwrap();
        self.reader.take().unwrap().join().unwrap();
        (status, self.log_lines().join("\n"))
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // A failed wait or assertion shows what the driver said meanwhile.
        if std::thread::panicking() {
            eprintln!("driver log:\n{}", self.log_lines().join("\n"));
        }
    }
}

/// How many reconciles the drivers on `api` have begun: each first lists
/// its node's ResourceSlices, once.
pub fn reconciles(api: &ApiServer) -> usize {
    api.log()
        .iter()
        .filter(|l| l.method == "GET" && l.path.ends_with("/resourceslices"))
        .count()
}

/// Waits until `n` reconciles after the `since`th have run to their end
/// (the one after them has begun): what a test waits for before it
/// asserts that the driver wrote nothing meanwhile.
pub fn reconciled(api: &ApiServer, since: usize, n: usize) {
    wait::until(
        &format!("{n} more reconciles after {since}"),
        || reconciles(api),
        |&begun| begun > since + n,
    );
}

/// A Place in `dir` for `node`, with the CDI folder `cdi_dir`.
pub fn place(dir: &Path, cdi_dir: &Path, kubeconfig: &Path, node: &str) -> Place {
    Place {
        kubelet_root: dir.join("kubelet-root"),
        cdi_dir: cdi_dir.to_path_buf(),
        state_dir: dir.join("dra-state"),
        kubeconfig: kubeconfig.to_path_buf(),
        node: node.to_string(),
    }
}

/// An API stand-in with one Node, the 8-GPU fixture published, and a
/// driver's place on that node: what every DRA test starts from.
pub struct Setup {
    pub cluster: super::cluster::Cluster,
    pub dirs: super::published::Dirs,
    pub place: Place,
    _tmp: tempfile::TempDir,
}

impl Setup {
    /// The Node `node`, the 8-GPU fixture published, its driver not started.
    pub fn new(node: &str) -> Setup {
        Setup::on(node, "gpu8", super::fixtures::gpu8_switch_paired)
    }

    /// [`Setup::new`] with the fixture `fixture` published instead.
    pub fn on<T>(node: &str, name: &str, fixture: impl FnOnce(&Path) -> T) -> Setup {
        let tmp = tempfile::tempdir().unwrap();
        let cluster = super::cluster::Cluster::start(tmp.path());
        cluster.api.add_node(node);
        let dirs = super::published::Dirs::published(name, fixture);
        let place = place(tmp.path(), &dirs.cdi(), &cluster.dra_kubeconfig, node);
        Setup {
            cluster,
            dirs,
            place,
            _tmp: tmp,
        }
    }
}
