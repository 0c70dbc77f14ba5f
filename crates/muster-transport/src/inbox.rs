//! How a registered process receives messages from other nodes: decoders installed per proto
//! type name (libprocess's `install`), and replies that travel back over the link.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::marker::PhantomData;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use muster_security::{Peer, Role};

use crate::message_type::reply_head;
use crate::peer::PeerLink;
use crate::wire::{EnvelopeWriter, FrameSlice};
use muster_actor::RemoteResponder;
use muster_actor::{Pid, Process, RemoteError, Reply, TellError};

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
    /// How messages of `type_name` (asks if `ask`) reach the process.
    ///
    /// # Errors
    /// [`RemoteError::UnknownType`] if the process did not install that type.
    fn route(&self, type_name: &str, ask: bool) -> Result<Route, RemoteError>;
}

/// One installed message type of one registered process, resolved: it checks the sender,
/// decodes a body and enqueues the message, looking nothing up. A link's reader keeps the
/// routes it has used, so a message of a type to a process it has delivered to before costs
/// one hash lookup, and a run of them one lookup for the run.
#[derive(Clone)]
pub(crate) enum Route {
    /// Tells, from `sender` (its verified identity; `None` on an insecure node): a run of
    /// bodies at once, enqueued in order under one lock of the mailbox; each one that cannot
    /// be delivered goes to the callback.
    Tell(Arc<TellRoute>),
    /// Asks, with where the answer goes.
    Ask(Arc<AskRoute>),
}

pub(crate) type TellRoute = dyn Fn(&Bytes, &mut dyn Iterator<Item = Range<usize>>, Option<&Peer>, &mut dyn FnMut(Undelivered))
    + Send
    + Sync;
type AskRoute = dyn Fn(Bytes, AskOrigin, Option<&Peer>) -> Result<(), Undelivered> + Send + Sync;

/// The roles a message type is accepted from when installed without naming them: the
/// cluster's members.
pub const MEMBERS: &[Role] = &[Role::Master, Role::Agent];

type TellDecoder<P> = Box<
    dyn Fn(FrameSlice<'_>, Option<&Peer>) -> Result<<P as Process>::Message, RemoteError>
        + Send
        + Sync,
>;
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

/// A registered process's routes, built once per installed type: a link's reader that finds
/// no route in its cache (the first message of a type to the process on that link) looks one
/// up and clones an `Arc`, and builds nothing.
pub(crate) struct ProcessInbox<P: Process> {
    pid: Pid<P>,
    tells: RwLock<HashMap<String, Arc<TellRoute>>>,
    asks: RwLock<HashMap<String, Arc<AskRoute>>>,
    /// The node's count of changes to what it serves, bumped on every install: readers drop
    /// the routes they cached when it moves.
    changes: Arc<AtomicU64>,
}

impl<P: Process> ProcessInbox<P> {
    pub(crate) fn new(pid: Pid<P>, changes: Arc<AtomicU64>) -> Self {
        ProcessInbox {
            pid,
            tells: RwLock::new(HashMap::new()),
            asks: RwLock::new(HashMap::new()),
            changes,
        }
    }

    /// The route of tells of `type_name`: checks the sender, decodes each body with
    /// `installed` and enqueues the run under one lock of the mailbox.
    fn tell_route(&self, type_name: &str, installed: Installed<TellDecoder<P>>) -> Arc<TellRoute> {
        let name: Box<str> = type_name.into();
        let pid = self.pid.clone();
        Arc::new(move |frame, bodies, sender, undelivered| {
            if let Err(error) = installed.admit(&name, sender) {
                for _ in bodies {
                    undelivered(error.clone().into());
                }
                return;
            }
            let mut msgs = Vec::with_capacity(bodies.size_hint().0);
            for body in bodies {
                match (installed.decode)(FrameSlice::new(frame, body), sender) {
                    Ok(msg) => msgs.push(msg),
                    Err(error) => undelivered(error.into()),
                }
            }
            pid.tell_all(msgs, |e| undelivered(refused(e)));
        })
    }

    /// The route of asks of `type_name`: checks the sender, decodes the body with
    /// `installed` and enqueues it.
    fn ask_route(&self, type_name: &str, installed: Installed<AskDecoder<P>>) -> Arc<AskRoute> {
        let name: Box<str> = type_name.into();
        let pid = self.pid.clone();
        Arc::new(move |body, origin, sender| {
            installed.admit(&name, sender)?;
            enqueue(&pid, (installed.decode)(body, origin, sender)?)
        })
    }
}

/// Enqueues a message that arrived from another node.
fn enqueue<P: Process>(pid: &Pid<P>, msg: P::Message) -> Result<(), Undelivered> {
    pid.tell(msg).map_err(refused)
}

/// A body that is not a valid `M`.
fn malformed<M: prost::Name>(error: &prost::DecodeError) -> RemoteError {
    RemoteError::Malformed(format!("{}: {error}", M::full_name()))
}

/// Why the mailbox turned a message away, with the message.
fn refused<M: Send + 'static>(e: TellError<M>) -> Undelivered {
    let error = match &e {
        TellError::Busy(_) => RemoteError::Rejected("mailbox is full".into()),
        TellError::Stopped(_) => RemoteError::Rejected("process has stopped".into()),
    };
    Undelivered {
        error,
        message: Some(Box::new(e.into_inner())),
    }
}

impl<P: Process> Inbox for ProcessInbox<P> {
    fn route(&self, type_name: &str, ask: bool) -> Result<Route, RemoteError> {
        let unknown = || RemoteError::UnknownType(type_name.to_owned());
        if ask {
            let asks = self.asks.read().unwrap_or_else(|p| p.into_inner());
            Ok(Route::Ask(Arc::clone(
                asks.get(type_name).ok_or_else(unknown)?,
            )))
        } else {
            let tells = self.tells.read().unwrap_or_else(|p| p.into_inner());
            Ok(Route::Tell(Arc::clone(
                tells.get(type_name).ok_or_else(unknown)?,
            )))
        }
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
        // The sender's identity is not wanted: it is not copied for each message.
        let decode: TellDecoder<P> =
            Box::new(move |body: FrameSlice<'_>, _sender: Option<&Peer>| {
                M::decode(body).map(&wrap).map_err(|e| malformed::<M>(&e))
            });
        self.install_tell::<M>(MEMBERS, decode)
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
        let decode: TellDecoder<P> =
            Box::new(move |body: FrameSlice<'_>, sender: Option<&Peer>| {
                M::decode(body)
                    .map(|message| wrap(message, sender.cloned()))
                    .map_err(|e| malformed::<M>(&e))
            });
        self.install_tell::<M>(accepted, decode)
    }

    /// Installs `decode` for tells of `M` from the `accepted` roles.
    fn install_tell<M: prost::Name>(
        &self,
        accepted: &'static [Role],
        decode: TellDecoder<P>,
    ) -> &Self {
        let name = M::full_name();
        let route = self.inbox.tell_route(&name, Installed { accepted, decode });
        self.inbox
            .tells
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name, route);
        self.inbox.changes.fetch_add(1, Ordering::Release);
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
                let request = M::decode(body).map_err(|e| malformed::<M>(&e))?;
                let reply = Reply::remote(Box::new(RemoteReply::<R> {
                    origin: Some(origin),
                    _reply: PhantomData,
                }));
                Ok(wrap(request, reply, sender.cloned()))
            },
        );
        let name = M::full_name();
        let route = self.inbox.ask_route(&name, Installed { accepted, decode });
        self.inbox
            .asks
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name, route);
        self.inbox.changes.fetch_add(1, Ordering::Release);
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
        let envelope = EnvelopeWriter::new(reply_head::<R>(), origin.request_id);
        let sent = origin.link.send(&envelope, size, None, |buf| {
            // A `BytesMut` grows as needed: encoding into it cannot run out of room.
            let _ = value.encode(buf);
        });
        if let Err(e) = sent {
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
