//! [`PeerLink`]: the queue, pending asks and remote links for one peer node, and the batching
//! stream that carries the queue over the link's tonic stream.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures_util::Stream;
use muster_proto::transport::{Envelope, ErrorCode, Frame, Hello, Kind};
use tokio::sync::{mpsc, oneshot};

use crate::pid::lock;
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
    /// Local processes linked to processes on the peer.
    watchers: Mutex<Vec<(Upid, RemoteWatcher)>>,
}

impl PeerLink {
    pub(crate) fn new(node: String, capacity: usize) -> (Arc<Self>, mpsc::Receiver<Envelope>) {
        let (tx, rx) = mpsc::channel(capacity);
        let link = Arc::new(PeerLink {
            node,
            tx,
            pending: Mutex::new(HashMap::new()),
            watchers: Mutex::new(Vec::new()),
        });
        (link, rx)
    }

    /// Queues an envelope for the peer.
    pub(crate) fn send(&self, envelope: Envelope) -> Result<(), RemoteError> {
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
    pub(crate) fn expect(&self, request_id: u64) -> oneshot::Receiver<AskOutcome> {
        let (tx, rx) = oneshot::channel();
        lock(&self.pending).insert(request_id, tx);
        rx
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
        let pending = std::mem::take(&mut *lock(&self.pending));
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
    queue: Arc<tokio::sync::Mutex<mpsc::Receiver<Envelope>>>,
    max_batch: usize,
    max_batch_bytes: usize,
) -> impl Stream<Item = Frame> + Send + 'static {
    let greeting = hello.map(|node| Frame {
        hello: Some(Hello { node }),
        envelopes: Vec::new(),
    });
    let batches = futures_util::stream::unfold(queue, move |queue| async move {
        let envelopes = {
            let mut rx = queue.lock().await;
            let first = rx.recv().await?;
            let mut bytes = first.body.len();
            let mut envelopes = Vec::with_capacity(16);
            envelopes.push(first);
            while envelopes.len() < max_batch && bytes < max_batch_bytes {
                match rx.try_recv() {
                    Ok(envelope) => {
                        bytes += envelope.body.len();
                        envelopes.push(envelope);
                    }
                    Err(_) => break,
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
    });
    futures_util::StreamExt::chain(futures_util::stream::iter(greeting), batches)
}

/// The wire form of an error: a code and a detail.
pub(crate) fn encode_error(error: &RemoteError) -> (ErrorCode, String) {
    match error {
        RemoteError::UnknownProcess(name) => (ErrorCode::UnknownProcess, name.clone()),
        RemoteError::UnknownType(name) => (ErrorCode::UnknownType, name.clone()),
        RemoteError::Malformed(detail) => (ErrorCode::Malformed, detail.clone()),
        RemoteError::Oversized { size, limit } => (ErrorCode::Oversized, format!("{size}/{limit}")),
        RemoteError::NoReply => (ErrorCode::NoReply, String::new()),
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
        Ok(ErrorCode::ProcessStopped | ErrorCode::MailboxFull) => RemoteError::Rejected(detail),
        Ok(ErrorCode::Unspecified) | Err(_) => RemoteError::Malformed(format!(
            "error envelope with unknown code {}: {detail}",
            envelope.error_code
        )),
    }
}
