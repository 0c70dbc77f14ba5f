//! [`PeerLink`]: the queue, pending asks and remote links for one peer node, and the batching
//! stream that carries the queue over the link's tonic stream.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use futures_util::Stream;
use muster_proto::transport::{Envelope, ErrorCode, Frame, Hello, Kind};
use tokio::sync::{mpsc, oneshot};

use crate::sync::lock;
use crate::{ExitReason, ProcessRef, RemoteError, Upid};

/// What an ask's caller receives: the reply or error envelope, or why none will come.
pub(crate) type AskOutcome = Result<Envelope, RemoteError>;

/// Tells a linked local process that a remote process is gone.
pub(crate) type RemoteWatcher = Box<dyn Fn(ProcessRef, ExitReason) + Send + Sync>;

/// One peer node, as seen from this node.
pub(crate) struct PeerLink {
    /// The peer's listen address, `host:port`.
    pub(crate) node: String,
    tx: mpsc::Sender<Envelope>,
    /// Asks sent to the peer and not yet answered, by request id.
    pending: Mutex<HashMap<u64, oneshot::Sender<AskOutcome>>>,
    /// Set for good by [`close`](PeerLink::close): the link will never carry anything again.
    /// Written under the `pending` lock, so an ask that registers under that lock and still
    /// sees it unset is failed by the close.
    closed: AtomicBool,
    /// Local processes linked to processes on the peer.
    watchers: Mutex<Vec<(Upid, RemoteWatcher)>>,
}

impl PeerLink {
    pub(crate) fn new(node: String, capacity: usize) -> (Arc<Self>, mpsc::Receiver<Envelope>) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        let link = Arc::new(PeerLink {
            node,
            tx,
            pending: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
            watchers: Mutex::new(Vec::new()),
        });
        (link, rx)
    }

    /// Queues an envelope for the peer.
    pub(crate) fn send(&self, envelope: Envelope) -> Result<(), RemoteError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(RemoteError::ConnectionLost(self.node.clone()));
        }
        self.tx.try_send(envelope).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => RemoteError::QueueFull(self.node.clone()),
            mpsc::error::TrySendError::Closed(_) => RemoteError::ConnectionLost(self.node.clone()),
        })
    }

    /// Answers the peer's ask `request_id` with an error.
    pub(crate) fn send_error(&self, request_id: u64, error: &RemoteError) {
        let (code, detail) = encode_error(error);
        let envelope = Envelope {
            kind: Kind::Error as i32,
            request_id,
            error_code: code as i32,
            error: detail,
            ..Envelope::default()
        };
        if let Err(e) = self.send(envelope) {
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

    /// Forgets an ask whose caller gave up.
    pub(crate) fn forget(&self, request_id: u64) {
        lock(&self.pending).remove(&request_id);
    }

    /// True while someone still waits for the answer to `request_id`: an ask whose caller was
    /// already told it failed must not be sent later and run behind the caller's back.
    pub(crate) fn is_pending(&self, request_id: u64) -> bool {
        lock(&self.pending).contains_key(&request_id)
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
    }

    fn fail(&self, error: RemoteError, for_good: bool) {
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
}

/// The frames written on a link: an optional greeting, then batches of whatever is queued.
/// The receiver is shared so that a reconnect picks up where the lost connection stopped.
pub(crate) fn frames(
    hello: Option<String>,
    link: Arc<PeerLink>,
    queue: Arc<tokio::sync::Mutex<mpsc::Receiver<Envelope>>>,
    max_batch: usize,
    max_batch_bytes: usize,
) -> impl Stream<Item = Frame> + Send + 'static {
    let greeting = hello.map(|node| Frame {
        hello: Some(Hello { node }),
        envelopes: Vec::new(),
    });
    // At least one envelope per frame, whatever the config says.
    let max_batch = max_batch.max(1);
    let batches = futures_util::stream::unfold(queue, move |queue| {
        let link = Arc::clone(&link);
        async move {
            let envelopes = {
                let mut rx = queue.lock().await;
                let mut envelopes = Vec::with_capacity(16);
                let mut bytes = 0;
                // Wait for the first envelope; then take what is ready, up to the batch limits.
                while envelopes.len() < max_batch && bytes < max_batch_bytes {
                    let envelope = if envelopes.is_empty() {
                        rx.recv().await?
                    } else {
                        match rx.try_recv() {
                            Ok(envelope) => envelope,
                            Err(_) => break,
                        }
                    };
                    if link.still_wanted(&envelope) {
                        bytes += envelope.body.len();
                        envelopes.push(envelope);
                    }
                }
                envelopes
            };
            Some((
                Frame {
                    hello: None,
                    envelopes,
                },
                queue,
            ))
        }
    });
    futures_util::StreamExt::chain(futures_util::stream::iter(greeting), batches)
}

impl PeerLink {
    /// False for an ask whose caller has already been told it failed (or gave up).
    fn still_wanted(&self, envelope: &Envelope) -> bool {
        envelope.kind != Kind::Ask as i32 || self.is_pending(envelope.request_id)
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
