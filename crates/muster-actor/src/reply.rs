//! [`Reply`]: the answering half of an ask, carried inside the request message.

use std::fmt;

use tokio::sync::oneshot;

/// Answers one request. Put it in your message enum (`Get(Reply<u64>)`); the handler calls
/// [`send`](Reply::send) once. Dropping it unanswered makes the asker's call fail with
/// [`AskError::NoReply`](crate::AskError::NoReply).
pub struct Reply<T> {
    to: ReplyTo<T>,
}

enum ReplyTo<T> {
    Local(oneshot::Sender<T>),
    Remote(Box<dyn RemoteResponder<T>>),
}

/// Sends an answer back over the transport; dropping it unanswered sends a "no reply" error.
pub(crate) trait RemoteResponder<T>: Send {
    fn respond(self: Box<Self>, value: T);
}

impl<T> Reply<T> {
    pub(crate) fn local() -> (Self, oneshot::Receiver<T>) {
        let (tx, rx) = oneshot::channel();
        (
            Reply {
                to: ReplyTo::Local(tx),
            },
            rx,
        )
    }

    pub(crate) fn remote(responder: Box<dyn RemoteResponder<T>>) -> Self {
        Reply {
            to: ReplyTo::Remote(responder),
        }
    }

    /// Sends the answer. If the asker has given up (timed out or gone), the value is dropped.
    pub fn send(self, value: T) {
        match self.to {
            ReplyTo::Local(tx) => {
                let _ = tx.send(value);
            }
            ReplyTo::Remote(responder) => responder.respond(value),
        }
    }

    /// True if the asker has already given up, so the work to answer can be skipped.
    /// Always false for a remote asker.
    pub fn is_closed(&self) -> bool {
        match &self.to {
            ReplyTo::Local(tx) => tx.is_closed(),
            ReplyTo::Remote(_) => false,
        }
    }
}

impl<T> fmt::Debug for Reply<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let to = match self.to {
            ReplyTo::Local(_) => "local",
            ReplyTo::Remote(_) => "remote",
        };
        f.debug_struct("Reply").field("to", &to).finish()
    }
}
