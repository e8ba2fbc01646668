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

// What grpc-go writes, shared with the kubelet test binary.
#[cfg(test)]
#[path = "../../tests/support/grpcgo.rs"]
mod grpcgo;

#[cfg(test)]
mod tests {
    use super::grpcgo::*;
    use super::{Decoder, FrontError, Rewriter};

    /// kubelet's registration socket for this driver, as grpc-go escapes it.
    const SOCKET: &str = "/var/lib/kubelet/plugins_registry/rdma.gpustack.ai-reg.sock";

    /// (type, flags, stream, payload) of each frame after the preface.
    fn frames(out: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
        assert_eq!(&out[..PREFACE.len()], PREFACE);
        let mut rest = &out[PREFACE.len()..];
        let mut all = Vec::new();
        while !rest.is_empty() {
            let len = u32::from_be_bytes([0, rest[0], rest[1], rest[2]]) as usize;
            let stream = u32::from_be_bytes(rest[5..9].try_into().unwrap());
            all.push((rest[3], rest[4], stream, rest[9..9 + len].to_vec()));
            rest = &rest[9 + len..];
        }
        all
    }

    /// The fields of a rewritten block, decoded with a fresh decoder: the
    /// server's table must never be needed.
    fn fields(block: &[u8]) -> Vec<(String, String)> {
        Decoder::new()
            .decode(block)
            .unwrap()
            .into_iter()
            .map(|(n, v)| {
                let s = |b: Vec<u8>| String::from_utf8(b).unwrap();
                (s(n), s(v))
            })
            .collect()
    }

    fn authority_of(fields: &[(String, String)]) -> &str {
        &fields.iter().find(|(n, _)| n == ":authority").unwrap().1
    }

    /// Everything `input` turns into, fed whole and fed a byte at a time
    /// (the two must agree).
    fn rewrite(input: &[u8]) -> Result<Vec<u8>, FrontError> {
        let mut whole = Vec::new();
        let result = Rewriter::default().feed(input, &mut whole);
        let mut bytewise = Vec::new();
        let mut rewriter = Rewriter::default();
        let bytewise_result = input
            .iter()
            .try_for_each(|b| rewriter.feed(std::slice::from_ref(b), &mut bytewise));
        assert_eq!(result.is_ok(), bytewise_result.is_ok());
        result?;
        assert_eq!(whole, bytewise);
        rewriter.finish()?;
        Ok(whole)
    }

    fn hello() -> Vec<u8> {
        let mut input = PREFACE.to_vec();
        input.extend(frame(SETTINGS, 0, 0, &[0, 4, 0, 0x40, 0, 0]));
        input
    }

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn huffman_coded_authority_and_its_index_become_localhost() {
        // RFC 7541 C.4: three requests on one connection; the first sends
        // www.example.com Huffman-coded and indexed, the others its index.
        let blocks = [
            hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff"),
            hex("8286 84be 5886 a8eb 1064 9cbf"),
            hex("8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf"),
        ];
        let mut input = hello();
        for (i, block) in blocks.iter().enumerate() {
            input.extend(header_frames(1 + 2 * i as u32, block, true, FRAME_SIZE));
        }
        let out = frames(&rewrite(&input).unwrap());
        assert_eq!(out[0].0, SETTINGS);
        let decoded: Vec<_> = out[1..].iter().map(|f| fields(&f.3)).collect();
        assert_eq!(decoded.len(), 3);
        for (i, f) in decoded.iter().enumerate() {
            assert_eq!(authority_of(f), "localhost", "request {i}");
        }
        assert!(decoded[1].contains(&("cache-control".into(), "no-cache".into())));
        assert!(decoded[2].contains(&("custom-key".into(), "custom-value".into())));
        assert!(decoded[2].contains(&(":path".into(), "/index.html".into())));
        for (kind, flags, stream, _) in &out[1..] {
            assert_eq!(
                (*kind, *flags),
                (HEADERS, END_STREAM | END_HEADERS),
                "stream {stream}"
            );
        }
    }

    #[test]
    fn many_calls_on_one_connection_reuse_the_clients_table() {
        let authority = encode_authority(SOCKET);
        assert_eq!(
            authority,
            "%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Frdma.gpustack.ai-reg.sock"
        );
        let coded = huffman(authority.as_bytes());
        let mut encoder = GoEncoder::default();
        let mut input = hello();
        let paths = [
            "/pluginregistration.Registration/GetInfo",
            "/pluginregistration.Registration/NotifyRegistrationStatus",
        ];
        let calls = 40;
        let mut seen = std::collections::HashSet::new();
        for i in 0..calls {
            let path = paths[(i % 7 == 3) as usize];
            let block = encoder.encode(&request_fields(path, &authority));
            let has_coded = block.windows(coded.len()).any(|w| w == coded);
            // The first call carries the coded path; every later one an index.
            assert_eq!(has_coded, i == 0, "call {i}");
            // A path seen before is an index too: eight fields, eight bytes.
            if !seen.insert(path) {
                assert_eq!(block.len(), 8, "call {i}: {block:02x?}");
            }
            let stream = 1 + 2 * i as u32;
            input.extend(header_frames(stream, &block, false, FRAME_SIZE));
            input.extend(frame(DATA, END_STREAM, stream, &grpc_message(b"")));
        }
        let out = frames(&rewrite(&input).unwrap());
        let calls_out: Vec<_> = out[1..].chunks(2).collect();
        assert_eq!(calls_out.len(), calls);
        for (i, call) in calls_out.iter().enumerate() {
            let stream = 1 + 2 * i as u32;
            let (kind, flags, id, block) = &call[0];
            assert_eq!((*kind, *flags, *id), (HEADERS, END_HEADERS, stream));
            let f = fields(block);
            assert_eq!(authority_of(&f), "localhost");
            assert_eq!(f.len(), 8);
            assert!(f.contains(&("te".into(), "trailers".into())));
            // DATA passes untouched.
            assert_eq!(call[1], (DATA, END_STREAM, stream, grpc_message(b"")));
        }
    }

    #[test]
    fn a_block_split_into_continuation_is_joined_and_split_again() {
        let big = "a".repeat(40_000);
        let mut fields_in: Vec<(&str, &str)> =
            request_fields("/pluginregistration.Registration/GetInfo", "x").to_vec();
        let authority = encode_authority(SOCKET);
        fields_in[3].1 = &authority;
        fields_in.push(("x-big", &big));
        let block = GoEncoder::default().encode(&fields_in);
        let wire = header_frames(1, &block, true, FRAME_SIZE);
        let mut input = hello();
        input.extend(&wire);
        assert_eq!(frames(&input).len(), 3, "HEADERS and one CONTINUATION in");
        let out = frames(&rewrite(&input).unwrap());
        let kinds: Vec<(u8, u8)> = out[1..].iter().map(|f| (f.0, f.1)).collect();
        assert_eq!(
            kinds,
            [
                (HEADERS, END_STREAM),
                (CONTINUATION, 0),
                (CONTINUATION, END_HEADERS)
            ]
        );
        assert!(out[1..].iter().all(|f| f.3.len() <= FRAME_SIZE && f.2 == 1));
        let joined: Vec<u8> = out[1..].iter().flat_map(|f| f.3.clone()).collect();
        let f = fields(&joined);
        assert_eq!(authority_of(&f), "localhost");
        assert_eq!(f.last().unwrap(), &("x-big".to_string(), big));
    }

    #[test]
    fn padding_and_priority_are_dropped() {
        let block = GoEncoder::default().encode(&request_fields("/p", &encode_authority(SOCKET)));
        let with = |flags: u8, pad: usize| {
            let mut payload = Vec::new();
            if flags & PADDED != 0 {
                payload.push(pad as u8);
            }
            if flags & PRIORITY_FLAG != 0 {
                payload.extend([0x80, 0, 0, 0, 15]);
            }
            payload.extend(&block);
            payload.extend(vec![0; pad]);
            let mut input = hello();
            input.extend(frame(
                HEADERS,
                flags | END_HEADERS | END_STREAM,
                1,
                &payload,
            ));
            input
        };
        for (flags, pad) in [
            (PADDED, 7),
            (PADDED, 0),
            (PRIORITY_FLAG, 0),
            (PADDED | PRIORITY_FLAG, 200),
        ] {
            let out = frames(&rewrite(&with(flags, pad)).unwrap());
            let (kind, out_flags, stream, payload) = &out[1];
            assert_eq!(
                (*kind, *out_flags, *stream),
                (HEADERS, END_HEADERS | END_STREAM, 1)
            );
            let f = fields(payload);
            assert_eq!(authority_of(&f), "localhost", "flags {flags:#x}");
            assert!(f.contains(&(":path".into(), "/p".into())));
        }
        // Padding longer than the frame.
        let mut input = hello();
        input.extend(frame(HEADERS, PADDED | END_HEADERS, 1, &[9, 0x82]));
        assert!(matches!(
            rewrite(&input),
            Err(FrontError::Padding { stream: 1 })
        ));
        let mut input = hello();
        input.extend(frame(HEADERS, PRIORITY_FLAG | END_HEADERS, 1, &[0, 0, 0]));
        assert!(matches!(
            rewrite(&input),
            Err(FrontError::Padding { stream: 1 })
        ));
    }

    #[test]
    fn a_70_kib_header_block_is_refused() {
        let block = vec![0x82; 70 * 1024];
        let mut input = hello();
        input.extend(header_frames(1, &block, false, FRAME_SIZE));
        let mut out = Vec::new();
        let err = Rewriter::default().feed(&input, &mut out).unwrap_err();
        assert!(matches!(err, FrontError::TooLarge { stream: 1 }), "{err}");
        assert_eq!(
            err.to_string(),
            "header block of stream 1 is over 65536 bytes"
        );
        // No part of the block went on.
        assert!(frames(&out).iter().all(|f| f.0 == SETTINGS));
        // One frame announcing 70 KiB is refused at its head.
        let mut input = hello();
        input.extend(&frame(HEADERS, END_HEADERS, 3, &block)[..9]);
        assert!(matches!(
            rewrite(&input),
            Err(FrontError::TooLarge { stream: 3 })
        ));
        // A small block that decodes past the cap: one 4 KiB table entry
        // indexed many times.
        let mut encoder = GoEncoder::default();
        let value = "v".repeat(4000);
        let mut block = encoder.encode(&[("x", &value)]);
        block.extend(vec![0xbe; 100]);
        let mut input = hello();
        input.extend(header_frames(5, &block, false, FRAME_SIZE));
        assert!(matches!(
            rewrite(&input),
            Err(FrontError::TooLarge { stream: 5 })
        ));
    }

    #[test]
    fn garbage_closes_the_connection_without_a_panic() {
        assert!(matches!(
            rewrite(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
            Err(FrontError::Preface)
        ));
        let mut out = Vec::new();
        let short = Rewriter::default().feed(b"GET /", &mut out);
        assert!(
            matches!(short, Err(FrontError::Preface)),
            "refused before 24 bytes"
        );
        let bad_blocks: [&[u8]; 5] = [
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff], // integer too long
            &[0xff, 0x00],                         // index past the tables
            &[0x41, 0x85, 0xff],                   // string past the block
            &[0x41, 0x81, 0xff],                   // EOS in a Huffman string
            &[0x3f, 0xe1, 0x3f, 0x82],             // table over 4096
        ];
        for block in bad_blocks {
            let mut input = hello();
            input.extend(header_frames(1, block, true, FRAME_SIZE));
            let err = rewrite(&input).unwrap_err();
            assert!(
                matches!(err, FrontError::Hpack { stream: 1, .. }),
                "{block:02x?}: {err}"
            );
        }
        // Random blocks: errors or not, never a panic.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for n in 0..3000 {
            let block: Vec<u8> = (0..n % 48)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let mut input = hello();
            input.extend(header_frames(1, &block, false, FRAME_SIZE));
            input.extend(frame(
                (x >> 8) as u8 % 12,
                x as u8,
                (x >> 16) as u32,
                &block,
            ));
            let _ = rewrite(&input);
        }
        // Framing a client never sends.
        let cases = [
            (frame(CONTINUATION, END_HEADERS, 1, &[0x82]), "CONTINUATION"),
            (frame(HEADERS, END_HEADERS, 0, &[0x82]), "not a client's"),
            (
                frame(PUSH_PROMISE, END_HEADERS, 1, &[0, 0, 0, 2, 0x82]),
                "not a client's",
            ),
        ];
        for (bytes, message) in cases {
            let mut input = hello();
            input.extend(bytes);
            let err = rewrite(&input).unwrap_err();
            assert!(err.to_string().contains(message), "{err}");
        }
        let mut input = hello();
        input.extend(frame(HEADERS, 0, 1, &[0x82]));
        input.extend(frame(DATA, 0, 1, b"x"));
        assert!(matches!(
            rewrite(&input),
            Err(FrontError::Interleaved {
                kind: DATA,
                stream: 1,
                open: 1
            })
        ));
    }

    #[test]
    fn a_truncated_frame_is_held_back_and_reported() {
        let block = GoEncoder::default().encode(&request_fields("/p", &encode_authority(SOCKET)));
        let whole = frame(HEADERS, END_HEADERS, 1, &block);
        for cut in [3, 9, whole.len() - 1] {
            let mut input = hello();
            input.extend(&whole[..cut]);
            let mut out = Vec::new();
            let mut rewriter = Rewriter::default();
            rewriter.feed(&input, &mut out).unwrap();
            assert_eq!(out, hello(), "cut at {cut}: nothing of the frame went on");
            assert!(matches!(rewriter.finish(), Err(FrontError::Truncated)));
        }
        // A block whose CONTINUATION never comes.
        let mut input = hello();
        input.extend(frame(HEADERS, 0, 1, &block));
        assert!(matches!(rewrite(&input), Err(FrontError::Truncated)));
        // A frame that passes through goes on as it comes.
        let data = frame(DATA, 0, 1, &[7; 100]);
        let mut input = hello();
        input.extend(&data[..50]);
        let mut out = Vec::new();
        let mut rewriter = Rewriter::default();
        rewriter.feed(&input, &mut out).unwrap();
        assert_eq!(out, input);
        assert!(matches!(rewriter.finish(), Err(FrontError::Truncated)));
        // A half preface.
        assert!(matches!(
            rewrite(&PREFACE[..10]),
            Err(FrontError::Truncated)
        ));
    }

    #[test]
    fn every_other_frame_passes_untouched() {
        let mut input = hello();
        input.extend(frame(SETTINGS, ACK, 0, &[]));
        input.extend(frame(WINDOW_UPDATE, 0, 0, &[0, 0x0f, 0, 0]));
        input.extend(frame(PING, 0, 0, &[1, 2, 3, 4, 5, 6, 7, 8]));
        input.extend(frame(PRIORITY, 0, 3, &[0, 0, 0, 1, 16]));
        input.extend(frame(DATA, PADDED, 1, &[2, b'h', b'i', 0, 0]));
        input.extend(frame(RST_STREAM, 0, 1, &[0, 0, 0, 8]));
        input.extend(frame(0xfa, 0xff, 9, b"an extension frame"));
        input.extend(frame(GOAWAY, 0, 0, &[0, 0, 0, 0, 0, 0, 0, 0]));
        assert_eq!(rewrite(&input).unwrap(), input);
    }
}
