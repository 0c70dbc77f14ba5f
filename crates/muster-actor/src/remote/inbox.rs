//! How a registered process receives messages from other nodes: decoders installed per proto
//! type name (libprocess's `install`), and replies that travel back over the link.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use muster_proto::transport::{Envelope, Kind};
use muster_security::{Peer, Role};

use super::peer::PeerLink;
use super::type_name;
use crate::reply::RemoteResponder;
use crate::{Pid, Process, RemoteError, Reply, TellError};

/// Where an ask came from, so its answer can go back.
pub(crate) struct AskOrigin {
    pub(crate) link: Arc<PeerLink>,
    pub(crate) request_id: u64,
    pub(crate) max_message_size: usize,
}

/// A message that could not be delivered. The message itself (which may hold a remote reply)
/// is dropped only after the error has been sent, so the asker sees this error first.
pub(crate) struct Undelivered {
    pub(crate) error: RemoteError,
    pub(crate) message: Option<Box<dyn Any + Send>>,
}

impl From<RemoteError> for Undelivered {
    fn from(error: RemoteError) -> Self {
        Undelivered {
            error,
            message: None,
        }
    }
}

/// A registered process, whatever its type.
pub(crate) trait Inbox: Send + Sync {
    /// Decodes and enqueues one message from `sender` (its verified identity; `None` on an
    /// insecure node, where every sender is accepted).
    fn deliver(
        &self,
        type_name: &str,
        body: Bytes,
        ask: Option<AskOrigin>,
        sender: Option<&Peer>,
    ) -> Result<(), Undelivered>;
}

/// The roles a message type is accepted from when installed without naming them: the
/// cluster's members.
pub const MEMBERS: &[Role] = &[Role::Master, Role::Agent];

type TellDecoder<P> =
    Box<dyn Fn(Bytes, Option<&Peer>) -> Result<<P as Process>::Message, RemoteError> + Send + Sync>;
type AskDecoder<P> = Box<
    dyn Fn(Bytes, AskOrigin, Option<&Peer>) -> Result<<P as Process>::Message, RemoteError>
        + Send
        + Sync,
>;

/// One installed message type: who may send it, and how it becomes the process's message.
struct Installed<D> {
    accepted: &'static [Role],
    decode: D,
}

impl<D> Installed<D> {
    /// Whether `sender` may send this type: anyone on an insecure node, else a certificate
    /// of an accepted role.
    fn admit(&self, type_name: &str, sender: Option<&Peer>) -> Result<(), RemoteError> {
        match sender {
            None => Ok(()),
            Some(peer) if self.accepted.contains(&peer.role) => Ok(()),
            Some(peer) => Err(RemoteError::Unauthorized(format!(
                "{type_name} is not accepted from {peer}"
            ))),
        }
    }
}

pub(crate) struct ProcessInbox<P: Process> {
    pid: Pid<P>,
    tells: RwLock<HashMap<String, Installed<TellDecoder<P>>>>,
    asks: RwLock<HashMap<String, Installed<AskDecoder<P>>>>,
}

impl<P: Process> ProcessInbox<P> {
    pub(crate) fn new(pid: Pid<P>) -> Self {
        ProcessInbox {
            pid,
            tells: RwLock::new(HashMap::new()),
            asks: RwLock::new(HashMap::new()),
        }
    }

    fn enqueue(&self, msg: P::Message) -> Result<(), Undelivered> {
        self.pid.tell(msg).map_err(|e| {
            let error = match &e {
                TellError::Busy(_) => RemoteError::Rejected("mailbox is full".into()),
                TellError::Stopped(_) => RemoteError::Rejected("process has stopped".into()),
            };
            Undelivered {
                error,
                message: Some(Box::new(e.into_inner())),
            }
        })
    }
}

impl<P: Process> Inbox for ProcessInbox<P> {
    fn deliver(
        &self,
        type_name: &str,
        body: Bytes,
        ask: Option<AskOrigin>,
        sender: Option<&Peer>,
    ) -> Result<(), Undelivered> {
        let msg = match ask {
            None => {
                let tells = self.tells.read().unwrap_or_else(|p| p.into_inner());
                let installed = tells
                    .get(type_name)
                    .ok_or_else(|| RemoteError::UnknownType(type_name.to_owned()))?;
                installed.admit(type_name, sender)?;
                (installed.decode)(body, sender)?
            }
            Some(origin) => {
                let asks = self.asks.read().unwrap_or_else(|p| p.into_inner());
                let installed = asks
                    .get(type_name)
                    .ok_or_else(|| RemoteError::UnknownType(type_name.to_owned()))?;
                installed.admit(type_name, sender)?;
                (installed.decode)(body, origin, sender)?
            }
        };
        self.enqueue(msg)
    }
}

/// A process registered on a [`Node`](crate::Node): install the message types it accepts from
/// other nodes, and from whom. Each installed type is named by its proto full name
/// (`prost::Name`).
///
/// Who may send a type is declared here, where it is installed: on a node with TLS, a message
/// from a certificate of another role is refused before it is decoded (the asker gets
/// [`RemoteError::Unauthorized`]) and counted in
/// [`TransportStats::unauthorized`](crate::TransportStats::unauthorized). `install` and
/// `install_ask` accept the cluster's members (masters and agents); `install_from` and
/// `install_ask_from` name the roles and hand the sender's identity to the process.
pub struct Registration<P: Process> {
    pub(crate) inbox: Arc<ProcessInbox<P>>,
}

impl<P: Process> Registration<P> {
    /// Accepts remote tells of `M` from masters and agents, turned into this process's
    /// message by `wrap`.
    pub fn install<M>(&self, wrap: impl Fn(M) -> P::Message + Send + Sync + 'static) -> &Self
    where
        M: prost::Message + prost::Name + Default + 'static,
    {
        self.install_from(MEMBERS, move |message, _sender| wrap(message))
    }

    /// Accepts remote tells of `M` only from certificates of the `accepted` roles; `wrap`
    /// also gets the sender's identity (`None` on an insecure node).
    pub fn install_from<M>(
        &self,
        accepted: &'static [Role],
        wrap: impl Fn(M, Option<Peer>) -> P::Message + Send + Sync + 'static,
    ) -> &Self
    where
        M: prost::Message + prost::Name + Default + 'static,
    {
        let decode: TellDecoder<P> = Box::new(move |body: Bytes, sender: Option<&Peer>| {
            M::decode(body)
                .map(|message| wrap(message, sender.cloned()))
                .map_err(|e| RemoteError::Malformed(format!("{}: {e}", M::full_name())))
        });
        self.inbox
            .tells
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(M::full_name(), Installed { accepted, decode });
        self
    }

    /// Accepts remote asks of `M` from masters and agents, answered with `R`: `wrap` puts
    /// the request and its [`Reply`] into this process's message, as for a local ask.
    pub fn install_ask<M, R>(
        &self,
        wrap: impl Fn(M, Reply<R>) -> P::Message + Send + Sync + 'static,
    ) -> &Self
    where
        M: prost::Message + prost::Name + Default + 'static,
        R: prost::Message + prost::Name + Send + 'static,
    {
        self.install_ask_from(MEMBERS, move |message, reply, _sender| wrap(message, reply))
    }

    /// Accepts remote asks of `M` only from certificates of the `accepted` roles; `wrap` also
    /// gets the sender's identity (`None` on an insecure node).
    pub fn install_ask_from<M, R>(
        &self,
        accepted: &'static [Role],
        wrap: impl Fn(M, Reply<R>, Option<Peer>) -> P::Message + Send + Sync + 'static,
    ) -> &Self
    where
        M: prost::Message + prost::Name + Default + 'static,
        R: prost::Message + prost::Name + Send + 'static,
    {
        let decode: AskDecoder<P> = Box::new(
            move |body: Bytes, origin: AskOrigin, sender: Option<&Peer>| {
                let request = M::decode(body)
                    .map_err(|e| RemoteError::Malformed(format!("{}: {e}", M::full_name())))?;
                let reply = Reply::remote(Box::new(RemoteReply::<R> {
                    origin: Some(origin),
                    _reply: PhantomData,
                }));
                Ok(wrap(request, reply, sender.cloned()))
            },
        );
        self.inbox
            .asks
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(M::full_name(), Installed { accepted, decode });
        self
    }

    /// The registered process.
    pub fn pid(&self) -> &Pid<P> {
        &self.inbox.pid
    }
}

impl<P: Process> fmt::Debug for Registration<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registration")
            .field("pid", &self.inbox.pid)
            .finish()
    }
}

/// The answering half of a remote ask: encodes the answer and sends it back over the link.
/// Dropped unanswered, it tells the asker so instead of leaving it to time out.
struct RemoteReply<R> {
    origin: Option<AskOrigin>,
    _reply: PhantomData<fn(R)>,
}

impl<R: prost::Message + prost::Name + Send + 'static> RemoteResponder<R> for RemoteReply<R> {
    fn respond(mut self: Box<Self>, value: R) {
        let Some(origin) = self.origin.take() else {
            return;
        };
        let size = value.encoded_len();
        if size > origin.max_message_size {
            origin.link.send_error(
                origin.request_id,
                &RemoteError::Oversized {
                    size,
                    limit: origin.max_message_size,
                },
            );
            return;
        }
        let envelope = Envelope {
            kind: Kind::Reply as i32,
            type_name: type_name::<R>(),
            body: Bytes::from(value.encode_to_vec()),
            request_id: origin.request_id,
            ..Envelope::default()
        };
        if let Err(e) = origin.link.send(envelope) {
            tracing::warn!(peer = %origin.link.node, error = %e, "could not send a reply");
        }
    }
}

impl<R> Drop for RemoteReply<R> {
    fn drop(&mut self) {
        if let Some(origin) = self.origin.take() {
            origin
                .link
                .send_error(origin.request_id, &RemoteError::NoReply);
        }
    }
}
