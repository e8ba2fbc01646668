//! The plugin's side of one gRPC connection, with a way to hang it up.
//!
//! A ListAndWatch client that stops reading leaves its unsent list in the
//! HTTP/2 send buffer, where no stream-level action reaches it: ending the
//! stream only queues trailers behind the data. Closing the connection is
//! what frees it, so each accepted socket carries a [`Hangup`] that the
//! service finds in the request's extensions (tonic's `Connected` info).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_stream::{Stream, StreamExt};
use tonic::transport::server::Connected;

/// Closes the connection it was taken from; found in request extensions.
#[derive(Debug, Clone)]
pub struct Hangup(Arc<watch::Sender<bool>>);

impl Hangup {
    /// Makes every further read and write on the connection fail, so the
    /// server drops it and everything buffered for it.
    pub fn hang_up(&self) {
        self.0.send_replace(true);
    }
}

/// An accepted Unix-socket connection that can be hung up.
pub struct Conn {
    io: UnixStream,
    handle: Hangup,
    /// Resolves once [`Hangup::hang_up`] is called; polled with every I/O
    /// call so the connection task wakes for it even while idle.
    hung_up: Pin<Box<dyn Future<Output = ()> + Send>>,
    dead: bool,
}

impl Conn {
    fn new(io: UnixStream) -> Conn {
        let (tx, mut rx) = watch::channel(false);
        let hung_up = Box::pin(async move {
            let _ = rx.wait_for(|h| *h).await;
        });
        Conn {
            io,
            handle: Hangup(Arc::new(tx)),
            hung_up,
            dead: false,
        }
    }

    /// An error once hung up, checked before any I/O.
    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if !self.dead && self.hung_up.as_mut().poll(cx).is_ready() {
            self.dead = true;
        }
        if self.dead {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "hung up: a stream did not drain",
            ));
        }
        Ok(())
    }
}

/// The accepted connections of `listener`, each with its [`Hangup`].
pub fn incoming(listener: UnixListener) -> impl Stream<Item = io::Result<Conn>> {
    UnixListenerStream::new(listener).map(|r| r.map(Conn::new))
}

impl Connected for Conn {
    type ConnectInfo = Hangup;

    fn connect_info(&self) -> Hangup {
        self.handle.clone()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Err(e) = self.check(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if let Err(e) = self.check(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Err(e) = self.check(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
