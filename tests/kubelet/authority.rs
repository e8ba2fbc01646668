//! The registration socket's HTTP/2 front (`kubelet::authority`) fed the
//! bytes grpc-go writes (`support::grpcgo`): the authority kubelet dials,
//! Huffman-coded, indexed and split into CONTINUATION frames, becomes
//! `localhost`; every other frame passes untouched; hostile framing and
//! HPACK close the connection with a named error, never a panic.

use crate::support::grpcgo::*;
use loona_hpack::Decoder;
use nodefabric::kubelet::authority::{FrontError, Rewriter};

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
