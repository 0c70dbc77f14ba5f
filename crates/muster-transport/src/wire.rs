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
//!
//! A tell that follows a tell with the same head (kind, process and type) in one frame leaves
//! its head out and sets `same_head` instead, once the peer has said it reads that
//! (`Hello.reads_same_head` one way, the `muster-same-head` response header the other): the
//! reader fills the head in from the envelope before it.

use std::ops::{Range, RangeInclusive};
use std::sync::atomic::{AtomicU64, Ordering};

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
const SAME_HEAD: u64 = 8;

/// `Hello` field numbers.
const HELLO_NODE: u64 = 1;
const HELLO_READS_SAME_HEAD: u64 = 2;
const HELLO_VERSION: u64 = 3;
const HELLO_OLDEST_PROTOCOL: u64 = 4;
const HELLO_NEWEST_PROTOCOL: u64 = 5;

/// The response header by which the accepting node of a link says it reads `same_head`.
pub(crate) const SAME_HEAD_HEADER: &str = "muster-same-head";

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

/// The fields an envelope's body follows (its kind, the process it is for and the type of its
/// body), encoded. Every message of one type to one process starts with the same bytes, so a
/// sender that sends many keeps its head and copies it into each envelope in one go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EnvelopeHead {
    kind: Kind,
    /// Unique among the heads this process made (never 0): two envelopes in a row with the same
    /// id have the same head, which a link compares in one step rather than byte by byte.
    id: u64,
    bytes: Box<[u8]>,
}

/// The next [`EnvelopeHead::id`].
static NEXT_HEAD_ID: AtomicU64 = AtomicU64::new(1);

impl EnvelopeHead {
    /// The head of envelopes of `kind` for `to`, carrying `type_name` bodies.
    pub(crate) fn new(kind: Kind, to: &[u8], type_name: &[u8]) -> Self {
        let kind_value = kind as i32 as u64;
        let mut bytes = Vec::with_capacity(
            varint_field_len(kind_value)
                + bytes_field_len(to.len())
                + bytes_field_len(type_name.len()),
        );
        put_varint_field(&mut bytes, KIND, kind_value);
        put_bytes_field(&mut bytes, TO, to);
        put_bytes_field(&mut bytes, TYPE_NAME, type_name);
        EnvelopeHead {
            kind,
            id: NEXT_HEAD_ID.fetch_add(1, Ordering::Relaxed),
            bytes: bytes.into_boxed_slice(),
        }
    }

    /// What the envelopes are.
    pub(crate) fn kind(&self) -> Kind {
        self.kind
    }

    /// Which head this is: equal ids, equal heads.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }
}

/// One envelope to append to a frame: everything but the body, which the caller encodes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EnvelopeWriter<'a> {
    pub(crate) head: &'a EnvelopeHead,
    pub(crate) request_id: u64,
    pub(crate) error_code: i32,
    pub(crate) error: &'a str,
}

impl<'a> EnvelopeWriter<'a> {
    /// An envelope that starts with `head`.
    pub(crate) fn new(head: &'a EnvelopeHead, request_id: u64) -> Self {
        EnvelopeWriter {
            head,
            request_id,
            error_code: 0,
            error: "",
        }
    }

    /// What the envelope is.
    pub(crate) fn kind(&self) -> Kind {
        self.head.kind
    }

    /// The envelope's encoded length with a body of `body_len` bytes, its head written out or
    /// replaced by `same_head` (fields at their default value are left out, as prost leaves
    /// them out).
    fn len(&self, body_len: usize, same_head: bool) -> usize {
        let head = if same_head {
            varint_field_len(1)
        } else {
            self.head.bytes.len()
        };
        head + bytes_field_len(body_len)
            + varint_field_len(self.request_id)
            + varint_field_len(self.error_code as i64 as u64)
            + bytes_field_len(self.error.len())
    }

    /// Bytes this envelope adds to a frame with a body of `body_len` bytes.
    fn framed_len(&self, body_len: usize, same_head: bool) -> usize {
        let len = self.len(body_len, same_head);
        1 + varint_len(len as u64) + len
    }

    /// Appends the envelope to the frame in `buf` as one more element of `envelopes`;
    /// `body` writes exactly `body_len` bytes. With `same_head` the head is left out and the
    /// envelope says it repeats the one before it (the caller knows it does, and that the
    /// peer reads it). Room for the whole envelope is reserved once.
    pub(crate) fn append(
        &self,
        buf: &mut BytesMut,
        same_head: bool,
        body_len: usize,
        body: impl FnOnce(&mut BytesMut),
    ) {
        buf.reserve(self.framed_len(body_len, same_head));
        buf.put_u8(key(FRAME_ENVELOPES, LENGTH_DELIMITED));
        put_varint(buf, self.len(body_len, same_head) as u64);
        if same_head {
            put_varint_field(buf, SAME_HEAD, 1);
        } else {
            buf.put_slice(&self.head.bytes);
        }
        if body_len > 0 {
            buf.put_u8(key(BODY, LENGTH_DELIMITED));
            put_varint(buf, body_len as u64);
            let before = buf.len();
            body(buf);
            debug_assert_eq!(
                buf.len() - before,
                body_len,
                "the body is as long as announced"
            );
        }
        put_varint_field(buf, REQUEST_ID, self.request_id);
        put_varint_field(buf, ERROR_CODE, self.error_code as i64 as u64);
        put_bytes_field(buf, ERROR, self.error.as_bytes());
    }
}

/// Bytes of a length-delimited field of `len` bytes (none when empty: the default is left out).
const fn bytes_field_len(len: usize) -> usize {
    if len == 0 {
        0
    } else {
        1 + varint_len(len as u64) + len
    }
}

/// Bytes of a varint field holding `value` (none for 0).
const fn varint_field_len(value: u64) -> usize {
    if value == 0 { 0 } else { 1 + varint_len(value) }
}

fn put_varint(buf: &mut impl BufMut, value: u64) {
    prost::encoding::encode_varint(value, buf);
}

fn put_varint_field(buf: &mut impl BufMut, field: u64, value: u64) {
    if value != 0 {
        buf.put_u8(key(field, VARINT));
        put_varint(buf, value);
    }
}

fn put_bytes_field(buf: &mut impl BufMut, field: u64, bytes: &[u8]) {
    if !bytes.is_empty() {
        buf.put_u8(key(field, LENGTH_DELIMITED));
        put_varint(buf, bytes.len() as u64);
        buf.put_slice(bytes);
    }
}

/// A frame that carries only `hello`: who is connecting, and that it reads `same_head`.
pub(crate) fn hello_frame(node: &str, version: &str, protocols: &RangeInclusive<u32>) -> Bytes {
    let (oldest, newest) = (u64::from(*protocols.start()), u64::from(*protocols.end()));
    let hello_len = bytes_field_len(node.len())
        + varint_field_len(1)
        + bytes_field_len(version.len())
        + varint_field_len(oldest)
        + varint_field_len(newest);
    let mut frame = BytesMut::with_capacity(1 + varint_len(hello_len as u64) + hello_len);
    frame.put_u8(key(FRAME_HELLO, LENGTH_DELIMITED));
    put_varint(&mut frame, hello_len as u64);
    put_bytes_field(&mut frame, HELLO_NODE, node.as_bytes());
    put_varint_field(&mut frame, HELLO_READS_SAME_HEAD, 1);
    put_bytes_field(&mut frame, HELLO_VERSION, version.as_bytes());
    put_varint_field(&mut frame, HELLO_OLDEST_PROTOCOL, oldest);
    put_varint_field(&mut frame, HELLO_NEWEST_PROTOCOL, newest);
    frame.freeze()
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
    /// The head (kind, to, type name) was left out: it is the head of the envelope before it
    /// in the frame, filled in here.
    pub(crate) same_head: bool,
}

/// A connecting node's greeting, read from its first frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HelloRef<'a> {
    /// Its listen address (not checked to be UTF-8 here).
    pub(crate) node: &'a [u8],
    /// It reads envelopes with `same_head` set.
    pub(crate) reads_same_head: bool,
    /// Its build (empty from a node before versions were said).
    pub(crate) version: &'a [u8],
    /// The wire protocols it speaks (0 both from a node before versions were said: it speaks
    /// protocol 1).
    pub(crate) protocols: (u64, u64),
}

/// What a frame holds, element by element.
#[derive(Debug)]
pub(crate) enum Item<'a> {
    /// The greeting.
    Hello(HelloRef<'a>),
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
    /// The head of the envelope read last, for one that says it has the same; `None` at the
    /// start and after a malformed envelope.
    previous: Option<Head<'a>>,
}

/// An envelope's kind, process and type name.
type Head<'a> = (i32, &'a [u8], &'a [u8]);

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
            previous: None,
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
        let item = match read_item(self.frame, &mut self.at) {
            Some(Item::Envelope(envelope)) => self.fill_head(envelope),
            Some(item) => item,
            None => {
                self.broken = true;
                return Some(Err(FrameError { offset: start }));
            }
        };
        if let Item::Malformed { .. } = item {
            self.previous = None;
        }
        Some(Ok(item))
    }
}

impl<'a> Envelopes<'a> {
    /// Gives an envelope with `same_head` the head of the one before it (malformed if there is
    /// none), and remembers the head for the next.
    fn fill_head(&mut self, mut envelope: EnvelopeRef<'a>) -> Item<'a> {
        if envelope.same_head {
            let Some((kind, to, type_name)) = self.previous else {
                return Item::Malformed {
                    request_id: envelope.request_id,
                };
            };
            envelope.kind = kind;
            envelope.to = to;
            envelope.type_name = type_name;
        }
        self.previous = Some((envelope.kind, envelope.to, envelope.type_name));
        Item::Envelope(envelope)
    }
}

/// `frame` with every envelope's head written out: for a peer that does not read `same_head`.
/// A frame encoded while the link's peer read it is sent this way if the link has since
/// reconnected to a peer that has not (yet) said so. Anything that is not a well-formed
/// envelope is copied as it is (this node wrote the frame, so there is none).
pub(crate) fn expand_same_heads(frame: &[u8]) -> BytesMut {
    let mut expanded = BytesMut::with_capacity(frame.len().saturating_mul(2));
    // The walk fills each repeated head in; only those envelopes are written anew.
    let mut envelopes = Envelopes::new(frame);
    loop {
        let start = envelopes.at;
        match envelopes.next() {
            None => break,
            Some(Ok(Item::Envelope(envelope))) if envelope.same_head => {
                let kind = Kind::try_from(envelope.kind).unwrap_or(Kind::Unspecified);
                let head = EnvelopeHead::new(kind, envelope.to, envelope.type_name);
                let body = &frame[envelope.body.clone()];
                let writer = EnvelopeWriter {
                    head: &head,
                    request_id: envelope.request_id,
                    error_code: envelope.error_code,
                    error: std::str::from_utf8(envelope.error).unwrap_or_default(),
                };
                writer.append(&mut expanded, false, body.len(), |buf| buf.put_slice(body));
            }
            Some(Ok(_)) => expanded.put_slice(&frame[start..envelopes.at]),
            Some(Err(_)) => {
                expanded.put_slice(&frame[start..]);
                break;
            }
        }
    }
    expanded
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
                // Other fields than these are skipped.
                let mut i = 0;
                let mut read = HelloRef {
                    node: &[],
                    reads_same_head: false,
                    version: &[],
                    protocols: (0, 0),
                };
                while i < hello.len() {
                    let key = read_varint(hello, &mut i)?;
                    match (key >> 3, (key & 7) as u8) {
                        (HELLO_NODE, LENGTH_DELIMITED) => {
                            read.node = &hello[read_delimited(hello, &mut i)?];
                        }
                        (HELLO_READS_SAME_HEAD, VARINT) => {
                            read.reads_same_head = read_varint(hello, &mut i)? != 0;
                        }
                        (HELLO_VERSION, LENGTH_DELIMITED) => {
                            read.version = &hello[read_delimited(hello, &mut i)?];
                        }
                        (HELLO_OLDEST_PROTOCOL, VARINT) => {
                            read.protocols.0 = read_varint(hello, &mut i)?;
                        }
                        (HELLO_NEWEST_PROTOCOL, VARINT) => {
                            read.protocols.1 = read_varint(hello, &mut i)?;
                        }
                        (_, wire_type) => skip(hello, &mut i, wire_type)?,
                    }
                }
                return Some(Item::Hello(read));
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
            (SAME_HEAD, VARINT) => read_varint(bytes, &mut at).map(|v| envelope.same_head = v != 0),
            (KIND | REQUEST_ID | ERROR_CODE | TO | TYPE_NAME | BODY | ERROR | SAME_HEAD, _) => None,
            (_, wire_type) => skip(bytes, &mut at, wire_type),
        };
        if read.is_none() {
            return Err(envelope.request_id);
        }
    }
    Ok(envelope)
}

/// One body in a received frame, read as a [`Buf`] without taking a reference to the frame:
/// a `bytes` field of the message it decodes to is sliced out of the frame (no copy), and a
/// message without one never touches the frame's reference count.
#[derive(Debug)]
pub(crate) struct FrameSlice<'a> {
    frame: &'a Bytes,
    at: usize,
    end: usize,
}

impl<'a> FrameSlice<'a> {
    /// The bytes of `frame` in `range`.
    ///
    /// # Panics
    /// If `range` is not within the frame (the reader only makes ranges it checked).
    pub(crate) fn new(frame: &'a Bytes, range: Range<usize>) -> Self {
        assert!(
            range.start <= range.end && range.end <= frame.len(),
            "a body within its frame"
        );
        FrameSlice {
            frame,
            at: range.start,
            end: range.end,
        }
    }
}

impl Buf for FrameSlice<'_> {
    fn remaining(&self) -> usize {
        self.end - self.at
    }

    fn chunk(&self) -> &[u8] {
        &self.frame[self.at..self.end]
    }

    fn advance(&mut self, cnt: usize) {
        assert!(cnt <= self.remaining(), "advance past the end of a body");
        self.at += cnt;
    }

    fn copy_to_bytes(&mut self, len: usize) -> Bytes {
        assert!(len <= self.remaining(), "read past the end of a body");
        let bytes = self.frame.slice(self.at..self.at + len);
        self.at += len;
        bytes
    }
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
mod tests;
