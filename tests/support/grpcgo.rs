//! What grpc-go, kubelet's gRPC, writes on an HTTP/2 connection, where it
//! matters to a server: the authority escaped as grpc-go's `encodeAuthority`
//! does (a socket path becomes `%2Fvar%2Flib%2F...`), header fields encoded
//! as `x/net/http2/hpack` does (Huffman-coded strings, literals added to the
//! dynamic table, so a later call sends the authority as a one-byte index),
//! and header blocks split into CONTINUATION frames at the peer's frame size.
//! The `http` crate cannot build such a request, so the frames are written
//! here by hand. Used by the kubelet test binary: the registration tests
//! and the authority front's (tests/kubelet/authority.rs).
#![allow(dead_code)]

use loona_hpack::encoder::encode_integer_into;
use loona_hpack::Decoder;
use std::collections::VecDeque;
use std::io;
use std::path::Path;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

/// The client connection preface (RFC 9113 §3.4).
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Frame types (RFC 9113 §6).
pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const PRIORITY: u8 = 0x2;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PUSH_PROMISE: u8 = 0x5;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const WINDOW_UPDATE: u8 = 0x8;
pub const CONTINUATION: u8 = 0x9;
/// Frame flags.
pub const END_STREAM: u8 = 0x1;
pub const ACK: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const PADDED: u8 = 0x8;
pub const PRIORITY_FLAG: u8 = 0x20;
/// The frame size every HTTP/2 peer accepts, and what grpc-go splits at
/// until the server raises it.
pub const FRAME_SIZE: usize = 16 * 1024;
/// RST_STREAM's PROTOCOL_ERROR, what h2 answers a malformed authority with.
pub const PROTOCOL_ERROR: u32 = 0x1;

/// grpc-go's `encodeAuthority`: everything but RFC 3986's unreserved
/// characters, sub-delims and `:[]@` becomes `%XX`.
pub fn encode_authority(authority: &str) -> String {
    let keep = |c: u8| c.is_ascii_alphanumeric() || b"-_.~!$&'()*+,;=:[]@".contains(&c);
    authority
        .bytes()
        .map(|c| {
            if keep(c) {
                (c as char).to_string()
            } else {
                format!("%{c:02X}")
            }
        })
        .collect()
}

/// The code length of each symbol (RFC 7541 Appendix B; 256 is EOS). The
/// code is canonical, so the codes follow from the lengths alone.
const HUFFMAN_LENGTHS: [u8; 257] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, //
    28, 28, 28, 28, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 28, //
    6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, //
    5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10, //
    13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, //
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, //
    15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6, 6, 5, //
    6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28, //
    20, 22, 20, 20, 22, 22, 22, 23, 22, 23, 23, 23, 23, 23, 24, 23, //
    24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, //
    22, 21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, //
    21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22, 22, 23, //
    26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, //
    19, 21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27, //
    20, 24, 20, 21, 22, 21, 21, 23, 22, 22, 25, 25, 24, 24, 26, 23, //
    26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26, //
    30,
];

/// (code, length) of every symbol, assigned in (length, symbol) order.
fn huffman_codes() -> Vec<(u32, u8)> {
    let mut order: Vec<usize> = (0..HUFFMAN_LENGTHS.len()).collect();
    order.sort_by_key(|&s| (HUFFMAN_LENGTHS[s], s));
    let mut codes = vec![(0u32, 0u8); HUFFMAN_LENGTHS.len()];
    let (mut code, mut prev) = (0u32, HUFFMAN_LENGTHS[order[0]]);
    for (n, &s) in order.iter().enumerate() {
        let len = HUFFMAN_LENGTHS[s];
        if n > 0 {
            code = (code + 1) << (len - prev);
        }
        prev = len;
        codes[s] = (code, len);
    }
    codes
}

/// `s` Huffman-coded, padded with the EOS prefix (ones).
pub fn huffman(s: &[u8]) -> Vec<u8> {
    let codes = huffman_codes();
    let (mut out, mut acc, mut bits) = (Vec::new(), 0u64, 0u32);
    for &c in s {
        let (code, len) = codes[c as usize];
        acc = (acc << len) | code as u64;
        bits += len as u32;
        while bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    if bits > 0 {
        out.push(((acc << (8 - bits)) as u8) | (0xff >> bits));
    }
    out
}

/// An HPACK string as `x/net/http2/hpack` writes it: Huffman-coded when
/// that is shorter.
fn string(out: &mut Vec<u8>, s: &[u8]) {
    let coded = huffman(s);
    let (flag, bytes) = if coded.len() < s.len() {
        (0x80, &coded[..])
    } else {
        (0, s)
    };
    encode_integer_into(bytes.len(), 7, flag, out).unwrap();
    out.extend_from_slice(bytes);
}

/// The HPACK table size both ends start with.
const TABLE_SIZE: usize = 4096;

/// An HPACK encoder with `x/net/http2/hpack`'s strategy: an exact match in
/// a table is sent as its index; anything else as a literal added to the
/// dynamic table (4096 bytes, oldest evicted first; a field larger than the
/// table is not added), its name indexed when a table has it (static first).
pub struct GoEncoder {
    statics: Vec<(Vec<u8>, Vec<u8>)>,
    dynamic: VecDeque<(Vec<u8>, Vec<u8>)>,
    size: usize,
}

impl Default for GoEncoder {
    fn default() -> GoEncoder {
        // The static table, read back through a decoder rather than copied.
        let mut decoder = Decoder::new();
        let statics = (1..=61u8)
            .map(|i| decoder.decode(&[0x80 | i]).unwrap().remove(0))
            .collect();
        GoEncoder {
            statics,
            dynamic: VecDeque::new(),
            size: 0,
        }
    }
}

impl GoEncoder {
    /// The header block for `fields`, in order.
    pub fn encode(&mut self, fields: &[(&str, &str)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (name, value) in fields {
            let (name, value) = (name.as_bytes(), value.as_bytes());
            let exact = |t: &(Vec<u8>, Vec<u8>)| t.0 == name && t.1 == value;
            let named = |t: &(Vec<u8>, Vec<u8>)| t.0 == name;
            let dynamic = |i: usize| 62 + i;
            if let Some(i) = self.statics.iter().position(exact) {
                encode_integer_into(i + 1, 7, 0x80, &mut out).unwrap();
                continue;
            }
            if let Some(i) = self.dynamic.iter().position(exact) {
                encode_integer_into(dynamic(i), 7, 0x80, &mut out).unwrap();
                continue;
            }
            let index = match self.statics.iter().position(named) {
                Some(i) => i + 1,
                None => self.dynamic.iter().position(named).map_or(0, dynamic),
            };
            // A field larger than the whole table is not indexed.
            let indexing = name.len() + value.len() + 32 <= TABLE_SIZE;
            match indexing {
                true => encode_integer_into(index, 6, 0x40, &mut out).unwrap(),
                false => encode_integer_into(index, 4, 0, &mut out).unwrap(),
            }
            if index == 0 {
                string(&mut out, name);
            }
            string(&mut out, value);
            if indexing {
                self.add(name, value);
            }
        }
        out
    }

    fn add(&mut self, name: &[u8], value: &[u8]) {
        self.size += name.len() + value.len() + 32;
        self.dynamic.push_front((name.to_vec(), value.to_vec()));
        while self.size > TABLE_SIZE {
            let (n, v) = self.dynamic.pop_back().unwrap();
            self.size -= n.len() + v.len() + 32;
        }
    }
}

/// One frame.
pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = len.to_be_bytes()[1..].to_vec();
    out.extend([kind, flags]);
    out.extend(stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// A header block as HEADERS and, past `max` bytes, CONTINUATION frames.
pub fn header_frames(stream: u32, block: &[u8], end_stream: bool, max: usize) -> Vec<u8> {
    let chunks: Vec<&[u8]> = if block.is_empty() {
        vec![block]
    } else {
        block.chunks(max).collect()
    };
    let mut out = Vec::new();
    for (i, chunk) in chunks.iter().enumerate() {
        let last = i + 1 == chunks.len();
        let (kind, mut flags) = match i {
            0 if end_stream => (HEADERS, END_STREAM),
            0 => (HEADERS, 0),
            _ => (CONTINUATION, 0),
        };
        if last {
            flags |= END_HEADERS;
        }
        out.extend(frame(kind, flags, stream, chunk));
    }
    out
}

/// The fields grpc-go sends to start a unary call with a deadline.
pub fn request_fields<'a>(path: &'a str, authority: &'a str) -> [(&'a str, &'a str); 8] {
    [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("user-agent", "grpc-go/1.72.2"),
        ("te", "trailers"),
        ("grpc-timeout", "999931u"),
    ]
}

/// grpc-go's `encodeTimeout`: the time left, rounded up, in the finest
/// unit (n, u, m, S, M, H) that keeps it at eight digits.
pub fn encode_timeout(left: std::time::Duration) -> String {
    const MAX: u128 = 99_999_999;
    let ns = left.as_nanos();
    if ns == 0 {
        return "0n".into();
    }
    for (unit, per) in [
        ("n", 1u128),
        ("u", 1_000),
        ("m", 1_000_000),
        ("S", 1_000_000_000),
        ("M", 60_000_000_000),
    ] {
        let d = ns.div_ceil(per);
        if d <= MAX {
            return format!("{d}{unit}");
        }
    }
    format!("{}H", ns.div_ceil(3_600_000_000_000))
}

/// A gRPC message: uncompressed flag, length, bytes.
pub fn grpc_message(message: &[u8]) -> Vec<u8> {
    let mut out = vec![0];
    out.extend((message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// How a call ended.
#[derive(Debug, PartialEq)]
pub enum Answer {
    /// The stream ended normally: the `grpc-status` and the message bytes.
    Done { status: String, message: Vec<u8> },
    /// The server reset the stream with this error code.
    Reset(u32),
    /// The server closed the connection with this error code.
    GoAway(u32),
}

/// One HTTP/2 connection as kubelet's plugin watcher holds it.
pub struct GoConn {
    io: UnixStream,
    encoder: GoEncoder,
    decoder: Decoder<'static>,
    next_stream: u32,
    authority: String,
    timeout: Option<String>,
}

impl GoConn {
    /// Connects to `socket` and sends the preface and SETTINGS; the
    /// authority is `socket` escaped, as grpc-go derives it from the target.
    pub async fn dial(socket: &Path) -> io::Result<GoConn> {
        GoConn::dial_as(socket, &encode_authority(&socket.to_string_lossy())).await
    }

    /// Connects like [`GoConn::dial`], sending `authority` instead.
    pub async fn dial_as(socket: &Path, authority: &str) -> io::Result<GoConn> {
        let authority = authority.to_string();
        let mut io = UnixStream::connect(socket).await?;
        let mut hello = PREFACE.to_vec();
        hello.extend(frame(SETTINGS, 0, 0, &[]));
        io.write_all(&hello).await?;
        Ok(GoConn {
            io,
            encoder: GoEncoder::default(),
            decoder: Decoder::new(),
            next_stream: 1,
            authority,
            timeout: Some("999931u".into()),
        })
    }

    /// The `:authority` every call sends.
    pub fn authority(&self) -> &str {
        &self.authority
    }

    /// Every later call carries `deadline` as grpc-go sends a context's
    /// deadline (`grpc-timeout`), or none at all; a new connection sends
    /// 999931 µs, what a 1 s deadline (kubelet's plugin watcher) leaves.
    pub fn with_deadline(mut self, deadline: Option<std::time::Duration>) -> GoConn {
        self.set_deadline(deadline);
        self
    }

    /// [`GoConn::with_deadline`] on a connection in use: kubelet's plugin
    /// watcher gives GetInfo 1 s and NotifyRegistrationStatus 5 s.
    pub fn set_deadline(&mut self, deadline: Option<std::time::Duration>) {
        self.timeout = deadline.map(encode_timeout);
    }

    /// A unary call of `path` with `message`, answered as [`Answer`].
    pub async fn call(&mut self, path: &str, message: &[u8]) -> io::Result<Answer> {
        self.exchange(path, message, false).await
    }

    /// Opens the server-streaming call `path` with `message` and answers
    /// with its first message as `Done { status: "", .. }`, or how it ended
    /// if it ended before one.
    pub async fn first_of_stream(&mut self, path: &str, message: &[u8]) -> io::Result<Answer> {
        self.exchange(path, message, true).await
    }

    async fn exchange(&mut self, path: &str, message: &[u8], first: bool) -> io::Result<Answer> {
        let stream = self.next_stream;
        self.next_stream += 2;
        let authority = self.authority.clone();
        let fields = request_fields(path, &authority);
        let fields: Vec<(&str, &str)> = match &self.timeout {
            Some(t) => fields
                .into_iter()
                .map(|(k, v)| (k, if k == "grpc-timeout" { t.as_str() } else { v }))
                .collect(),
            None => fields
                .into_iter()
                .filter(|(k, _)| *k != "grpc-timeout")
                .collect(),
        };
        let block = self.encoder.encode(&fields);
        let mut out = header_frames(stream, &block, false, FRAME_SIZE);
        out.extend(frame(DATA, END_STREAM, stream, &grpc_message(message)));
        self.io.write_all(&out).await?;
        let (mut body, mut status, mut block) = (Vec::new(), None, Vec::new());
        loop {
            let (kind, flags, id, payload) = self.read_frame().await?;
            match kind {
                SETTINGS if flags & ACK == 0 => {
                    self.io.write_all(&frame(SETTINGS, ACK, 0, &[])).await?
                }
                PING if flags & ACK == 0 => {
                    self.io.write_all(&frame(PING, ACK, 0, &payload)).await?
                }
                GOAWAY => {
                    let code = u32::from_be_bytes(payload[4..8].try_into().unwrap());
                    return Ok(Answer::GoAway(code));
                }
                RST_STREAM if id == stream => {
                    let code = u32::from_be_bytes(payload[..4].try_into().unwrap());
                    return Ok(Answer::Reset(code));
                }
                HEADERS | CONTINUATION => {
                    block.extend_from_slice(&payload);
                    if flags & END_HEADERS != 0 {
                        // Every block is decoded: the table must follow.
                        let fields = self.decoder.decode(&block).map_err(io::Error::other)?;
                        block.clear();
                        for (name, value) in fields {
                            if name == b"grpc-status" {
                                status = Some(String::from_utf8_lossy(&value).into_owned());
                            }
                        }
                    }
                    if id == stream && flags & END_STREAM != 0 {
                        break;
                    }
                }
                DATA if id == stream => {
                    body.extend_from_slice(&payload);
                    if flags & END_STREAM != 0 {
                        break;
                    }
                    let whole = body.len() >= 5
                        && body.len() - 5
                            >= u32::from_be_bytes(body[1..5].try_into().unwrap()) as usize;
                    if first && whole {
                        break;
                    }
                }
                _ => {}
            }
        }
        let message = body.get(5..).unwrap_or_default().to_vec();
        let status = status.unwrap_or_default();
        Ok(Answer::Done { status, message })
    }

    async fn read_frame(&mut self) -> io::Result<(u8, u8, u32, Vec<u8>)> {
        let mut head = [0u8; 9];
        self.io.read_exact(&mut head).await?;
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let id = u32::from_be_bytes(head[5..9].try_into().unwrap()) & 0x7fff_ffff;
        let mut payload = vec![0; len];
        self.io.read_exact(&mut payload).await?;
        Ok((head[3], head[4], id, payload))
    }
}
