//! How a registered process receives messages from other nodes: decoders installed per proto
//! type name (libprocess's `install`), and replies that travel back over the link.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use muster_proto::transport::{Envelope, Kind};

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
    fn deliver(
        &self,
        type_name: &str,
        body: Bytes,
        ask: Option<AskOrigin>,
    ) -> Result<(), Undelivered>;
}

type TellDecoder<P> =
    Box<dyn Fn(Bytes) -> Result<<P as Process>::Message, RemoteError> + Send + Sync>;
type AskDecoder<P> =
    Box<dyn Fn(Bytes, AskOrigin) -> Result<<P as Process>::Message, RemoteError> + Send + Sync>;

pub(crate) struct ProcessInbox<P: Process> {
    pid: Pid<P>,
    tells: RwLock<HashMap<String, TellDecoder<P>>>,
    asks: RwLock<HashMap<String, AskDecoder<P>>>,
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
    ) -> Result<(), Undelivered> {
        let msg = match ask {
            None => {
                let tells = self.tells.read().unwrap_or_else(|p| p.into_inner());
                let decode = tells
                    .get(type_name)
                    .ok_or_else(|| RemoteError::UnknownType(type_name.to_owned()))?;
                decode(body)?
            }
            Some(origin) => {
                let asks = self.asks.read().unwrap_or_else(|p| p.into_inner());
                let decode = asks
                    .get(type_name)
                    .ok_or_else(|| RemoteError::UnknownType(type_name.to_owned()))?;
                decode(body, origin)?
            }
        };
        self.enqueue(msg)
    }
}

/// A process registered on a [`Node`](crate::Node): install the message types it accepts from
/// other nodes. Each installed type is named by its proto full name (`prost::Name`).
pub struct Registration<P: Process> {
    pub(crate) inbox: Arc<ProcessInbox<P>>,
}

impl<P: Process> Registration<P> {
    /// Accepts remote tells of `M`, turned into this process's message by `wrap`.
    pub fn install<M>(&self, wrap: impl Fn(M) -> P::Message + Send + Sync + 'static) -> &Self
    where
        M: prost::Message + prost::Name + Default + 'static,
    {
        let decoder: TellDecoder<P> = Box::new(move |body: Bytes| {
            M::decode(body)
                .map(&wrap)
                .map_err(|e| RemoteError::Malformed(format!("{}: {e}", M::full_name())))
        });
        self.inbox
            .tells
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(M::full_name(), decoder);
        self
    }

    /// Accepts remote asks of `M` answered with `R`: `wrap` puts the request and its
    /// [`Reply`] into this process's message, as for a local ask.
    pub fn install_ask<M, R>(
        &self,
        wrap: impl Fn(M, Reply<R>) -> P::Message + Send + Sync + 'static,
    ) -> &Self
    where
        M: prost::Message + prost::Name + Default + 'static,
        R: prost::Message + prost::Name + Send + 'static,
    {
        let decoder: AskDecoder<P> = Box::new(move |body: Bytes, origin: AskOrigin| {
            let request = M::decode(body)
                .map_err(|e| RemoteError::Malformed(format!("{}: {e}", M::full_name())))?;
            let reply = Reply::remote(Box::new(RemoteReply::<R> {
                origin: Some(origin),
                _reply: PhantomData,
            }));
            Ok(wrap(request, reply))
        });
        self.inbox
            .asks
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(M::full_name(), decoder);
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
