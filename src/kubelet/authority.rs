//! An HTTP/2 front for the registration socket: it rewrites the client's
//! `:authority` to `localhost` so that tonic can answer kubelet at all.
//!
//! kubelet's plugin watcher dials a socket it finds in
//! `<kubelet-root>/plugins_registry/` by its path, so grpc-go derives the
//! HTTP/2 `:authority` from the target and escapes it: a DRA driver's
//! registration socket is called with `:authority`
//! `%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2F<driver>-reg.sock`. The
//! `http` crate refuses a `%` outside userinfo, so h2 (0.4) resets every such
//! stream with PROTOCOL_ERROR before tonic sees it (the control test in
//! `tests/kubelet/registration.rs` keeps watching that). kubelet dials the
//! DRA service socket itself with `localhost`; only this socket needs a front.
//!
//! The front sits in the same process between the Unix connection and an
//! in-memory duplex that tonic serves. Every frame passes through untouched
//! except the client's header blocks (HEADERS and their CONTINUATION frames):
//! grpc-go Huffman-codes the authority and adds it to the HPACK dynamic
//! table, so later calls on the connection send a one-byte index, and a
//! block may be split at 16 KiB. The front therefore decodes each block with
//! one decoder per connection (mirroring the client's table), re-encodes it
//! as literals without indexing (so the server's table stays empty and the
//! two never disagree) with `:authority: localhost`, and sends it as one
//! HEADERS frame, or HEADERS plus CONTINUATION past 16 KiB, the frame size
//! every HTTP/2 peer must accept. PADDED and PRIORITY are dropped with their
//! fields; END_STREAM is kept. Frames in the other direction are copied.
//!
//! A header block is capped at 64 KiB on the wire and when decoded; a bad
//! preface, a bad HPACK block or broken framing closes that connection with
//! a log line naming the socket, and nothing else.

use loona_hpack::decoder::DecoderError;
use loona_hpack::encoder::encode_integer_into;
use loona_hpack::Decoder;
use std::io;
use std::path::Path;
use std::pin::pin;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::wrappers::UnixListenerStream;
use tokio_stream::{Stream, StreamExt};
use tracing::{debug, warn};

/// The largest header block the front takes, on the wire and decoded.
pub const MAX_HEADER_BLOCK: usize = 64 * 1024;
/// What the server sees as `:authority`: what kubelet sends its other sockets.
pub const AUTHORITY: &[u8] = b"localhost";
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// The frame size every HTTP/2 peer accepts (RFC 9113 §4.2), so the front
/// need not read the server's SETTINGS to split a block.
const FRAME_SIZE: usize = 16 * 1024;
/// The client's HPACK table may not grow past the server's
/// SETTINGS_HEADER_TABLE_SIZE, which tonic leaves at the default.
const HEADER_TABLE_SIZE: usize = 4096;
/// Room in the duplex: a frame or two each way.
const DUPLEX_BUFFER: usize = 64 * 1024;

const HEADERS: u8 = 0x1;
const PUSH_PROMISE: u8 = 0x5;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// Why the front closed a client connection.
#[derive(Debug, thiserror::Error)]
pub enum FrontError {
    /// The connection did not start with the HTTP/2 client preface.
    #[error("not an HTTP/2 client preface")]
    Preface,
    /// A header block passed [`MAX_HEADER_BLOCK`].
    #[error("header block of stream {stream} is over {MAX_HEADER_BLOCK} bytes")]
    TooLarge {
        /// The stream the block opens.
        stream: u32,
    },
    /// HPACK could not decode a header block.
    #[error("header block of stream {stream}: {cause}")]
    Hpack {
        /// The stream the block opens.
        stream: u32,
        /// What the decoder said.
        cause: DecoderError,
    },
    /// A HEADERS frame's padding or priority fields overrun it.
    #[error("HEADERS of stream {stream}: padding or priority longer than the frame")]
    Padding {
        /// The stream of the frame.
        stream: u32,
    },
    /// Another frame came between HEADERS and its last CONTINUATION.
    #[error("frame type {kind} on stream {stream} inside the header block of stream {open}")]
    Interleaved {
        /// The type of the frame that came.
        kind: u8,
        /// Its stream.
        stream: u32,
        /// The stream whose block was open.
        open: u32,
    },
    /// CONTINUATION with no header block open.
    #[error("CONTINUATION on stream {stream} with no header block open")]
    Orphan {
        /// The stream of the frame.
        stream: u32,
    },
    /// HEADERS on stream 0, or PUSH_PROMISE, which a client never sends.
    #[error("frame type {kind} on stream {stream} is not a client's")]
    NotAClientFrame {
        /// The type of the frame.
        kind: u8,
        /// Its stream.
        stream: u32,
    },
    /// The client hung up in the middle of a frame or a header block.
    #[error("connection closed inside a frame")]
    Truncated,
}

/// Where the rewriter is in the client's byte stream.
#[derive(Debug, Clone, Copy)]
enum State {
    Preface,
    FrameHead,
    /// This many payload bytes of a frame that passes through are left.
    Passing(usize),
    /// The payload of a HEADERS or CONTINUATION frame is being gathered.
    Payload(Head),
}

#[derive(Debug, Clone, Copy)]
struct Head {
    len: usize,
    kind: u8,
    flags: u8,
    stream: u32,
}

/// A header block whose END_HEADERS has not come yet.
struct Block {
    stream: u32,
    end_stream: bool,
    fragment: Vec<u8>,
    /// Payload bytes of its frames so far, padding included.
    received: usize,
}

/// The client-to-server half of the front, as a pure byte transformer: one
/// per connection, since the HPACK table lives as long as the connection.
pub struct Rewriter {
    decoder: Decoder<'static>,
    state: State,
    /// A partial preface, frame head or header-frame payload.
    partial: Vec<u8>,
    block: Option<Block>,
}

impl Default for Rewriter {
    fn default() -> Rewriter {
        let mut decoder = Decoder::new();
        decoder.set_max_allowed_table_size(HEADER_TABLE_SIZE);
        Rewriter {
            decoder,
            state: State::Preface,
            partial: Vec::new(),
            block: None,
        }
    }
}

impl Rewriter {
    /// Takes the next bytes from the client, in any pieces, and appends what
    /// the server is to get to `out`.
    pub fn feed(&mut self, mut input: &[u8], out: &mut Vec<u8>) -> Result<(), FrontError> {
        while !input.is_empty() {
            match self.state {
                State::Preface => {
                    let whole = self.gather(&mut input, PREFACE.len());
                    // Refused at the first wrong byte, not after 24.
                    if !PREFACE.starts_with(&self.partial) {
                        return Err(FrontError::Preface);
                    }
                    if !whole {
                        continue;
                    }
                    out.extend_from_slice(PREFACE);
                    self.partial.clear();
                    self.state = State::FrameHead;
                }
                State::FrameHead => {
                    if !self.gather(&mut input, 9) {
                        continue;
                    }
                    let p = &self.partial;
                    let head = Head {
                        len: u32::from_be_bytes([0, p[0], p[1], p[2]]) as usize,
                        kind: p[3],
                        flags: p[4],
                        stream: u32::from_be_bytes([p[5], p[6], p[7], p[8]]) & 0x7fff_ffff,
                    };
                    self.head(head, out)?;
                }
                State::Passing(left) => {
                    let n = left.min(input.len());
                    out.extend_from_slice(&input[..n]);
                    input = &input[n..];
                    self.state = match left - n {
                        0 => State::FrameHead,
                        left => State::Passing(left),
                    };
                }
                State::Payload(head) => {
                    if !self.gather(&mut input, head.len) {
                        continue;
                    }
                    let payload = std::mem::take(&mut self.partial);
                    self.header_frame(head, &payload, out)?;
                    self.state = State::FrameHead;
                }
            }
        }
        Ok(())
    }

    /// Whether the client may hang up here: not inside a frame or a block.
    pub fn finish(&self) -> Result<(), FrontError> {
        match self.state {
            State::FrameHead if self.partial.is_empty() && self.block.is_none() => Ok(()),
            // A connection that never spoke.
            State::Preface if self.partial.is_empty() => Ok(()),
            _ => Err(FrontError::Truncated),
        }
    }

    /// Moves bytes from `input` until `partial` holds `want`; whether it does.
    fn gather(&mut self, input: &mut &[u8], want: usize) -> bool {
        let n = (want - self.partial.len()).min(input.len());
        self.partial.extend_from_slice(&input[..n]);
        *input = &input[n..];
        self.partial.len() == want
    }

    /// Decides what becomes of a frame once its head is in `partial`.
    fn head(&mut self, head: Head, out: &mut Vec<u8>) -> Result<(), FrontError> {
        if let Some(open) = &self.block {
            if head.kind != CONTINUATION || head.stream != open.stream {
                return Err(FrontError::Interleaved {
                    kind: head.kind,
                    stream: head.stream,
                    open: open.stream,
                });
            }
        }
        let received = match (head.kind, &self.block) {
            (HEADERS, _) if head.stream != 0 => 0,
            (CONTINUATION, Some(open)) => open.received,
            (CONTINUATION, None) => {
                return Err(FrontError::Orphan {
                    stream: head.stream,
                })
            }
            (HEADERS | PUSH_PROMISE, _) => {
                return Err(FrontError::NotAClientFrame {
                    kind: head.kind,
                    stream: head.stream,
                })
            }
            _ => {
                out.extend_from_slice(&self.partial);
                self.partial.clear();
                self.state = match head.len {
                    0 => State::FrameHead,
                    len => State::Passing(len),
                };
                return Ok(());
            }
        };
        // Checked before a byte of the payload is kept.
        if received + head.len > MAX_HEADER_BLOCK {
            return Err(FrontError::TooLarge {
                stream: self.block.as_ref().map_or(head.stream, |b| b.stream),
            });
        }
        self.partial.clear();
        if head.len == 0 {
            return self.header_frame(head, &[], out);
        }
        self.state = State::Payload(head);
        Ok(())
    }

    /// Adds a whole HEADERS or CONTINUATION payload to the open block, and
    /// sends the block on once it ends.
    fn header_frame(
        &mut self,
        head: Head,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), FrontError> {
        if head.kind == HEADERS {
            let pad_len = if head.flags & PADDED != 0 {
                *payload.first().ok_or(FrontError::Padding {
                    stream: head.stream,
                })? as usize
            } else {
                0
            };
            let start = usize::from(head.flags & PADDED != 0)
                + if head.flags & PRIORITY != 0 { 5 } else { 0 };
            let end = payload
                .len()
                .checked_sub(pad_len)
                .filter(|&end| end >= start)
                .ok_or(FrontError::Padding {
                    stream: head.stream,
                })?;
            self.block = Some(Block {
                stream: head.stream,
                end_stream: head.flags & END_STREAM != 0,
                fragment: payload[start..end].to_vec(),
                received: payload.len(),
            });
        } else if let Some(block) = &mut self.block {
            block.fragment.extend_from_slice(payload);
            block.received += payload.len();
        }
        if head.flags & END_HEADERS == 0 {
            return Ok(());
        }
        let Some(block) = self.block.take() else {
            return Ok(());
        };
        let encoded = self.reencode(&block)?;
        emit(&block, &encoded, out);
        Ok(())
    }

    /// The block decoded against the client's table, as literals without
    /// indexing, with the authority replaced.
    fn reencode(&mut self, block: &Block) -> Result<Vec<u8>, FrontError> {
        let mut encoded = Vec::with_capacity(block.fragment.len() * 2);
        // RFC 7541 §4.1 sizes: a block of one-byte indexes into a large
        // table entry would otherwise decode to far more than it weighs.
        let mut size = 0;
        self.decoder
            .decode_with_cb(&block.fragment, |name, value| {
                let value = if &*name == b":authority" {
                    AUTHORITY
                } else {
                    &value
                };
                size += name.len() + value.len() + 32;
                if size <= MAX_HEADER_BLOCK {
                    encoded.push(0);
                    literal(&mut encoded, &name);
                    literal(&mut encoded, value);
                }
            })
            .map_err(|cause| FrontError::Hpack {
                stream: block.stream,
                cause,
            })?;
        if size > MAX_HEADER_BLOCK {
            return Err(FrontError::TooLarge {
                stream: block.stream,
            });
        }
        Ok(encoded)
    }
}

/// An HPACK string literal, not Huffman-coded.
fn literal(out: &mut Vec<u8>, s: &[u8]) {
    // Writing to a Vec cannot fail.
    let _ = encode_integer_into(s.len(), 7, 0, out);
    out.extend_from_slice(s);
}

/// `encoded` as HEADERS, then CONTINUATION frames past [`FRAME_SIZE`].
fn emit(block: &Block, encoded: &[u8], out: &mut Vec<u8>) {
    let mut chunks = encoded.chunks(FRAME_SIZE).peekable();
    let mut kind = HEADERS;
    let mut flags = if block.end_stream { END_STREAM } else { 0 };
    loop {
        let chunk = chunks.next().unwrap_or_default();
        if chunks.peek().is_none() {
            flags |= END_HEADERS;
        }
        out.extend_from_slice(&(chunk.len() as u32).to_be_bytes()[1..]);
        out.extend([kind, flags]);
        out.extend(block.stream.to_be_bytes());
        out.extend_from_slice(chunk);
        if flags & END_HEADERS != 0 {
            return;
        }
        (kind, flags) = (CONTINUATION, 0);
    }
}

/// The accepted connections of `listener`, each behind its own front: the
/// server ends to give tonic's `serve_with_incoming`. `socket` names the
/// socket in the log when a connection is refused.
pub fn incoming(
    listener: UnixListener,
    socket: &Path,
) -> impl Stream<Item = io::Result<DuplexStream>> {
    let socket: Arc<Path> = Arc::from(socket);
    UnixListenerStream::new(listener).map(move |accepted| {
        accepted.map(|client| {
            let (ours, theirs) = tokio::io::duplex(DUPLEX_BUFFER);
            tokio::spawn(front(client, ours, socket.clone()));
            theirs
        })
    })
}

/// How the client-to-server half ended, if not with a clean hang-up.
enum Ended {
    Io(io::Error),
    Refused(FrontError),
}

/// Carries one connection until either side closes it.
async fn front(client: UnixStream, server: DuplexStream, socket: Arc<Path>) {
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = tokio::io::split(server);
    let up = pin!(async {
        let mut rewriter = Rewriter::default();
        let mut buf = vec![0; FRAME_SIZE];
        let mut out = Vec::with_capacity(FRAME_SIZE);
        loop {
            let n = from_client.read(&mut buf).await.map_err(Ended::Io)?;
            if n == 0 {
                rewriter.finish().map_err(Ended::Refused)?;
                return to_server.shutdown().await.map_err(Ended::Io);
            }
            out.clear();
            rewriter.feed(&buf[..n], &mut out).map_err(Ended::Refused)?;
            to_server.write_all(&out).await.map_err(Ended::Io)?;
        }
    });
    let mut down = pin!(async {
        let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
        let _ = to_client.shutdown().await;
    });
    tokio::select! {
        ended = up => match ended {
            // The client is done sending; let the server finish answering.
            Ok(()) => down.await,
            Err(Ended::Refused(e)) => warn!("{}: closing a client connection: {e}", socket.display()),
            Err(Ended::Io(e)) => debug!("{}: client connection ended: {e}", socket.display()),
        },
        () = &mut down => {}
    }
}
