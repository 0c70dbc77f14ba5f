//! [`PeerLink`]: the outgoing frames, pending asks and remote links for one peer node, and the
//! stream that carries the frames over the link's tonic stream.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use futures_util::Stream;
use muster_proto::transport::{Envelope, ErrorCode, Kind};
use muster_security::Role;
use tokio::sync::futures::Notified;
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

use crate::stats::Stats;
use crate::sync::lock;
use crate::wire::{EnvelopeHead, EnvelopeWriter, expand_same_heads};
use muster_actor::{ExitReason, ProcessRef, RemoteError, Upid};

/// What an ask's caller receives: the reply or error envelope, or why none will come.
pub(crate) type AskOutcome = Result<Envelope, RemoteError>;

/// Tells a linked local process that a remote process is gone.
pub(crate) type RemoteWatcher = Box<dyn Fn(ProcessRef, ExitReason) + Send + Sync>;

/// How a link batches and bounds what it sends.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Envelopes queued at most ([`NodeConfig::max_queued_per_peer`](super::NodeConfig)).
    pub(crate) max_queued: usize,
    /// Envelopes per frame at most.
    pub(crate) max_batch: usize,
    /// A frame takes no more envelopes once its bodies add up to this many bytes.
    pub(crate) max_batch_bytes: usize,
}

/// Where an envelope went in a link's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Queued {
    /// Into the frame being filled, or a first one.
    Flowing,
    /// Into a new frame while an earlier full one still waits: the writer has fallen behind
    /// (or has not had a turn on its worker thread).
    Behind,
}

/// One peer node, as seen from this node.
pub(crate) struct PeerLink {
    /// The peer's listen address, `host:port`.
    pub(crate) node: String,
    /// What waits to be sent, already encoded.
    outbox: Mutex<Outbox>,
    limits: Limits,
    /// Asks sent to the peer and not yet answered, by request id.
    pending: Mutex<HashMap<u64, oneshot::Sender<AskOutcome>>>,
    /// Set for good by [`close`](PeerLink::close): the link will never carry anything again.
    /// Written under the `pending` lock, so an ask that registers under that lock and still
    /// sees it unset is failed by the close.
    closed: AtomicBool,
    /// Local processes linked to processes on the peer.
    watchers: Mutex<Vec<(Upid, RemoteWatcher)>>,
    /// Woken when a full queue gives up a frame to the writer, or the link closes: senders
    /// waiting for room ([`RemotePid::send`](crate::RemotePid::send)) try again.
    room: Notify,
    /// The peer said it reads `same_head` on the link's current connection: a tell that follows
    /// a tell with the same head in a frame leaves its head out. Cleared when a connection is
    /// lost; a frame encoded with `same_head` and written while it is clear is written out
    /// whole.
    peer_reads_same_head: AtomicBool,
    /// The node's counters (tells dropped as expired are counted here).
    stats: Arc<Stats>,
}

/// The queue of a link: frames encoded as envelopes arrive, oldest first. The last frame fills
/// until it reaches a batch limit or the writer takes it, so a writer that wakes finds
/// everything queued since its last write in one frame (or a few, past the limits), with no
/// per-envelope work left but a copy into tonic's buffer.
#[derive(Default)]
struct Outbox {
    frames: VecDeque<Batch>,
    /// Envelopes in `frames`.
    queued: usize,
    /// The stream that writes this link's current connection; a stream of an older
    /// connection ([`PeerLink::frames`] made it) stops taking frames.
    generation: u64,
    /// That stream, parked until something is queued.
    writer: Option<Waker>,
    /// Connections lost (or attempts failed) so far: a tell queued for the connection of the
    /// moment ([`PeerLink::send`] with an expiry) is dropped once this has moved on.
    losses: u64,
    /// The size of the last frame taken: a new frame is allocated that large, so a busy link
    /// does not grow each frame by doubling.
    last_frame: usize,
}

/// Bounds on the room a new frame is allocated with (it grows past the upper one as needed).
const FRAME_ROOM: std::ops::RangeInclusive<usize> = 256..=256 * 1024;

/// One frame being filled: its bytes are the `envelopes` field of a `Frame`.
#[derive(Default)]
struct Batch {
    bytes: BytesMut,
    envelopes: usize,
    body_bytes: usize,
    /// The asks in it (where their bytes are, and their ids): one whose caller has been told
    /// it failed by the time the frame is written is cut out.
    asks: Vec<(Range<usize>, u64)>,
    /// The [`EnvelopeHead::id`] of the last envelope if it was a tell, else 0. Only asks are
    /// ever cut out of a frame, and a tell never repeats an ask's head, so a head a tell
    /// repeats always reaches the peer.
    last_tell_head: u64,
    /// Some envelope in it has `same_head` set.
    same_heads: bool,
    /// The tells in it that expire (where their bytes are, and when): one past its deadline,
    /// or queued before a connection loss, is cut out when the frame is written. Such a tell
    /// neither leaves its head out nor lends it to the next, so cutting it out loses no head.
    expiring: Vec<(Range<usize>, Expiry)>,
}

/// When a tell is no longer worth sending: past `deadline`, or once the link has lost the
/// connection it was queued for (`losses` has moved on). It is then dropped unwritten instead
/// of being carried to the next connection.
#[derive(Debug, Clone, Copy)]
struct Expiry {
    deadline: Instant,
    losses: u64,
}

impl Expiry {
    fn passed(&self, now: Instant, losses: u64) -> bool {
        now >= self.deadline || losses != self.losses
    }
}

impl PeerLink {
    pub(crate) fn new(node: String, limits: Limits, stats: Arc<Stats>) -> Arc<Self> {
        Arc::new(PeerLink {
            node,
            outbox: Mutex::new(Outbox::default()),
            limits: Limits {
                max_queued: limits.max_queued.max(1),
                // At least one envelope per frame, whatever the config says.
                max_batch: limits.max_batch.max(1),
                max_batch_bytes: limits.max_batch_bytes,
            },
            pending: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
            watchers: Mutex::new(Vec::new()),
            room: Notify::new(),
            peer_reads_same_head: AtomicBool::new(false),
            stats,
        })
    }

    /// Records whether the peer reads `same_head` on the link's current connection (from its
    /// hello, or its answer to ours); cleared when a connection is lost.
    pub(crate) fn set_peer_reads_same_head(&self, reads: bool) {
        self.peer_reads_same_head.store(reads, Ordering::Relaxed);
    }

    /// Resolves once the queue may have room again (a frame left it or the link closed); a
    /// sender enables it before trying, so that a frame taken in between still wakes it.
    pub(crate) fn room(&self) -> Notified<'_> {
        self.room.notified()
    }

    /// Queues an envelope for the peer: `envelope` with a body of `body_len` bytes that
    /// `body` writes, appended to the frame being filled. A tell with `expires` is dropped
    /// unwritten if its frame is not written by then, or if the connection of the moment is
    /// lost first: it never reaches a later connection.
    ///
    /// # Errors
    /// `ConnectionLost` once the link has closed for good, `QueueFull` past
    /// `max_queued_per_peer` envelopes.
    pub(crate) fn send(
        &self,
        envelope: &EnvelopeWriter<'_>,
        body_len: usize,
        expires: Option<Instant>,
        body: impl FnOnce(&mut BytesMut),
    ) -> Result<Queued, RemoteError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(RemoteError::ConnectionLost(self.node.clone()));
        }
        let (writer, queued) = {
            let mut outbox = lock(&self.outbox);
            if outbox.queued >= self.limits.max_queued {
                return Err(RemoteError::QueueFull(self.node.clone()));
            }
            let full = |batch: &Batch| {
                batch.envelopes >= self.limits.max_batch
                    || batch.body_bytes >= self.limits.max_batch_bytes
            };
            let mut queued = Queued::Flowing;
            if outbox.frames.back().is_none_or(full) {
                if !outbox.frames.is_empty() {
                    queued = Queued::Behind;
                }
                let room = outbox
                    .last_frame
                    .clamp(*FRAME_ROOM.start(), *FRAME_ROOM.end());
                outbox.frames.push_back(Batch {
                    bytes: BytesMut::with_capacity(room),
                    ..Batch::default()
                });
            }
            outbox.queued += 1;
            let losses = outbox.losses;
            let Some(batch) = outbox.frames.back_mut() else {
                unreachable!("a batch was pushed above");
            };
            let start = batch.bytes.len();
            let tell_head = if envelope.kind() == Kind::Tell && expires.is_none() {
                envelope.head.id()
            } else {
                0
            };
            let same_head = tell_head != 0
                && batch.last_tell_head == tell_head
                && self.peer_reads_same_head.load(Ordering::Relaxed);
            envelope.append(&mut batch.bytes, same_head, body_len, body);
            batch.last_tell_head = tell_head;
            batch.same_heads |= same_head;
            if let Some(deadline) = expires {
                let expiry = Expiry { deadline, losses };
                batch.expiring.push((start..batch.bytes.len(), expiry));
            }
            if envelope.kind() == Kind::Ask {
                batch
                    .asks
                    .push((start..batch.bytes.len(), envelope.request_id));
            }
            batch.envelopes += 1;
            batch.body_bytes += body_len;
            (outbox.writer.take(), queued)
        };
        if let Some(writer) = writer {
            writer.wake();
        }
        Ok(queued)
    }

    /// Answers the peer's ask `request_id` with an error.
    pub(crate) fn send_error(&self, request_id: u64, error: &RemoteError) {
        static ERROR_HEAD: LazyLock<EnvelopeHead> =
            LazyLock::new(|| EnvelopeHead::new(Kind::Error, b"", b""));
        let (code, detail) = encode_error(error);
        let envelope = EnvelopeWriter {
            error_code: code as i32,
            error: &detail,
            ..EnvelopeWriter::new(&ERROR_HEAD, request_id)
        };
        if let Err(e) = self.send(&envelope, 0, None, |_| {}) {
            tracing::warn!(peer = %self.node, request_id, error = %e, "could not send an error reply");
        }
    }

    /// Records an ask about to be sent; its answer arrives on the returned receiver.
    ///
    /// # Errors
    /// `ConnectionLost` if the link has closed for good.
    pub(crate) fn expect(
        &self,
        request_id: u64,
    ) -> Result<oneshot::Receiver<AskOutcome>, RemoteError> {
        let (tx, rx) = oneshot::channel();
        let mut pending = lock(&self.pending);
        if self.closed.load(Ordering::Acquire) {
            return Err(RemoteError::ConnectionLost(self.node.clone()));
        }
        pending.insert(request_id, tx);
        Ok(rx)
    }

    /// True once the link has closed for good.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Forgets an ask whose caller gave up.
    pub(crate) fn forget(&self, request_id: u64) {
        lock(&self.pending).remove(&request_id);
    }

    /// Hands a reply or error envelope to its ask; false if no ask waits for it.
    pub(crate) fn complete(&self, envelope: Envelope) -> bool {
        match lock(&self.pending).remove(&envelope.request_id) {
            Some(waiter) => {
                let _ = waiter.send(Ok(envelope));
                true
            }
            None => false,
        }
    }

    /// Runs `watcher` when the link to the peer is lost.
    pub(crate) fn watch(&self, upid: Upid, watcher: RemoteWatcher) {
        lock(&self.watchers).push((upid, watcher));
    }

    /// The link is gone or could not be made: every pending ask fails with `error`, and every
    /// linked process hears that its remote process's connection was lost.
    pub(crate) fn lost(&self, error: RemoteError) {
        self.fail(error, false);
    }

    /// As [`lost`](PeerLink::lost), and for good: later sends and asks fail at once.
    pub(crate) fn close(&self, error: RemoteError) {
        self.fail(error, true);
        // Nothing queued will be sent: let the writer see that and end.
        let writer = lock(&self.outbox).writer.take();
        if let Some(writer) = writer {
            writer.wake();
        }
        self.room.notify_waiters();
    }

    fn fail(&self, error: RemoteError, for_good: bool) {
        lock(&self.outbox).losses += 1;
        let pending = {
            let mut pending = lock(&self.pending);
            if for_good {
                self.closed.store(true, Ordering::Release);
            }
            std::mem::take(&mut *pending)
        };
        for (_, waiter) in pending {
            let _ = waiter.send(Err(error.clone()));
        }
        let watchers = std::mem::take(&mut *lock(&self.watchers));
        for (upid, watcher) in watchers {
            watcher(
                ProcessRef::Remote(upid),
                ExitReason::ConnectionLost {
                    node: self.node.clone(),
                },
            );
        }
    }

    /// The frames to write on a new connection of this link: the greeting `hello` if given
    /// (the connecting side's, [`hello_frame`]), then whatever is queued, as it is queued. Queued frames
    /// outlive a connection, so a reconnect picks up where the lost one stopped; the stream of
    /// an older connection ends once a newer one exists.
    pub(crate) fn frames(self: &Arc<Self>, hello: Option<Bytes>) -> Frames {
        let generation = {
            let mut outbox = lock(&self.outbox);
            outbox.generation += 1;
            // The older stream, if parked, wakes to see that it has been replaced.
            if let Some(writer) = outbox.writer.take() {
                writer.wake();
            }
            outbox.generation
        };
        Frames {
            link: Arc::clone(self),
            hello,
            generation,
        }
    }

    /// The next frame for the stream of `generation`: `Ready(None)` once that stream is
    /// replaced or the link is closed.
    fn poll_frame(&self, generation: u64, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        loop {
            let (batch, losses) = {
                let mut outbox = lock(&self.outbox);
                if outbox.generation != generation || self.closed.load(Ordering::Acquire) {
                    return Poll::Ready(None);
                }
                let losses = outbox.losses;
                let batch = match outbox.frames.pop_front() {
                    Some(batch) => {
                        let was_full = outbox.queued >= self.limits.max_queued;
                        outbox.queued -= batch.envelopes;
                        outbox.last_frame = batch.bytes.len();
                        if was_full {
                            self.room.notify_waiters();
                        }
                        batch
                    }
                    None => {
                        crate::sync::park(&mut outbox.writer, cx.waker());
                        return Poll::Pending;
                    }
                };
                (batch, losses)
            };
            if let Some(frame) = self.still_wanted(batch, losses) {
                return Poll::Ready(Some(frame));
            }
        }
    }

    /// The frame's bytes, less the asks whose callers were already told they failed (or gave
    /// up), which must not run behind their backs, and the tells that expired (`losses` is the
    /// link's count of lost connections now). `None` if nothing is left. Written out whole if
    /// it has `same_head` envelopes and the peer has not said, on this connection, that it
    /// reads them.
    fn still_wanted(&self, batch: Batch, losses: u64) -> Option<Bytes> {
        let expand = batch.same_heads && !self.peer_reads_same_head.load(Ordering::Relaxed);
        let frame = self.without_unwanted(batch, losses)?;
        Some(if expand {
            expand_same_heads(&frame).freeze()
        } else {
            frame
        })
    }

    /// The frame's bytes, less the asks whose callers were already told they failed (or gave
    /// up) and the tells that expired. `None` if nothing is left.
    fn without_unwanted(&self, batch: Batch, losses: u64) -> Option<Bytes> {
        let mut unwanted: Vec<Range<usize>> = if batch.asks.is_empty() {
            Vec::new()
        } else {
            let pending = lock(&self.pending);
            batch
                .asks
                .into_iter()
                .filter(|(_, id)| !pending.contains_key(id))
                .map(|(range, _)| range)
                .collect()
        };
        if !batch.expiring.is_empty() {
            let now = Instant::now();
            let expired = batch
                .expiring
                .into_iter()
                .filter(|(_, expiry)| expiry.passed(now, losses))
                .map(|(range, _)| range);
            let before = unwanted.len();
            unwanted.extend(expired);
            let dropped = unwanted.len() - before;
            if dropped > 0 {
                self.stats
                    .expired_tells
                    .fetch_add(dropped as u64, Ordering::Relaxed);
                tracing::debug!(peer = %self.node, dropped, "tells dropped unwritten: past their deadline or their connection");
                // Both lists are in frame order; together they must be too.
                unwanted.sort_unstable_by_key(|range| range.start);
            }
        }
        if unwanted.is_empty() {
            return Some(batch.bytes.freeze());
        }
        if unwanted.len() == batch.envelopes {
            return None;
        }
        let mut kept = BytesMut::with_capacity(batch.bytes.len());
        let mut at = 0;
        for range in unwanted {
            kept.extend_from_slice(&batch.bytes[at..range.start]);
            at = range.end;
        }
        kept.extend_from_slice(&batch.bytes[at..]);
        Some(kept.freeze())
    }
}

/// The stream of encoded frames one connection of a link writes ([`PeerLink::frames`]).
pub(crate) struct Frames {
    link: Arc<PeerLink>,
    hello: Option<Bytes>,
    generation: u64,
}

impl Stream for Frames {
    type Item = Bytes;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        if let Some(hello) = self.hello.take() {
            return Poll::Ready(Some(hello));
        }
        self.link.poll_frame(self.generation, cx)
    }
}

/// The wire form of an error: a code and a detail.
pub(crate) fn encode_error(error: &RemoteError) -> (ErrorCode, String) {
    match error {
        RemoteError::UnknownProcess(name) => (ErrorCode::UnknownProcess, name.clone()),
        RemoteError::UnknownType(name) => (ErrorCode::UnknownType, name.clone()),
        RemoteError::Malformed(detail) => (ErrorCode::Malformed, detail.clone()),
        RemoteError::Oversized { size, limit } => (ErrorCode::Oversized, format!("{size}/{limit}")),
        RemoteError::NoReply => (ErrorCode::NoReply, String::new()),
        RemoteError::Rejected(detail) => (ErrorCode::ProcessStopped, detail.clone()),
        RemoteError::Unauthorized(detail) => (ErrorCode::Unauthorized, detail.clone()),
        other => (ErrorCode::ProcessStopped, other.to_string()),
    }
}

/// Reads an error envelope back into a [`RemoteError`].
pub(crate) fn decode_error(envelope: &Envelope) -> RemoteError {
    let detail = envelope.error.clone();
    match ErrorCode::try_from(envelope.error_code) {
        Ok(ErrorCode::UnknownProcess) => RemoteError::UnknownProcess(detail),
        Ok(ErrorCode::UnknownType) => RemoteError::UnknownType(detail),
        Ok(ErrorCode::Malformed) => RemoteError::Malformed(detail),
        Ok(ErrorCode::Oversized) => {
            let mut numbers = detail.split('/').map(|n| n.parse().unwrap_or(0));
            RemoteError::Oversized {
                size: numbers.next().unwrap_or(0),
                limit: numbers.next().unwrap_or(0),
            }
        }
        Ok(ErrorCode::NoReply) => RemoteError::NoReply,
        Ok(ErrorCode::Unauthorized) => RemoteError::Unauthorized(detail),
        Ok(ErrorCode::ProcessStopped | ErrorCode::MailboxFull) => RemoteError::Rejected(detail),
        Ok(ErrorCode::Unspecified) | Err(_) => RemoteError::Malformed(format!(
            "error envelope with unknown code {}: {detail}",
            envelope.error_code
        )),
    }
}

/// The roles a node links with: the cluster's members. Client certificates (people, the CLI)
/// use the APIs, never the actor transport.
pub(crate) const MEMBER_ROLES: &[Role] = &[Role::Master, Role::Agent];

/// `frames`, each counted in `stats` as it is written.
pub(crate) fn counted(
    stats: &Arc<Stats>,
    frames: impl Stream<Item = Bytes> + Send + 'static,
) -> impl Stream<Item = Bytes> + Send + 'static {
    let stats = Arc::clone(stats);
    futures_util::StreamExt::inspect(frames, move |frame| {
        stats
            .bytes_sent
            .fetch_add(frame.len() as u64, Ordering::Relaxed);
    })
}

#[cfg(test)]
mod tests {
    use bytes::BufMut;

    use super::*;
    use crate::wire::{Envelopes, Item};

    /// A link whose limits the tests here never reach.
    fn roomy_link() -> Arc<PeerLink> {
        PeerLink::new(
            "peer:1".into(),
            Limits {
                max_queued: 100,
                max_batch: 100,
                max_batch_bytes: 1 << 20,
            },
            Arc::default(),
        )
    }

    /// The first frame `link` writes.
    fn first_frame(link: &Arc<PeerLink>) -> Bytes {
        let mut frames = link.frames(None);
        let mut cx = Context::from_waker(Waker::noop());
        let Poll::Ready(Some(frame)) = Pin::new(&mut frames).poll_next(&mut cx) else {
            panic!("a frame");
        };
        frame
    }

    /// Each envelope of `frame` as its `same_head` and process.
    fn heads(frame: &[u8]) -> Vec<(bool, &[u8])> {
        Envelopes::new(frame)
            .map(|item| match item {
                Ok(Item::Envelope(envelope)) => (envelope.same_head, envelope.to),
                other => panic!("an envelope: {other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_tell_repeats_the_head_before_it_only_to_a_peer_that_reads_it_and_never_an_asks() {
        let link = roomy_link();
        let to_sink = EnvelopeHead::new(Kind::Tell, b"sink", b"t");
        let to_other = EnvelopeHead::new(Kind::Tell, b"other", b"t");
        let ask = EnvelopeHead::new(Kind::Ask, b"sink", b"t");
        let send = |head: &EnvelopeHead, request_id: u64| {
            link.send(&EnvelopeWriter::new(head, request_id), 1, None, |buf| {
                buf.put_u8(1);
            })
            .map_err(|e| e.to_string())
        };
        let expected = link.expect(9);
        send(&to_sink, 0).and(send(&to_sink, 0)).expect("queued");
        link.set_peer_reads_same_head(true);
        for (head, request_id) in [
            (&to_sink, 0),
            (&ask, 9),
            (&to_sink, 0),
            (&to_sink, 0),
            (&to_other, 0),
        ] {
            send(head, request_id).expect("queued");
        }

        assert_eq!(
            heads(&first_frame(&link)),
            [
                (false, &b"sink"[..]),
                (false, b"sink"), // the peer had not said it reads them
                (true, b"sink"),
                (false, b"sink"), // the ask
                (false, b"sink"), // after an ask
                (true, b"sink"),
                (false, b"other"),
            ]
        );
        drop(expected);
    }

    #[test]
    fn a_frame_encoded_with_same_head_goes_out_whole_once_the_connection_it_was_for_is_lost() {
        let link = roomy_link();
        let head = EnvelopeHead::new(Kind::Tell, b"sink", b"t");
        link.set_peer_reads_same_head(true);
        for _ in 0..3 {
            link.send(&EnvelopeWriter::new(&head, 0), 1, None, |buf| buf.put_u8(1))
                .expect("queued");
        }
        // The connection is lost; the next one's peer has not answered yet.
        link.set_peer_reads_same_head(false);
        assert_eq!(heads(&first_frame(&link)), [(false, &b"sink"[..]); 3]);
    }

    /// Each envelope of `frame` as its body's first byte.
    fn bodies(frame: &[u8]) -> Vec<u8> {
        Envelopes::new(frame)
            .map(|item| match item {
                Ok(Item::Envelope(envelope)) => frame[envelope.body.start],
                other => panic!("an envelope: {other:?}"),
            })
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_tell_with_a_deadline_is_dropped_unwritten_once_it_passes_or_its_connection_is_lost()
    {
        let stats = Arc::new(Stats::default());
        let link = PeerLink::new(
            "peer:1".into(),
            Limits {
                max_queued: 100,
                max_batch: 100,
                max_batch_bytes: 1 << 20,
            },
            Arc::clone(&stats),
        );
        let head = EnvelopeHead::new(Kind::Tell, b"sink", b"t");
        link.set_peer_reads_same_head(true);
        let send = |body: u8, expires: Option<Instant>| {
            link.send(&EnvelopeWriter::new(&head, 0), 1, expires, |buf| {
                buf.put_u8(body);
            })
            .map_err(|e| e.to_string())
        };
        let soon = Instant::now() + std::time::Duration::from_secs(1);
        let later = Instant::now() + std::time::Duration::from_secs(60);
        send(1, None).expect("queued");
        send(2, Some(soon)).expect("queued");
        send(3, None).expect("queued");
        send(4, Some(later)).expect("queued");
        tokio::time::advance(std::time::Duration::from_secs(2)).await;
        // 2 is past its deadline; 3 wrote its head whole, as 2 lent it none.
        let frame = first_frame(&link);
        assert_eq!(bodies(&frame), [1, 3, 4]);
        assert_eq!(
            heads(&frame)
                .iter()
                .map(|(same, _)| *same)
                .collect::<Vec<_>>(),
            [false, false, false]
        );

        // Queued for the connection of the moment, which is then lost: dropped, while a
        // plain tell waits for the next connection.
        send(5, Some(later)).expect("queued");
        send(6, None).expect("queued");
        link.lost(RemoteError::ConnectionLost("peer:1".into()));
        send(7, Some(later)).expect("queued");
        assert_eq!(bodies(&first_frame(&link)), [6, 7]);
        assert_eq!(stats.snapshot().expired_tells, 2);
    }

    #[test]
    fn a_send_that_opens_a_frame_behind_a_waiting_one_says_the_writer_is_behind() {
        let link = PeerLink::new(
            "peer:1".into(),
            Limits {
                max_queued: 100,
                max_batch: 2,
                max_batch_bytes: 1 << 20,
            },
            Arc::default(),
        );
        let head = EnvelopeHead::new(Kind::Tell, b"p", b"t");
        let send = || {
            link.send(&EnvelopeWriter::new(&head, 0), 1, None, |buf| buf.put_u8(1))
                .map_err(|e| e.to_string())
        };
        assert_eq!(send(), Ok(Queued::Flowing), "the first frame");
        assert_eq!(send(), Ok(Queued::Flowing), "fills it");
        assert_eq!(
            send(),
            Ok(Queued::Behind),
            "a second frame while the first waits"
        );
        assert_eq!(send(), Ok(Queued::Flowing), "fills the second");

        // The writer takes both frames: the next send opens a frame with nothing before it.
        let mut frames = link.frames(None);
        let mut cx = Context::from_waker(Waker::noop());
        for _ in 0..2 {
            let frame = Pin::new(&mut frames).poll_next(&mut cx);
            assert!(matches!(frame, Poll::Ready(Some(_))), "a frame: {frame:?}");
        }
        assert_eq!(send(), Ok(Queued::Flowing), "caught up");
    }
}
