//! The one loop both kubelet plugins run; each fills it in through
//! [`KubeletPlugin`] with what it serves, registers and reloads.
//!
//! In order:
//! 1. the probe server, first, so a taken port fails the start naming
//!    `--metrics-addr`;
//! 2. the plugin's own start (the DRA driver's API client and checkpoint);
//! 3. the folder watch over the plugin's folders, with the poll fallback;
//! 4. the loop: each wake (a file event, the poll tick, the plugin's own
//!    timers and verdicts) looks at the files off the runtime thread, checks
//!    kubelet's folders were not deleted under the mount, and lets the
//!    plugin serve, register or reconcile what the look left due;
//! 5. on the shutdown signal, even while the plugin waits on kubelet, the
//!    plugin's own stop (its sockets removed).

use super::probes::{self, ProbeError, Probes};
use super::watch::{FolderWatch, Wake};
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};

/// Why the loop stopped before a shutdown signal; each plugin's own stop
/// reasons wrap these.
#[derive(Debug, thiserror::Error)]
pub enum LoopError {
    /// The probe server could not listen (names the address).
    #[error("--metrics-addr {0}")]
    Probes(ProbeError),
    /// The look at the files panicked or was cancelled.
    #[error("reading the CDI specs in {path}: {cause}")]
    Look {
        /// The CDI folder.
        path: PathBuf,
        /// What the blocking task's join said.
        cause: tokio::task::JoinError,
    },
}

/// What the folder watch wakes for: whole folders, and the names in them
/// that can change what a plugin serves.
#[derive(Debug, Clone, Default)]
pub struct Watched {
    /// The folders watched (created, deleted, renamed).
    pub folders: Vec<PathBuf>,
    /// The full paths of the files whose events wake the loop.
    pub files: Vec<PathBuf>,
}

/// The file reads of one look, run on a blocking thread.
pub type Look<S> = Box<dyn FnOnce() -> S + Send + 'static>;

/// What a kubelet plugin fills the loop in with. Its methods run on the
/// loop's task, one at a time, so the plugin's state needs no lock.
pub trait KubeletPlugin {
    /// The plugin's own stop reasons; the loop's are among them.
    type Error: From<LoopError>;
    /// What a look read, carried back from the blocking thread.
    type Seen: Send + 'static;

    /// The CDI folder, named when a look fails.
    fn cdi_dir(&self) -> &Path;
    /// The folders and files whose events wake the loop.
    fn watched(&self) -> Watched;
    /// How often the loop wakes when no file event comes.
    fn poll_interval(&self) -> Duration;
    /// kubelet's folders the plugin serves sockets in: one deleted on the
    /// host while mounted here hides the plugin from kubelet for good.
    fn kubelet_folders(&self) -> Vec<PathBuf>;
    /// What the wake's file events say before the look (the device plugin
    /// takes a created `kubelet.sock`); nothing by default.
    fn noticed(&mut self, _watch: &FolderWatch) {}
    /// The reads of one look; file I/O must never stall the gRPC servers.
    fn look(&mut self) -> Look<Self::Seen>;
    /// Takes in what the look read and, when a kubelet folder was deleted
    /// under the mount, why the plugin is stale.
    fn looked(&mut self, seen: Self::Seen, kubelet_stale: Option<String>);
    /// Serves, registers or reconciles what is due after the look; failures
    /// are the plugin's to log and retry. Dropped unfinished when the
    /// shutdown signal comes first.
    fn keep_current(&mut self) -> impl Future<Output = ()>;
    /// Resolves on the plugin's own wakes (a backoff ended, an interval
    /// ticked, kubelet's verdict); cancelled at every other wake, so it
    /// must be cancel-safe.
    fn wake(&mut self) -> impl Future<Output = ()>;
    /// Stops what the plugin serves, in its order (its sockets removed).
    fn stop(self);
}

/// Runs a plugin until `shutdown` resolves: the probes (when `probes` names
/// an address) from `start`'s beginning, then the plugin `start` makes, in
/// the loop described above.
pub async fn run<P, R, S>(
    probes: Option<(SocketAddr, Arc<R>)>,
    start: S,
    shutdown: impl Future<Output = ()>,
) -> Result<(), P::Error>
where
    P: KubeletPlugin,
    R: Probes,
    S: Future<Output = Result<P, P::Error>>,
{
    // Held to the end; the runtime's end stops the server.
    let _probes = match probes {
        Some((addr, answers)) => Some(
            probes::serve(addr, answers)
                .await
                .map_err(LoopError::Probes)?,
        ),
        None => None,
    };
    let mut plugin = start.await?;
    let mut folders = watch(&plugin);
    tokio::pin!(shutdown);
    loop {
        folders.rearm();
        plugin.noticed(&folders);
        // Look first so a fresh registration starts from the current files.
        look(&mut plugin).await?;
        // A signal stops a registration kubelet does not answer (Register
        // has no deadline): the plugin's partial work is dropped, its
        // sockets with it, and its stop runs as after any wake.
        tokio::select! {
            _ = &mut shutdown => break,
            _ = plugin.keep_current() => {}
        }
        tokio::select! {
            _ = &mut shutdown => break,
            wake = folders.next() => if wake == Wake::Event {
                folders.settle().await;
            },
            _ = plugin.wake() => {}
        }
    }
    info!("shutting down");
    plugin.stop();
    Ok(())
}

/// The plugin's folder watch; without inotify the poll does its work.
fn watch<P: KubeletPlugin>(plugin: &P) -> FolderWatch {
    let Watched { folders, files } = plugin.watched();
    let folders: Vec<&Path> = folders.iter().map(PathBuf::as_path).collect();
    let poll = plugin.poll_interval();
    let (watch, error) = FolderWatch::new(&folders, files, poll);
    if let Some(e) = error {
        warn!("file watching unavailable, polling every {poll:?}: {e}");
    }
    watch
}

/// One look off the runtime thread, then the kubelet folders' check: a
/// socket served in the host's old folder is never found by kubelet, and a
/// new `kubelet.sock` in the new one is never seen through the old mount.
async fn look<P: KubeletPlugin>(plugin: &mut P) -> Result<(), LoopError> {
    let reads = plugin.look();
    let kubelet_folders = plugin.kubelet_folders();
    let (seen, stale) = tokio::task::spawn_blocking(move || {
        let seen = reads();
        (seen, stale_kubelet_folder(&kubelet_folders))
    })
    .await
    .map_err(|cause| LoopError::Look {
        path: plugin.cdi_dir().to_path_buf(),
        cause,
    })?;
    plugin.looked(seen, stale);
    Ok(())
}

/// Why the first of `folders` deleted on the host while mounted here makes
/// the plugin stale; `None` while all are in place.
fn stale_kubelet_folder(folders: &[PathBuf]) -> Option<String> {
    let what = match folders.len() {
        1 => "the kubelet folder",
        _ => "a kubelet folder",
    };
    let named: Vec<(&str, &Path)> = folders.iter().map(|f| (what, f.as_path())).collect();
    crate::publish::stale_folder(&named)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Alive, ready, no metrics: the loop's probes need some answers.
    struct Quiet;

    impl Probes for Quiet {
        type Unhealthy = std::convert::Infallible;
        fn healthy(&self) -> Result<(), Self::Unhealthy> {
            Ok(())
        }
        fn ready(&self) -> Result<(), Vec<String>> {
            Ok(())
        }
        fn metrics(&self) -> String {
            "# EOF\n".into()
        }
    }

    /// Counts its looks and keeps; the test stops it after a few.
    struct Counting {
        dir: tempfile::TempDir,
        looks: Arc<AtomicUsize>,
        kept: Arc<AtomicUsize>,
        stale: Option<Option<String>>,
        stopped: Arc<AtomicUsize>,
        panic: bool,
        /// keep_current never ends, like a Register kubelet never answers.
        hang: bool,
    }

    impl KubeletPlugin for Counting {
        type Error = LoopError;
        type Seen = usize;

        fn cdi_dir(&self) -> &Path {
            self.dir.path()
        }
        fn watched(&self) -> Watched {
            Watched {
                folders: vec![self.dir.path().into()],
                files: vec![self.dir.path().join("spec.json")],
            }
        }
        fn poll_interval(&self) -> Duration {
            Duration::from_millis(10)
        }
        fn kubelet_folders(&self) -> Vec<PathBuf> {
            vec![self.dir.path().into()]
        }
        fn look(&mut self) -> Look<usize> {
            let looks = self.looks.clone();
            let panic = self.panic;
            Box::new(move || {
                assert!(!panic, "a look that panics");
                looks.fetch_add(1, Ordering::SeqCst) + 1
            })
        }
        fn looked(&mut self, _seen: usize, kubelet_stale: Option<String>) {
            self.stale = Some(kubelet_stale);
        }
        async fn keep_current(&mut self) {
            self.kept.fetch_add(1, Ordering::SeqCst);
            if self.hang {
                std::future::pending::<()>().await
            }
        }
        async fn wake(&mut self) {
            std::future::pending::<()>().await
        }
        fn stop(self) {
            assert_eq!(self.stale, Some(None), "the folder is in place");
            self.stopped.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// The plugin, and its counts of looks, keeps and stops.
    type Counts = (Arc<AtomicUsize>, Arc<AtomicUsize>, Arc<AtomicUsize>);

    fn counting(panic: bool, hang: bool) -> (Counting, Counts) {
        let looks = Arc::new(AtomicUsize::new(0));
        let kept = Arc::new(AtomicUsize::new(0));
        let stopped = Arc::new(AtomicUsize::new(0));
        let plugin = Counting {
            dir: tempfile::tempdir().unwrap(),
            looks: looks.clone(),
            kept: kept.clone(),
            stale: None,
            stopped: stopped.clone(),
            panic,
            hang,
        };
        (plugin, (looks, kept, stopped))
    }

    #[tokio::test]
    async fn the_loop_looks_on_every_wake_and_stops_the_plugin_on_shutdown() {
        let (plugin, (looks, kept, stopped)) = counting(false, false);
        let seen = looks.clone();
        // Shut down once the poll tick has made a few looks.
        let shutdown = async move {
            while seen.load(Ordering::SeqCst) < 3 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        run(
            None::<(SocketAddr, Arc<Quiet>)>,
            async { Ok(plugin) },
            shutdown,
        )
        .await
        .unwrap();
        assert!(looks.load(Ordering::SeqCst) >= 3);
        assert!(kept.load(Ordering::SeqCst) >= 2, "kept after each look");
        assert_eq!(stopped.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_taken_probe_port_or_a_look_that_panics_stops_the_loop_with_its_name() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let (plugin, (looks, _, _)) = counting(false, false);
        let e = run(
            Some((addr, Arc::new(Quiet))),
            async { Ok(plugin) },
            std::future::pending(),
        )
        .await
        .unwrap_err();
        assert!(
            e.to_string()
                .starts_with(&format!("--metrics-addr {addr}: cannot listen")),
            "{e}"
        );
        assert_eq!(looks.load(Ordering::SeqCst), 0, "nothing ran");

        let (plugin, (_, _, stopped)) = counting(true, false);
        let dir = plugin.dir.path().to_path_buf();
        let e = run(
            None::<(SocketAddr, Arc<Quiet>)>,
            async { Ok(plugin) },
            std::future::pending(),
        )
        .await
        .unwrap_err();
        assert!(
            e.to_string()
                .starts_with(&format!("reading the CDI specs in {}: ", dir.display())),
            "{e}"
        );
        assert_eq!(stopped.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_signal_stops_the_plugin_while_kubelet_does_not_answer() {
        let (plugin, (looks, kept, stopped)) = counting(false, true);
        let stuck = kept.clone();
        // The signal comes once the plugin is stuck in keep_current.
        let shutdown = async move {
            while stuck.load(Ordering::SeqCst) < 1 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(
            Duration::from_secs(60),
            run(
                None::<(SocketAddr, Arc<Quiet>)>,
                async { Ok(plugin) },
                shutdown,
            ),
        )
        .await
        .expect("the signal ends the loop")
        .unwrap();
        assert_eq!(looks.load(Ordering::SeqCst), 1);
        assert_eq!(kept.load(Ordering::SeqCst), 1);
        assert_eq!(stopped.load(Ordering::SeqCst), 1);
    }
}
