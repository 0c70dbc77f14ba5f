//! The link's wire format, written and read without building message structs.
//!
//! On the wire a link carries `muster.transport.v1.Frame`s (proto/muster/transport/v1): a
//! frame is the optional `hello` (field 1) and its envelopes (field 2, repeated). A repeated
//! message field is just its elements one after another, each as key, length and bytes, so
//! appending one envelope's encoding to a buffer appends it to the frame in that buffer: a
//! sender encodes each envelope once, straight into the frame that will carry it
//! ([`EnvelopeWriter`]), and the reader walks a received frame and slices each envelope out of
//! it ([`Envelopes`]) instead of decoding a `Vec` of structs with three `Bytes` each. tonic
//! carries the frames with [`FrameCodec`], which copies bytes in and out and adds nothing to
//! gRPC's own five-byte framing. The generated `Frame` and `Envelope` types describe the same
//! bytes and still read and write them (the tests do).

use std::ops::Range;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use muster_proto::transport::Kind;
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

/// The gRPC path of `Transport.Link`.
pub(crate) const LINK_PATH: &str = "/muster.transport.v1.Transport/Link";

/// Wire types used here (protobuf encoding).
const VARINT: u8 = 0;
const LENGTH_DELIMITED: u8 = 2;
const FIXED64: u8 = 1;
const FIXED32: u8 = 5;

/// `Frame` field numbers.
const FRAME_HELLO: u64 = 1;
const FRAME_ENVELOPES: u64 = 2;

/// `Envelope` field numbers.
const KIND: u64 = 1;
const TO: u64 = 2;
const TYPE_NAME: u64 = 3;
const BODY: u64 = 4;
const REQUEST_ID: u64 = 5;
const ERROR_CODE: u64 = 6;
const ERROR: u64 = 7;

/// A key byte: every field here has a number below 16, so a key is one byte.
const fn key(field: u64, wire_type: u8) -> u8 {
    ((field as u8) << 3) | wire_type
}

/// Bytes of `value` as a varint.
pub(crate) const fn varint_len(value: u64) -> usize {
    // 1 byte per 7 bits, at least 1.
    let bits = 64 - (value | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}

/// Reads a varint from `buf` at `*at`, advancing it; `None` if it is cut off or too long.
fn read_varint(buf: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *buf.get(*at)?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Some(value);
        }
    }
    None
}

/// The bytes of a length-delimited field whose length starts at `*at`.
fn read_delimited(buf: &[u8], at: &mut usize) -> Option<Range<usize>> {
    let len = usize::try_from(read_varint(buf, at)?).ok()?;
    let start = *at;
    let end = start.checked_add(len).filter(|&end| end <= buf.len())?;
    *at = end;
    Some(start..end)
}

/// Skips a field of an unknown number, as protobuf requires of readers.
fn skip(buf: &[u8], at: &mut usize, wire_type: u8) -> Option<()> {
    match wire_type {
        VARINT => {
            read_varint(buf, at)?;
        }
        FIXED64 => *at = at.checked_add(8).filter(|&end| end <= buf.len())?,
        LENGTH_DELIMITED => {
            read_delimited(buf, at)?;
        }
        FIXED32 => *at = at.checked_add(4).filter(|&end| end <= buf.len())?,
        _ => return None,
    }
    Some(())
}

/// One envelope to append to a frame: everything but the body, which the caller encodes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EnvelopeWriter<'a> {
    pub(crate) kind: Kind,
    pub(crate) to: &'a [u8],
    pub(crate) type_name: &'a [u8],
    pub(crate) request_id: u64,
    pub(crate) error_code: i32,
    pub(crate) error: &'a str,
}

impl<'a> EnvelopeWriter<'a> {
    /// An envelope of `kind` for `to` carrying a `type_name` body.
    pub(crate) fn new(kind: Kind, to: &'a [u8], type_name: &'a [u8], request_id: u64) -> Self {
        EnvelopeWriter {
            kind,
            to,
            type_name,
            request_id,
            error_code: 0,
            error: "",
        }
    }

    /// The envelope's encoded length with a body of `body_len` bytes (fields at their default
    /// value are left out, as prost leaves them out).
    fn len(&self, body_len: usize) -> usize {
        fn bytes_field(len: usize) -> usize {
            if len == 0 {
                0
            } else {
                1 + varint_len(len as u64) + len
            }
        }
        fn varint_field(value: u64) -> usize {
            if value == 0 { 0 } else { 1 + varint_len(value) }
        }
        varint_field(self.kind as i32 as u64)
            + bytes_field(self.to.len())
            + bytes_field(self.type_name.len())
            + bytes_field(body_len)
            + varint_field(self.request_id)
            + varint_field(self.error_code as i64 as u64)
            + bytes_field(self.error.len())
    }

    /// Bytes this envelope adds to a frame with a body of `body_len` bytes.
    #[cfg(test)]
    fn framed_len(&self, body_len: usize) -> usize {
        let len = self.len(body_len);
        1 + varint_len(len as u64) + len
    }

    /// Appends the envelope to the frame in `buf` as one more element of `envelopes`;
    /// `body` writes exactly `body_len` bytes.
    ///
    /// The fields before the body and those after it are each assembled on the stack and
    /// copied in with one call (when they fit, as they do for any usual name), rather than
    /// with a capacity check per field.
    pub(crate) fn append(
        &self,
        buf: &mut BytesMut,
        body_len: usize,
        body: impl FnOnce(&mut BytesMut),
    ) {
        let len = self.len(body_len);
        buf.reserve(1 + varint_len(len as u64) + len);
        let mut head = Fields::new();
        head.put_u8(key(FRAME_ENVELOPES, LENGTH_DELIMITED));
        head.put_varint(len as u64);
        head.varint_field(KIND, self.kind as i32 as u64);
        head.bytes_field(TO, self.to);
        head.bytes_field(TYPE_NAME, self.type_name);
        if body_len > 0 {
            head.put_u8(key(BODY, LENGTH_DELIMITED));
            head.put_varint(body_len as u64);
        }
        head.write_to(buf);
        if body_len > 0 {
            let before = buf.len();
            body(buf);
            debug_assert_eq!(
                buf.len() - before,
                body_len,
                "the body is as long as announced"
            );
        }
        let mut tail = Fields::new();
        tail.varint_field(REQUEST_ID, self.request_id);
        tail.varint_field(ERROR_CODE, self.error_code as i64 as u64);
        tail.bytes_field(ERROR, self.error.as_bytes());
        tail.write_to(buf);
    }
}

/// Encoded fields gathered on the stack, spilling to a `Vec` only past `STACK` bytes.
struct Fields {
    stack: [u8; Fields::STACK],
    len: usize,
    spilled: Vec<u8>,
}

impl Fields {
    const STACK: usize = 128;

    #[inline]
    fn new() -> Self {
        Fields {
            stack: [0; Fields::STACK],
            len: 0,
            spilled: Vec::new(),
        }
    }

    #[inline]
    fn put_slice(&mut self, bytes: &[u8]) {
        match self.stack.get_mut(self.len..self.len + bytes.len()) {
            Some(room) if self.spilled.is_empty() => {
                room.copy_from_slice(bytes);
                self.len += bytes.len();
            }
            _ => {
                if self.spilled.is_empty() {
                    self.spilled.extend_from_slice(&self.stack[..self.len]);
                }
                self.spilled.extend_from_slice(bytes);
            }
        }
    }

    #[inline]
    fn put_u8(&mut self, byte: u8) {
        self.put_slice(&[byte]);
    }

    #[inline]
    fn put_varint(&mut self, mut value: u64) {
        let mut bytes = [0u8; 10];
        let mut n = 0;
        while value >= 0x80 {
            bytes[n] = (value as u8) | 0x80;
            value >>= 7;
            n += 1;
        }
        bytes[n] = value as u8;
        self.put_slice(&bytes[..=n]);
    }

    #[inline]
    fn varint_field(&mut self, field: u64, value: u64) {
        if value != 0 {
            self.put_u8(key(field, VARINT));
            self.put_varint(value);
        }
    }

    #[inline]
    fn bytes_field(&mut self, field: u64, bytes: &[u8]) {
        if !bytes.is_empty() {
            self.put_u8(key(field, LENGTH_DELIMITED));
            self.put_varint(bytes.len() as u64);
            self.put_slice(bytes);
        }
    }

    #[inline]
    fn as_slice(&self) -> &[u8] {
        if self.spilled.is_empty() {
            &self.stack[..self.len]
        } else {
            &self.spilled
        }
    }

    #[inline]
    fn write_to(&self, buf: &mut BytesMut) {
        buf.extend_from_slice(self.as_slice());
    }
}

/// A frame that carries only `hello`: who is connecting.
pub(crate) fn hello_frame(node: &str) -> Bytes {
    // Hello { node = 1 }.
    let mut hello = Fields::new();
    hello.bytes_field(1, node.as_bytes());
    let hello = hello.as_slice();
    let mut frame = Fields::new();
    frame.put_u8(key(FRAME_HELLO, LENGTH_DELIMITED));
    frame.put_varint(hello.len() as u64);
    frame.put_slice(hello);
    let mut buf = BytesMut::new();
    frame.write_to(&mut buf);
    buf.freeze()
}

/// One envelope read from a frame: its fields, borrowed from the frame's bytes.
#[derive(Debug, Clone, Default)]
pub(crate) struct EnvelopeRef<'a> {
    pub(crate) kind: i32,
    pub(crate) to: &'a [u8],
    pub(crate) type_name: &'a [u8],
    /// Where the body lies in the frame, to slice it out without a copy.
    pub(crate) body: Range<usize>,
    pub(crate) request_id: u64,
    pub(crate) error_code: i32,
    pub(crate) error: &'a [u8],
}

/// What a frame holds, element by element.
#[derive(Debug)]
pub(crate) enum Item<'a> {
    /// The greeting, with the connecting node's address (not checked to be UTF-8 here).
    Hello(&'a [u8]),
    /// One envelope.
    Envelope(EnvelopeRef<'a>),
    /// An envelope that is not a well-formed `Envelope`: it is skipped, the frame goes on.
    /// What the reader knows of it (a request id, if it got that far) comes with it.
    Malformed {
        /// The request id, if one was read before the fault (so the asker can be told).
        request_id: u64,
    },
}

/// Walks the elements of one received frame. A frame whose own structure is broken (a length
/// past its end, an unknown wire type) ends the walk with one [`FrameError`]; everything read
/// before it stands.
#[derive(Debug)]
pub(crate) struct Envelopes<'a> {
    frame: &'a [u8],
    at: usize,
    broken: bool,
}

/// A frame that could not be read to its end: the rest of it is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FrameError {
    /// Where in the frame the fault is.
    pub(crate) offset: usize,
}

impl<'a> Envelopes<'a> {
    pub(crate) fn new(frame: &'a [u8]) -> Self {
        Envelopes {
            frame,
            at: 0,
            broken: false,
        }
    }
}

impl<'a> Iterator for Envelopes<'a> {
    type Item = Result<Item<'a>, FrameError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.broken || self.at >= self.frame.len() {
            return None;
        }
        let start = self.at;
        let item = read_item(self.frame, &mut self.at);
        if item.is_none() {
            self.broken = true;
        }
        Some(item.ok_or(FrameError { offset: start }))
    }
}

/// Reads one frame element at `*at`; `None` if the frame's own structure is broken there.
fn read_item<'a>(frame: &'a [u8], at: &mut usize) -> Option<Item<'a>> {
    loop {
        let key = read_varint(frame, at)?;
        let wire_type = (key & 7) as u8;
        match (key >> 3, wire_type) {
            (FRAME_ENVELOPES, LENGTH_DELIMITED) => {
                let range = read_delimited(frame, at)?;
                let offset = range.start;
                return Some(match read_envelope(&frame[range], offset) {
                    Ok(envelope) => Item::Envelope(envelope),
                    Err(request_id) => Item::Malformed { request_id },
                });
            }
            (FRAME_HELLO, LENGTH_DELIMITED) => {
                let range = read_delimited(frame, at)?;
                let hello = &frame[range];
                // Hello { node = 1 }; other fields are skipped.
                let mut i = 0;
                let mut node: &[u8] = &[];
                while i < hello.len() {
                    let key = read_varint(hello, &mut i)?;
                    if key == u64::from(self::key(1, LENGTH_DELIMITED)) {
                        node = &hello[read_delimited(hello, &mut i)?];
                    } else {
                        skip(hello, &mut i, (key & 7) as u8)?;
                    }
                }
                return Some(Item::Hello(node));
            }
            (_, wire_type) => skip(frame, at, wire_type)?,
        }
    }
}

/// Reads one envelope's fields from `bytes`, which start at `offset` in the frame. A fault
/// answers the request id read so far (0 if none).
fn read_envelope(bytes: &[u8], offset: usize) -> Result<EnvelopeRef<'_>, u64> {
    let mut envelope = EnvelopeRef::default();
    let mut at = 0;
    while at < bytes.len() {
        let Some(key) = read_varint(bytes, &mut at) else {
            return Err(envelope.request_id);
        };
        let wire_type = (key & 7) as u8;
        let read = match (key >> 3, wire_type) {
            (KIND, VARINT) => read_varint(bytes, &mut at).map(|v| envelope.kind = v as i32),
            (REQUEST_ID, VARINT) => read_varint(bytes, &mut at).map(|v| envelope.request_id = v),
            (ERROR_CODE, VARINT) => {
                read_varint(bytes, &mut at).map(|v| envelope.error_code = v as i32)
            }
            (TO, LENGTH_DELIMITED) => {
                read_delimited(bytes, &mut at).map(|range| envelope.to = &bytes[range])
            }
            (TYPE_NAME, LENGTH_DELIMITED) => {
                read_delimited(bytes, &mut at).map(|range| envelope.type_name = &bytes[range])
            }
            (BODY, LENGTH_DELIMITED) => read_delimited(bytes, &mut at)
                .map(|range| envelope.body = offset + range.start..offset + range.end),
            (ERROR, LENGTH_DELIMITED) => {
                read_delimited(bytes, &mut at).map(|range| envelope.error = &bytes[range])
            }
            (KIND | REQUEST_ID | ERROR_CODE | TO | TYPE_NAME | BODY | ERROR, _) => None,
            (_, wire_type) => skip(bytes, &mut at, wire_type),
        };
        if read.is_none() {
            return Err(envelope.request_id);
        }
    }
    Ok(envelope)
}

/// tonic's codec for the link: frames go out as the bytes they were encoded to, and come in as
/// the bytes that arrived (a slice of tonic's buffer, not a copy).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct FrameCodec;

impl Codec for FrameCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = FrameCodec;
    type Decoder = FrameCodec;

    fn encoder(&mut self) -> Self::Encoder {
        FrameCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        FrameCodec
    }
}

impl Encoder for FrameCodec {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for FrameCodec {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

#[cfg(test)]
mod tests {
    use muster_proto::transport::{Envelope, Frame, Hello};
    use prost::Message as _;

    use super::*;

    fn append(buf: &mut BytesMut, writer: &EnvelopeWriter<'_>, body: &[u8]) {
        let before = buf.len();
        writer.append(buf, body.len(), |buf| buf.put_slice(body));
        assert_eq!(buf.len() - before, writer.framed_len(body.len()));
    }

    #[test]
    fn appended_envelopes_are_a_frame_prost_reads() {
        let mut buf = BytesMut::new();
        buf.put_slice(&hello_frame("10.0.0.1:7000"));
        let long_body = vec![7u8; 300];
        append(
            &mut buf,
            &EnvelopeWriter::new(Kind::Tell, b"sink", b"a.B", 0),
            b"xy",
        );
        append(
            &mut buf,
            &EnvelopeWriter::new(Kind::Ask, b"echo", b"a.C", u64::MAX),
            &long_body,
        );
        append(
            &mut buf,
            &EnvelopeWriter {
                error_code: 4,
                error: "5/4",
                ..EnvelopeWriter::new(Kind::Error, b"", b"", 3)
            },
            b"",
        );
        let frame = Frame::decode(&buf[..]).expect("a valid frame");
        assert_eq!(
            frame.hello,
            Some(Hello {
                node: "10.0.0.1:7000".into()
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
    fn long_names_spill_off_the_stack_and_still_encode() {
        let mut buf = BytesMut::new();
        let name = vec![b'n'; 300];
        append(
            &mut buf,
            &EnvelopeWriter::new(Kind::Tell, &name, &name, 1),
            b"body",
        );
        let frame = Frame::decode(&buf[..]).expect("a valid frame");
        assert_eq!(&frame.envelopes[0].to[..], &name[..]);
        assert_eq!(&frame.envelopes[0].type_name[..], &name[..]);
        assert_eq!(&frame.envelopes[0].body[..], b"body");
    }

    #[test]
    fn frames_prost_writes_are_read_back() {
        let frame = Frame {
            hello: Some(Hello { node: "n:1".into() }),
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
        assert!(matches!(items[0], Ok(Item::Hello(b"n:1"))));
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
    fn a_malformed_envelope_is_skipped_and_the_frame_goes_on() {
        let mut buf = BytesMut::new();
        // An envelope whose request id is read, then a `to` that claims more bytes than the
        // envelope has.
        buf.put_slice(&[key(FRAME_ENVELOPES, LENGTH_DELIMITED), 4]);
        buf.put_slice(&[key(REQUEST_ID, VARINT), 9, key(TO, LENGTH_DELIMITED), 50]);
        append(
            &mut buf,
            &EnvelopeWriter::new(Kind::Tell, b"sink", b"a.B", 0),
            b"ok",
        );
        let items: Vec<_> = Envelopes::new(&buf).collect();
        assert!(matches!(items[0], Ok(Item::Malformed { request_id: 9 })));
        assert!(matches!(&items[1], Ok(Item::Envelope(e)) if e.to == b"sink"));
        assert_eq!(items.len(), 2);
    }

    #[test]
    fn a_broken_frame_ends_with_an_error_after_what_was_read() {
        let mut buf = BytesMut::new();
        append(
            &mut buf,
            &EnvelopeWriter::new(Kind::Tell, b"sink", b"a.B", 0),
            b"ok",
        );
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
        buf.put_slice(&hello_frame("node:1"));
        append(
            &mut buf,
            &EnvelopeWriter::new(Kind::Ask, b"echo", b"a.C", 1 << 40),
            &[1, 2, 3],
        );
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
            let mut fields = Fields::new();
            fields.put_varint(value);
            let buf = fields.as_slice();
            assert_eq!(buf.len(), varint_len(value), "{value}");
            let mut at = 0;
            assert_eq!(read_varint(buf, &mut at), Some(value));
            assert_eq!(at, buf.len());
        }
    }
}
