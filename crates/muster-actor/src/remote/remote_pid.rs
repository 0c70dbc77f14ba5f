//! [`RemotePid`]: tell and ask a process on another node, as a [`Pid`](crate::Pid) does locally.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use muster_proto::transport::Kind;

use super::peer::{PeerLink, decode_error};
use super::wire::EnvelopeWriter;
use super::{Node, Upid, type_name};
use crate::sync::lock;
use crate::{AskError, Context, Process, RemoteError};

/// A handle to a named process on some node, made by [`Node::remote`]. Cheap to clone.
///
/// Messages are prost messages, encoded once and carried over the link to the process's node;
/// the receiving process must have installed their type
/// ([`Registration::install`](crate::Registration::install)).
#[derive(Clone)]
pub struct RemotePid {
    node: Node,
    upid: Upid,
    /// The target's name, ready to put in envelopes.
    to: Bytes,
    /// The link to the process's node, found once rather than in the node's map on every
    /// message (shared by clones). A link stays the node's link to that peer until it closes.
    link: Arc<Mutex<Option<Arc<PeerLink>>>>,
}

impl RemotePid {
    pub(crate) fn new(node: Node, upid: Upid) -> Self {
        let to = Bytes::copy_from_slice(upid.name().as_bytes());
        RemotePid {
            node,
            upid,
            to,
            link: Arc::default(),
        }
    }

    /// The process's address.
    pub fn upid(&self) -> &Upid {
        &self.upid
    }

    fn link(&self) -> Arc<PeerLink> {
        self.with_link(Arc::clone)
    }

    /// Runs `f` on the link to the process's node, from the cache while that link is open.
    fn with_link<T>(&self, f: impl FnOnce(&Arc<PeerLink>) -> T) -> T {
        let mut cached = lock(&self.link);
        if let Some(link) = &*cached
            && !link.is_closed()
        {
            return f(link);
        }
        let link = cached.insert(self.node.inner.peer(self.upid.node()));
        f(link)
    }

    /// Encodes `msg` into an envelope of `kind` on `link`'s next frame.
    fn send<M: prost::Message + prost::Name + 'static>(
        &self,
        link: &PeerLink,
        kind: Kind,
        msg: &M,
        request_id: u64,
    ) -> Result<(), RemoteError> {
        let size = msg.encoded_len();
        let limit = self.node.inner.config.max_message_size;
        if size > limit {
            return Err(RemoteError::Oversized { size, limit });
        }
        let envelope = EnvelopeWriter::new(kind, &self.to, type_name::<M>(), request_id);
        link.send(&envelope, size, |buf| {
            // A `BytesMut` grows as needed: encoding into it cannot run out of room.
            let _ = msg.encode(buf);
        })
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
        self.with_link(|link| self.send(link, Kind::Tell, &msg, 0))
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
        let request_id = self.node.inner.next_request_id();
        let size = request.encoded_len();
        let limit = self.node.inner.config.max_message_size;
        if size > limit {
            return Err(RemoteError::Oversized { size, limit }.into());
        }
        let link = self.link();
        let answer = link.expect(request_id)?;
        let pending = Pending {
            link: &link,
            request_id,
        };
        self.send(&link, Kind::Ask, &request, request_id)?;
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

impl<P: Process> Context<P> {
    /// Links this process to a remote one: when the connection to its node is lost (or cannot
    /// be made), this process's [`exited`](Process::exited) runs with
    /// [`ProcessRef::Remote`](crate::ProcessRef::Remote) and
    /// [`ExitReason::ConnectionLost`](crate::ExitReason::ConnectionLost).
    pub fn link_remote(&self, remote: &RemotePid) {
        let notify = self.exit_notifier();
        remote.link().watch(remote.upid.clone(), Box::new(notify));
    }
}
