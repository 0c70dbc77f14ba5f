//! The wire format's tests: frames written here read back by prost and the other way round,
//! heads left out and filled in, and broken frames read as far as they go.

use muster_proto::transport::{Envelope, Frame, Hello};
use prost::Message as _;

use super::*;

fn append(buf: &mut BytesMut, writer: &EnvelopeWriter<'_>, body: &[u8]) {
    append_with(buf, writer, false, body);
}

fn append_with(buf: &mut BytesMut, writer: &EnvelopeWriter<'_>, same_head: bool, body: &[u8]) {
    let before = buf.len();
    writer.append(buf, same_head, body.len(), |buf| buf.put_slice(body));
    assert_eq!(buf.len() - before, writer.framed_len(body.len(), same_head));
}

/// Appends an envelope of `kind` for `to` with a `type_name` body.
fn append_new(
    buf: &mut BytesMut,
    (kind, to, type_name, request_id): (Kind, &[u8], &[u8], u64),
    body: &[u8],
) {
    let head = EnvelopeHead::new(kind, to, type_name);
    append(buf, &EnvelopeWriter::new(&head, request_id), body);
}

#[test]
fn appended_envelopes_are_a_frame_prost_reads() {
    let mut buf = BytesMut::new();
    buf.put_slice(&hello_frame("10.0.0.1:7000", "0.1.0", &(1..=1)));
    let long_body = vec![7u8; 300];
    append_new(&mut buf, (Kind::Tell, b"sink", b"a.B", 0), b"xy");
    append_new(&mut buf, (Kind::Ask, b"echo", b"a.C", u64::MAX), &long_body);
    let error_head = EnvelopeHead::new(Kind::Error, b"", b"");
    append(
        &mut buf,
        &EnvelopeWriter {
            error_code: 4,
            error: "5/4",
            ..EnvelopeWriter::new(&error_head, 3)
        },
        b"",
    );
    let frame = Frame::decode(&buf[..]).expect("a valid frame");
    assert_eq!(
        frame.hello,
        Some(Hello {
            node: "10.0.0.1:7000".into(),
            reads_same_head: true,
            version: "0.1.0".into(),
            oldest_protocol: 1,
            newest_protocol: 1,
        })
    );
    assert_eq!(
        frame.envelopes,
        vec![
            Envelope {
                kind: Kind::Tell as i32,
                to: Bytes::from_static(b"sink"),
                type_name: Bytes::from_static(b"a.B"),
                body: Bytes::from_static(b"xy"),
                ..Envelope::default()
            },
            Envelope {
                kind: Kind::Ask as i32,
                to: Bytes::from_static(b"echo"),
                type_name: Bytes::from_static(b"a.C"),
                body: Bytes::from(long_body.clone()),
                request_id: u64::MAX,
                ..Envelope::default()
            },
            Envelope {
                kind: Kind::Error as i32,
                request_id: 3,
                error_code: 4,
                error: "5/4".into(),
                ..Envelope::default()
            },
        ]
    );
}

#[test]
fn long_names_encode() {
    let mut buf = BytesMut::new();
    let name = vec![b'n'; 300];
    append_new(&mut buf, (Kind::Tell, &name, &name, 1), b"body");
    let frame = Frame::decode(&buf[..]).expect("a valid frame");
    assert_eq!(&frame.envelopes[0].to[..], &name[..]);
    assert_eq!(&frame.envelopes[0].type_name[..], &name[..]);
    assert_eq!(&frame.envelopes[0].body[..], b"body");
}

#[test]
fn frames_prost_writes_are_read_back() {
    let frame = Frame {
        hello: Some(Hello {
            node: "n:1".into(),
            reads_same_head: false,
            version: "0.2.0".into(),
            oldest_protocol: 1,
            newest_protocol: 2,
        }),
        envelopes: vec![
            Envelope {
                kind: Kind::Reply as i32,
                to: Bytes::from_static(b"p"),
                type_name: Bytes::from_static(b"t"),
                body: Bytes::from_static(b"body"),
                request_id: 300,
                ..Envelope::default()
            };
            2
        ],
    };
    let bytes = frame.encode_to_vec();
    let items: Vec<_> = Envelopes::new(&bytes).collect();
    assert_eq!(items.len(), 3);
    assert!(matches!(
        items[0],
        Ok(Item::Hello(HelloRef {
            node: b"n:1",
            reads_same_head: false,
            version: b"0.2.0",
            protocols: (1, 2),
        }))
    ));
    for item in &items[1..] {
        let Ok(Item::Envelope(envelope)) = item else {
            panic!("an envelope: {item:?}");
        };
        assert_eq!(envelope.kind, Kind::Reply as i32);
        assert_eq!((envelope.to, envelope.type_name), (&b"p"[..], &b"t"[..]));
        assert_eq!(&bytes[envelope.body.clone()], b"body");
        assert_eq!(envelope.request_id, 300);
    }
}

#[test]
fn an_envelope_with_same_head_leaves_its_head_out_and_is_read_back_with_it() {
    let tell = EnvelopeHead::new(Kind::Tell, b"sink", b"muster.example.v1.Ping");
    let mut buf = BytesMut::new();
    append(&mut buf, &EnvelopeWriter::new(&tell, 0), b"1");
    let full = buf.len();
    append_with(&mut buf, &EnvelopeWriter::new(&tell, 0), true, b"2");
    append_with(&mut buf, &EnvelopeWriter::new(&tell, 0), true, b"3");
    // Key and length, `same_head` (key and value), the body's key, length and byte.
    assert_eq!(buf.len() - full, 2 * 7, "no head in the second and third");

    // prost reads it as the proto says: the head left out, `same_head` set.
    let frame = Frame::decode(&buf[..]).expect("a valid frame");
    assert_eq!(frame.envelopes[1].to, Bytes::new());
    assert!(frame.envelopes[1].same_head && !frame.envelopes[0].same_head);

    // The reader fills it in from the envelope before.
    let read: Vec<_> = Envelopes::new(&buf)
        .map(|item| match item {
            Ok(Item::Envelope(e)) => (e.kind, e.to, e.type_name, e.same_head, &buf[e.body]),
            other => panic!("an envelope: {other:?}"),
        })
        .collect();
    let head = (
        Kind::Tell as i32,
        &b"sink"[..],
        &b"muster.example.v1.Ping"[..],
    );
    assert_eq!(
        read,
        vec![
            (head.0, head.1, head.2, false, &b"1"[..]),
            (head.0, head.1, head.2, true, &b"2"[..]),
            (head.0, head.1, head.2, true, &b"3"[..]),
        ]
    );
}

#[test]
fn a_frame_with_same_head_expands_to_whole_envelopes_for_a_peer_that_does_not_read_it() {
    let tell = EnvelopeHead::new(Kind::Tell, b"sink", b"a.B");
    let ask = EnvelopeHead::new(Kind::Ask, b"echo", b"a.C");
    let mut buf = BytesMut::new();
    buf.put_slice(&hello_frame("n:1", "0.1.0", &(1..=1)));
    append(&mut buf, &EnvelopeWriter::new(&tell, 0), b"1");
    append_with(&mut buf, &EnvelopeWriter::new(&tell, 0), true, b"2");
    append(&mut buf, &EnvelopeWriter::new(&ask, 9), b"3");
    append(&mut buf, &EnvelopeWriter::new(&tell, 0), b"4");
    append_with(&mut buf, &EnvelopeWriter::new(&tell, 0), true, b"");
    let expanded = expand_same_heads(&buf);
    let frame = Frame::decode(&expanded[..]).expect("a valid frame");
    assert_eq!(frame.hello.map(|hello| hello.node).as_deref(), Some("n:1"));
    let read: Vec<_> = frame
        .envelopes
        .iter()
        .map(|e| (e.kind, &e.to[..], &e.body[..], e.request_id, e.same_head))
        .collect();
    let t = Kind::Tell as i32;
    assert_eq!(
        read,
        vec![
            (t, &b"sink"[..], &b"1"[..], 0, false),
            (t, b"sink", b"2", 0, false),
            (Kind::Ask as i32, b"echo", b"3", 9, false),
            (t, b"sink", b"4", 0, false),
            (t, b"sink", b"", 0, false),
        ]
    );
    // A frame without `same_head` is left as it is.
    let plain = expand_same_heads(&expanded);
    assert_eq!(plain, expanded);
}

#[test]
fn same_head_with_no_envelope_before_it_is_malformed() {
    let tell = EnvelopeHead::new(Kind::Tell, b"sink", b"a.B");
    let writer = EnvelopeWriter::new(&tell, 0);
    let mut buf = BytesMut::new();
    // First in its frame: nothing to repeat.
    append_with(&mut buf, &writer, true, b"1");
    append(&mut buf, &writer, b"2");
    // After a malformed envelope (a `to` longer than the envelope): nothing known to repeat.
    buf.put_slice(&[key(FRAME_ENVELOPES, LENGTH_DELIMITED), 2]);
    buf.put_slice(&[key(TO, LENGTH_DELIMITED), 50]);
    append_with(&mut buf, &EnvelopeWriter::new(&tell, 8), true, b"3");
    append(&mut buf, &writer, b"4");
    append_with(&mut buf, &writer, true, b"5");
    let read: Vec<_> = Envelopes::new(&buf)
        .map(|item| match item {
            Ok(Item::Envelope(e)) => Ok(buf[e.body][0]),
            Ok(Item::Malformed { request_id }) => Err(request_id),
            other => panic!("an envelope: {other:?}"),
        })
        .collect();
    assert_eq!(
        read,
        vec![Err(0), Ok(b'2'), Err(0), Err(8), Ok(b'4'), Ok(b'5')]
    );
}

#[test]
fn a_malformed_envelope_is_skipped_and_the_frame_goes_on() {
    let mut buf = BytesMut::new();
    // An envelope whose request id is read, then a `to` that claims more bytes than the
    // envelope has.
    buf.put_slice(&[key(FRAME_ENVELOPES, LENGTH_DELIMITED), 4]);
    buf.put_slice(&[key(REQUEST_ID, VARINT), 9, key(TO, LENGTH_DELIMITED), 50]);
    append_new(&mut buf, (Kind::Tell, b"sink", b"a.B", 0), b"ok");
    let items: Vec<_> = Envelopes::new(&buf).collect();
    assert!(matches!(items[0], Ok(Item::Malformed { request_id: 9 })));
    assert!(matches!(&items[1], Ok(Item::Envelope(e)) if e.to == b"sink"));
    assert_eq!(items.len(), 2);
}

#[test]
fn a_broken_frame_ends_with_an_error_after_what_was_read() {
    let mut buf = BytesMut::new();
    append_new(&mut buf, (Kind::Tell, b"sink", b"a.B", 0), b"ok");
    let good = buf.len();
    // An element whose length runs past the end of the frame.
    buf.put_slice(&[key(FRAME_ENVELOPES, LENGTH_DELIMITED), 100, 1, 2]);
    let items: Vec<_> = Envelopes::new(&buf).collect();
    assert_eq!(items.len(), 2);
    assert!(matches!(items[0], Ok(Item::Envelope(_))));
    assert_eq!(items[1].as_ref().err(), Some(&FrameError { offset: good }));
}

#[test]
fn truncated_frames_never_panic() {
    let mut buf = BytesMut::new();
    buf.put_slice(&hello_frame("node:1", "0.1.0", &(1..=1)));
    append_new(&mut buf, (Kind::Ask, b"echo", b"a.C", 1 << 40), &[1, 2, 3]);
    for end in 0..buf.len() {
        for item in Envelopes::new(&buf[..end]) {
            drop(item);
        }
    }
    // Every byte value at every position: no panic, and the walk ends.
    for at in 0..buf.len() {
        for byte in [0x00, 0x07, 0x0a, 0x12, 0x7f, 0x80, 0xff] {
            let mut bad = buf.to_vec();
            bad[at] = byte;
            assert!(Envelopes::new(&bad).count() <= bad.len());
        }
    }
}

#[test]
fn a_frame_slice_reads_its_range_and_slices_bytes_fields_out_of_the_frame() {
    let frame = Bytes::from_static(b"..hello world..");
    let mut body = FrameSlice::new(&frame, 2..13);
    assert_eq!(body.remaining(), 11);
    assert_eq!(body.chunk(), b"hello world");
    body.advance(6);
    let world = body.copy_to_bytes(5);
    assert_eq!(&world[..], b"world");
    // A slice of the frame, not a copy.
    assert_eq!(world.as_ptr(), frame[8..].as_ptr());
    assert_eq!(body.remaining(), 0);
    // A message decodes from it as from the bytes alone.
    let envelope = Envelope {
        to: Bytes::from_static(b"p"),
        body: Bytes::from_static(b"xyz"),
        ..Envelope::default()
    };
    let mut framed = b"ab".to_vec();
    framed.extend(envelope.encode_to_vec());
    let framed = Bytes::from(framed);
    let decoded =
        Envelope::decode(FrameSlice::new(&framed, 2..framed.len())).expect("a valid envelope");
    assert_eq!(decoded, envelope);
    assert_eq!(decoded.body.as_ptr(), framed[framed.len() - 3..].as_ptr());
}

#[test]
fn varint_lengths() {
    for value in [
        0,
        1,
        127,
        128,
        16_383,
        16_384,
        u64::from(u32::MAX),
        u64::MAX,
    ] {
        let mut buf = Vec::new();
        put_varint(&mut buf, value);
        assert_eq!(buf.len(), varint_len(value), "{value}");
        let mut at = 0;
        assert_eq!(read_varint(&buf, &mut at), Some(value));
        assert_eq!(at, buf.len());
    }
}
