//! [`RemotePid`]: tell and ask a process on another node, as a [`Pid`](muster_actor::Pid) does locally.

use std::any::TypeId;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use muster_proto::transport::Kind;

use crate::message_type::type_name;
use crate::peer::{PeerLink, Queued, decode_error};
use crate::receive::NodeInner;
use crate::sync::lock;
use crate::wire::{EnvelopeHead, EnvelopeWriter};
use muster_actor::Upid;
use muster_actor::{AskError, Context, Process, RemoteError};

/// A handle to a named process on some node, made by [`Node::remote`](crate::Node::remote).
/// Cheap to clone.
///
/// Messages are prost messages, encoded once and carried over the link to the process's node;
/// the receiving process must have installed their type
/// ([`Registration::install`](crate::Registration::install)).
#[derive(Clone)]
pub struct RemotePid {
    node: Arc<NodeInner>,
    upid: Upid,
    /// The link to the process's node and the envelope heads used lately, shared by clones.
    cache: Arc<Mutex<SendCache>>,
}

/// What a [`RemotePid`] keeps between messages so that a message costs its encoding and a copy.
#[derive(Default)]
struct SendCache {
    /// The link to the process's node, found once rather than in the node's map on every
    /// message. A link stays the node's link to that peer until it closes.
    link: Option<Arc<PeerLink>>,
    heads: Heads,
}

/// Envelope heads by message type and kind, newest last: a handle usually sends one or two
/// types.
#[derive(Default)]
struct Heads(Vec<(TypeId, EnvelopeHead)>);

impl Heads {
    /// Heads kept at most.
    const CAPACITY: usize = 4;

    /// The head of `kind` envelopes of `M` for `to`, encoded on first use.
    fn get<M: prost::Name + 'static>(&mut self, kind: Kind, to: &str) -> &EnvelopeHead {
        let id = TypeId::of::<M>();
        let heads = &mut self.0;
        let at = match heads
            .iter()
            .position(|(known, head)| *known == id && head.kind() == kind)
        {
            Some(at) => at,
            None => {
                if heads.len() >= Self::CAPACITY {
                    heads.remove(0);
                }
                heads.push((id, EnvelopeHead::new(kind, to.as_bytes(), type_name::<M>())));
                heads.len() - 1
            }
        };
        &heads[at].1
    }
}

impl RemotePid {
    pub(crate) fn new(node: Arc<NodeInner>, upid: Upid) -> Self {
        RemotePid {
            node,
            upid,
            cache: Arc::default(),
        }
    }

    /// The process's address.
    pub fn upid(&self) -> &Upid {
        &self.upid
    }

    fn link(&self) -> Arc<PeerLink> {
        let mut cache = lock(&self.cache);
        Arc::clone(self.open_link(&mut cache.link))
    }

    /// The link to the process's node, from `cached` while that link is open.
    fn open_link<'c>(&self, cached: &'c mut Option<Arc<PeerLink>>) -> &'c Arc<PeerLink> {
        if cached.as_ref().is_some_and(|link| link.is_closed()) {
            *cached = None;
        }
        cached.get_or_insert_with(|| self.node.peer(self.upid.node()))
    }

    /// Encodes `msg` into an envelope of `kind` on the next frame of `link`, or of the
    /// process's node's open link if `None`.
    fn enqueue<M: prost::Message + prost::Name + 'static>(
        &self,
        link: Option<&Arc<PeerLink>>,
        kind: Kind,
        msg: &M,
        request_id: u64,
    ) -> Result<Queued, RemoteError> {
        self.enqueue_expiring(link, kind, msg, request_id, None)
    }

    /// As [`enqueue`](Self::enqueue), dropped unwritten past `expires` or its connection.
    fn enqueue_expiring<M: prost::Message + prost::Name + 'static>(
        &self,
        link: Option<&Arc<PeerLink>>,
        kind: Kind,
        msg: &M,
        request_id: u64,
        expires: Option<tokio::time::Instant>,
    ) -> Result<Queued, RemoteError> {
        let size = msg.encoded_len();
        let limit = self.node.config.max_message_size;
        if size > limit {
            return Err(RemoteError::Oversized { size, limit });
        }
        let mut cache = lock(&self.cache);
        let cache = &mut *cache;
        // Borrowed, not cloned: a clone would write the link's reference count, whose cache
        // line the link's writer (on another thread) keeps taking back.
        let link = match link {
            Some(link) => link,
            None => self.open_link(&mut cache.link),
        };
        let head = cache.heads.get::<M>(kind, self.upid.name());
        link.send(
            &EnvelopeWriter::new(head, request_id),
            size,
            expires,
            |buf| {
                // A `BytesMut` grows as needed: encoding into it cannot run out of room.
                let _ = msg.encode(buf);
            },
        )
    }

    /// Encodes `msg` and queues it for the process's node; it is sent on the link's next frame.
    /// Failures on the far side (unknown process or type, malformed, refused) are counted as dead
    /// letters there.
    ///
    /// # Errors
    /// [`RemoteError::Oversized`] above the size limit, [`RemoteError::QueueFull`] if too many
    /// messages wait for an unreachable node.
    pub fn tell<M: prost::Message + prost::Name + 'static>(
        &self,
        msg: M,
    ) -> Result<(), RemoteError> {
        self.enqueue(None, Kind::Tell, &msg, 0).map(drop)
    }

    /// As [`tell`](RemotePid::tell), for a message that is worth sending only on the link's
    /// connection of the moment and until `deadline`: if the link has not written it by then,
    /// or loses that connection (or fails to make it) first, it is dropped unwritten and
    /// counted in [`TransportStats::expired_tells`](crate::TransportStats), instead of reaching
    /// the peer late on a later connection. For commands whose sender gives up on them at a
    /// deadline of its own (a task launch the master counts lost), so that a command given up
    /// on is never carried out. Its head is always written whole.
    ///
    /// # Errors
    /// As [`tell`](RemotePid::tell).
    pub fn tell_until<M: prost::Message + prost::Name + 'static>(
        &self,
        msg: M,
        deadline: tokio::time::Instant,
    ) -> Result<(), RemoteError> {
        self.enqueue_expiring(None, Kind::Tell, &msg, 0, Some(deadline))
            .map(drop)
    }

    /// As [`tell`](RemotePid::tell), but waits while the link's queue is full
    /// ([`NodeConfig::max_queued_per_peer`](crate::NodeConfig)) instead of failing, and gives
    /// up its worker thread for a turn when the link's writer falls a whole frame behind: a
    /// loop of sends then lets the writer run (on this thread or, by stealing, on another), so
    /// encoding and writing go on side by side instead of one after the other.
    ///
    /// The wait lasts until the link sends or closes: to bound it, wrap the call in
    /// [`tokio::time::timeout`].
    ///
    /// # Errors
    /// [`RemoteError::Oversized`] above the size limit, [`RemoteError::ConnectionLost`] once the
    /// link has closed for good.
    ///
    /// # Cancel safety
    /// Cancelled while it waits for room, it leaves the message unsent. A message it has queued
    /// (it may be cancelled during the turn it then gives up) is sent.
    pub async fn send<M: prost::Message + prost::Name + 'static>(
        &self,
        msg: M,
    ) -> Result<(), RemoteError> {
        loop {
            match self.enqueue(None, Kind::Tell, &msg, 0) {
                Ok(Queued::Flowing) => return Ok(()),
                Ok(Queued::Behind) => {
                    tokio::task::yield_now().await;
                    return Ok(());
                }
                Err(RemoteError::QueueFull(_)) => {}
                Err(e) => return Err(e),
            }
            let link = self.link();
            let room = link.room();
            tokio::pin!(room);
            room.as_mut().enable();
            // A frame taken between the failed try and `enable` woke nobody: try once more, on
            // the link whose room is awaited.
            match self.enqueue(Some(&link), Kind::Tell, &msg, 0) {
                Err(RemoteError::QueueFull(_)) => room.await,
                sent => return sent.map(drop),
            }
        }
    }

    /// Sends `request` and waits for the process's answer of type `R`.
    ///
    /// # Errors
    /// [`AskError::Remote`] with the far side's reason (unknown process or type, malformed,
    /// refused, no reply), [`RemoteError::ConnectionLost`] if the link broke before the answer
    /// came, or [`RemoteError::Unreachable`] if the node could not be reached.
    ///
    /// # Cancel safety
    /// Cancelling forgets the request; a late answer is counted and dropped.
    pub async fn ask<M, R>(&self, request: M) -> Result<R, AskError>
    where
        M: prost::Message + prost::Name + 'static,
        R: prost::Message + prost::Name + Default + 'static,
    {
        let request_id = self.node.next_request_id();
        let size = request.encoded_len();
        let limit = self.node.config.max_message_size;
        if size > limit {
            return Err(RemoteError::Oversized { size, limit }.into());
        }
        let link = self.link();
        let answer = link.expect(request_id)?;
        let pending = Pending {
            link: &link,
            request_id,
        };
        self.enqueue(Some(&link), Kind::Ask, &request, request_id)?;
        let outcome = answer
            .await
            .map_err(|_| RemoteError::ConnectionLost(self.upid.node().to_owned()))?;
        drop(pending);
        let envelope = outcome?;
        if envelope.kind == Kind::Error as i32 {
            return Err(decode_error(&envelope).into());
        }
        let expected = type_name::<R>();
        if envelope.type_name != expected {
            return Err(RemoteError::Malformed(format!(
                "expected an answer of type {}, got {}",
                String::from_utf8_lossy(expected),
                String::from_utf8_lossy(&envelope.type_name)
            ))
            .into());
        }
        R::decode(envelope.body).map_err(|e| RemoteError::Malformed(format!("answer: {e}")).into())
    }

    /// [`ask`](RemotePid::ask) with a deadline.
    ///
    /// # Errors
    /// As `ask`, plus [`AskError::Timeout`].
    ///
    /// # Cancel safety
    /// As `ask`.
    pub async fn ask_timeout<M, R>(&self, timeout: Duration, request: M) -> Result<R, AskError>
    where
        M: prost::Message + prost::Name + 'static,
        R: prost::Message + prost::Name + Default + 'static,
    {
        tokio::time::timeout(timeout, self.ask(request))
            .await
            .unwrap_or(Err(AskError::Timeout(timeout)))
    }
}

/// Forgets a pending ask if its caller stops waiting.
struct Pending<'a> {
    link: &'a PeerLink,
    request_id: u64,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.link.forget(self.request_id);
    }
}

impl fmt::Debug for RemotePid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RemotePid").field(&self.upid).finish()
    }
}

/// Links a process to remote ones: `ctx.link_remote(&remote)` in a handler.
pub trait LinkRemote {
    /// Links this process to a remote one: when the connection to its node is lost (or cannot
    /// be made), this process's [`exited`](Process::exited) runs with
    /// [`ProcessRef::Remote`](muster_actor::ProcessRef::Remote) and
    /// [`ExitReason::ConnectionLost`](muster_actor::ExitReason::ConnectionLost).
    fn link_remote(&self, remote: &RemotePid);
}

impl<P: Process> LinkRemote for Context<P> {
    fn link_remote(&self, remote: &RemotePid) {
        let notify = self.exit_notifier();
        remote.link().watch(remote.upid.clone(), Box::new(notify));
    }
}
