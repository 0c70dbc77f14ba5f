//! [`TransportStats`]: what a node sent and received, how often it reconnected, and what it
//! could not deliver.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use muster_actor::RemoteError;

/// A snapshot of a node's transport counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct TransportStats {
    /// Frames read from all links.
    pub frames_received: u64,
    /// Envelopes read from all links.
    pub envelopes_received: u64,
    /// Envelopes for a process name that is not registered here.
    pub unknown_process: u64,
    /// Envelopes of a type the target process did not install.
    pub unknown_type: u64,
    /// Envelopes whose body or fields did not decode.
    pub malformed: u64,
    /// Envelopes larger than `max_message_size`.
    pub oversized: u64,
    /// Envelopes the target refused (stopped, mailbox full).
    pub rejected: u64,
    /// Envelopes from a sender whose role the target does not accept them from.
    pub unauthorized: u64,
    /// Answers that arrived after their asker gave up.
    pub late_replies: u64,
    /// Bytes of the frames written on all links, as protobuf-encoded (before the gRPC, HTTP/2
    /// and TLS framing around them), greetings included.
    pub bytes_sent: u64,
    /// Bytes of the frames read from all links, counted as [`bytes_sent`](Self::bytes_sent).
    pub bytes_received: u64,
    /// Connection attempts to a peer after its link was lost or the last attempt failed (the
    /// first connection to a peer is not one).
    pub reconnects: u64,
    /// Tells sent with a deadline ([`RemotePid::tell_until`](crate::RemotePid::tell_until))
    /// dropped unwritten: past their deadline, or queued for a connection that was lost.
    pub expired_tells: u64,
}

impl TransportStats {
    /// Every envelope that was not delivered, of any cause.
    pub fn dead_letters(&self) -> u64 {
        self.unknown_process
            + self.unknown_type
            + self.malformed
            + self.oversized
            + self.rejected
            + self.unauthorized
    }
}

#[derive(Default)]
pub(crate) struct Stats {
    pub(crate) frames_received: AtomicU64,
    pub(crate) envelopes_received: AtomicU64,
    unknown_process: AtomicU64,
    unknown_type: AtomicU64,
    malformed: AtomicU64,
    oversized: AtomicU64,
    rejected: AtomicU64,
    unauthorized: AtomicU64,
    pub(crate) late_replies: AtomicU64,
    pub(crate) bytes_sent: AtomicU64,
    pub(crate) bytes_received: AtomicU64,
    pub(crate) reconnects: AtomicU64,
    pub(crate) expired_tells: AtomicU64,
}

impl Stats {
    pub(crate) fn count_dead_letter(&self, error: &RemoteError) {
        let counter = match error {
            RemoteError::UnknownProcess(_) => &self.unknown_process,
            RemoteError::UnknownType(_) => &self.unknown_type,
            RemoteError::Oversized { .. } => &self.oversized,
            RemoteError::Rejected(_) => &self.rejected,
            RemoteError::Unauthorized(_) => &self.unauthorized,
            _ => &self.malformed,
        };
        counter.fetch_add(1, Relaxed);
    }

    pub(crate) fn snapshot(&self) -> TransportStats {
        TransportStats {
            frames_received: self.frames_received.load(Relaxed),
            envelopes_received: self.envelopes_received.load(Relaxed),
            unknown_process: self.unknown_process.load(Relaxed),
            unknown_type: self.unknown_type.load(Relaxed),
            malformed: self.malformed.load(Relaxed),
            oversized: self.oversized.load(Relaxed),
            rejected: self.rejected.load(Relaxed),
            unauthorized: self.unauthorized.load(Relaxed),
            late_replies: self.late_replies.load(Relaxed),
            bytes_sent: self.bytes_sent.load(Relaxed),
            bytes_received: self.bytes_received.load(Relaxed),
            reconnects: self.reconnects.load(Relaxed),
            expired_tells: self.expired_tells.load(Relaxed),
        }
    }
}
