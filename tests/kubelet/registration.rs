//! The registration socket as kubelet's plugin watcher dials it: grpc-go's
//! escaped socket path as `:authority`, Huffman-coded and then indexed on
//! one connection (see `src/kubelet/authority.rs` for why a front is
//! needed). A real tonic `Registration` server on a real Unix socket, and a
//! client that writes kubelet's bytes (`support::grpcgo`), since the `http`
//! crate refuses to build such a request.

use crate::support::grpcgo::{self, Answer, GoConn, PROTOCOL_ERROR};
use crate::support::wait::within;
use nodefabric::kubelet::registration_api::{
    registration_server::{Registration, RegistrationServer},
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use nodefabric::kubelet::servers::{Front, Servers};
use prost::Message;
use std::path::PathBuf;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::mpsc;
use tonic::service::Routes;
use tonic::{Request, Response, Status};

const GET_INFO: &str = "/pluginregistration.Registration/GetInfo";
const NOTIFY: &str = "/pluginregistration.Registration/NotifyRegistrationStatus";

/// What a DRA driver answers GetInfo with.
fn info() -> PluginInfo {
    PluginInfo {
        r#type: "DRAPlugin".into(),
        name: "rdma.gpustack.ai".into(),
        endpoint: "/var/lib/kubelet/plugins/rdma.gpustack.ai/dra.sock".into(),
        supported_versions: vec!["v1.DRAPlugin".into(), "v1beta1.DRAPlugin".into()],
    }
}

/// A `Registration` service that hands each status kubelet reports to the test.
struct Driver(mpsc::UnboundedSender<RegistrationStatus>);

#[tonic::async_trait]
impl Registration for Driver {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(info()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let _ = self.0.send(request.into_inner());
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// A registration socket in `plugins_registry/` of a temp kubelet root,
/// served with or without the front.
struct Socket {
    path: PathBuf,
    statuses: mpsc::UnboundedReceiver<RegistrationStatus>,
    _servers: Servers,
    _root: tempfile::TempDir,
}

fn serve(fronted: bool) -> Socket {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("plugins_registry");
    std::fs::create_dir(&dir).unwrap();
    let path = dir.join("rdma.gpustack.ai-reg.sock");
    let (tx, statuses) = mpsc::unbounded_channel();
    let routes = Routes::new(RegistrationServer::new(Driver(tx)));
    let mut servers = Servers::default();
    let front = match fronted {
        true => Front::Authority,
        false => Front::Hangup,
    };
    servers
        .serve(&path, None, "registration", front, routes)
        .unwrap();
    Socket {
        path,
        statuses,
        _servers: servers,
        _root: root,
    }
}

async fn call(conn: &mut GoConn, path: &str, message: &[u8]) -> Answer {
    within(path, conn.call(path, message)).await.unwrap()
}

/// The reply of a call that must succeed.
fn ok(answer: Answer) -> Vec<u8> {
    match answer {
        Answer::Done { status, message } if status == "0" => message,
        other => panic!("not answered: {other:?}"),
    }
}

#[tokio::test]
async fn the_front_answers_kubelets_authority_on_one_connection() {
    let mut socket = serve(true);
    let mut conn = GoConn::dial(&socket.path).await.unwrap();
    let escaped = conn.authority().to_string();
    assert!(escaped.starts_with("%2F"), "{escaped}");
    assert!(
        escaped.ends_with("%2Fplugins_registry%2Frdma.gpustack.ai-reg.sock"),
        "{escaped}"
    );
    // kubelet's watcher calls GetInfo, reports, and a restarted watcher
    // calls again; from the second call on the authority is an index.
    for i in 0..3 {
        let reply = ok(call(&mut conn, GET_INFO, &[]).await);
        assert_eq!(PluginInfo::decode(&reply[..]).unwrap(), info(), "call {i}");
    }
    let status = RegistrationStatus {
        plugin_registered: false,
        error: "kubelet says no".into(),
    };
    let reply = ok(call(&mut conn, NOTIFY, &status.encode_to_vec()).await);
    assert_eq!(
        RegistrationStatusResponse::decode(&reply[..]).unwrap(),
        RegistrationStatusResponse {}
    );
    assert_eq!(socket.statuses.recv().await.unwrap(), status);
    for _ in 0..2 {
        let reply = ok(call(&mut conn, GET_INFO, &[]).await);
        assert_eq!(PluginInfo::decode(&reply[..]).unwrap(), info());
    }
}

/// If this starts failing, h2 (or `http`) accepts kubelet's authority and
/// the front may be retired: serve the registration socket with
/// `Front::Hangup` and delete `kubelet::authority`.
#[tokio::test]
async fn a_bare_tonic_server_still_resets_kubelets_authority() {
    let socket = serve(false);
    let mut conn = GoConn::dial(&socket.path).await.unwrap();
    assert_eq!(
        call(&mut conn, GET_INFO, &[]).await,
        Answer::Reset(PROTOCOL_ERROR)
    );
    // The very same request with kubelet's other authority is answered, so
    // the authority alone is what h2 refuses.
    let mut conn = GoConn::dial_as(&socket.path, "localhost").await.unwrap();
    let reply = ok(call(&mut conn, GET_INFO, &[]).await);
    assert_eq!(PluginInfo::decode(&reply[..]).unwrap(), info());
}

#[tokio::test]
async fn garbage_closes_only_its_own_connection() {
    let socket = serve(true);
    let mut healthy = GoConn::dial(&socket.path).await.unwrap();
    ok(call(&mut healthy, GET_INFO, &[]).await);
    let oversize = {
        let mut bytes = grpcgo::PREFACE.to_vec();
        bytes.extend(grpcgo::header_frames(
            1,
            &[0x82; 70 * 1024],
            false,
            grpcgo::FRAME_SIZE,
        ));
        bytes
    };
    let bad_hpack = {
        let mut bytes = grpcgo::PREFACE.to_vec();
        bytes.extend(grpcgo::header_frames(
            1,
            &[0xff, 0x00],
            true,
            grpcgo::FRAME_SIZE,
        ));
        bytes
    };
    for input in [b"GET / HTTP/1.1\r\n\r\n".to_vec(), oversize, bad_hpack] {
        let mut raw = UnixStream::connect(&socket.path).await.unwrap();
        // The front may close before it has read everything.
        let _ = raw.write_all(&input).await;
        let mut rest = Vec::new();
        let _ = within("the front to hang up", raw.read_to_end(&mut rest)).await;
    }
    // The first connection, and a new one, are still answered.
    let reply = ok(call(&mut healthy, GET_INFO, &[]).await);
    assert_eq!(PluginInfo::decode(&reply[..]).unwrap(), info());
    let mut again = GoConn::dial(&socket.path).await.unwrap();
    ok(call(&mut again, GET_INFO, &[]).await);
}
