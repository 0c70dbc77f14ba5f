//! [`NodeInner`]: what a node's links share (its named processes, its peers, its counters),
//! and the receiving half of every link: each frame read, its envelopes routed to the
//! processes they name, consecutive tells of one route enqueued together.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use bytes::Bytes;
use muster_proto::transport::{Envelope, Kind};
use muster_security::Peer;
use tokio::sync::watch;
use tonic::Streaming;

use crate::config::NodeConfig;
use crate::inbox::{AskOrigin, Inbox, Route, TellRoute, Undelivered};
use crate::peer::{Limits, PeerLink};
use crate::route_cache::RouteCache;
use crate::stats::Stats;
use crate::sync::lock;
use crate::wire::{EnvelopeRef, Envelopes, Item};
use muster_actor::{RemoteError, System};

/// What a node's links share with it and with each other; a `Node` is a handle to one.
pub(crate) struct NodeInner {
    /// The address peers reach this node at, `host:port`.
    pub(crate) address: String,
    /// The system whose processes the node serves.
    pub(crate) system: System,
    /// Its limits and security.
    pub(crate) config: NodeConfig,
    /// The registered processes, by name.
    pub(crate) processes: RwLock<HashMap<String, Arc<dyn Inbox>>>,
    /// Bumped after every change to `processes` or to what a registered process installed:
    /// link readers drop their cached routes when it moves.
    pub(crate) changes: Arc<AtomicU64>,
    /// The link to each peer node, by address.
    pub(crate) peers: Mutex<HashMap<String, Arc<PeerLink>>>,
    /// The id of the next ask this node sends.
    pub(crate) next_request: AtomicU64,
    /// Shared with the streams that write frames, which count what they send.
    pub(crate) stats: Arc<Stats>,
    /// Set once the node shuts down; links and the server watch it.
    pub(crate) shutdown: watch::Sender<bool>,
}

impl NodeInner {
    /// A fresh id for an ask.
    pub(crate) fn next_request_id(&self) -> u64 {
        self.next_request.fetch_add(1, Ordering::Relaxed)
    }

    /// Whether the node has been shut down.
    pub(crate) fn is_shut_down(&self) -> bool {
        *self.shutdown.borrow()
    }

    /// How this node's links batch and bound what they send.
    pub(crate) fn limits(&self) -> Limits {
        Limits {
            max_queued: self.config.max_queued_per_peer,
            max_batch: self.config.max_batch,
            max_batch_bytes: self.config.max_message_size,
        }
    }

    /// Handles every envelope of one frame that arrived on `link` from `sender`. The greeting
    /// (read when the link opened) is skipped. Consecutive tells of one type to one process
    /// are enqueued together, under one lock of its mailbox; anything else in between ends
    /// such a run first, so order holds. An envelope that is not well-formed is answered (if
    /// it was an ask whose id could be read) and counted; a frame whose own structure breaks
    /// loses its rest, counted as one malformed message. Neither ends the link.
    pub(crate) fn receive_frame(
        &self,
        link: &Arc<PeerLink>,
        sender: Option<&Peer>,
        routes: &mut RouteCache,
        frame: &Bytes,
    ) {
        self.stats.frames_received.fetch_add(1, Ordering::Relaxed);
        self.stats
            .bytes_received
            .fetch_add(frame.len() as u64, Ordering::Relaxed);
        let mut envelopes = 0;
        let mut run = TellRun {
            route: None,
            bodies: std::mem::take(&mut routes.bodies),
        };
        // The envelope before was a tell whose route is `run.route`, found when the node's
        // processes were at `routed_at` changes.
        let mut previous_in_run = false;
        let mut routed_at = 0;
        for item in Envelopes::new(frame) {
            if let Ok(Item::Envelope(envelope)) = &item
                && envelope.kind == Kind::Tell as i32
            {
                envelopes += 1;
                if envelope.same_head
                    && previous_in_run
                    && self.changes.load(Ordering::Acquire) == routed_at
                {
                    // Same process, same type: same route, nothing to look up.
                    match self.check_size(envelope) {
                        Ok(()) => run.bodies.push(envelope.body.clone()),
                        Err(error) => self.dead_letter(&link.node, &error),
                    }
                    continue;
                }
                routed_at = self.changes.load(Ordering::Acquire);
                match self.tell_route(routes, envelope) {
                    Ok(route) => {
                        if !run.route.as_ref().is_some_and(|r| Arc::ptr_eq(r, route)) {
                            let route = Arc::clone(route);
                            self.flush(link, sender, frame, &mut run);
                            run.route = Some(route);
                        }
                        run.bodies.push(envelope.body.clone());
                        previous_in_run = true;
                    }
                    Err(error) => {
                        self.dead_letter(&link.node, &error);
                        previous_in_run = false;
                    }
                }
                continue;
            }
            previous_in_run = false;
            self.flush(link, sender, frame, &mut run);
            match item {
                Ok(Item::Envelope(envelope)) => {
                    envelopes += 1;
                    self.receive(link, sender, routes, frame, envelope);
                }
                Ok(Item::Hello(_)) => {}
                Ok(Item::Malformed { request_id }) => {
                    envelopes += 1;
                    let error = RemoteError::Malformed("not a valid envelope".into());
                    if request_id != 0 {
                        link.send_error(request_id, &error);
                    }
                    self.dead_letter(&link.node, &error);
                }
                Err(broken) => {
                    let error = RemoteError::Malformed(format!(
                        "frame of {} bytes broken at byte {}; its rest is lost",
                        frame.len(),
                        broken.offset
                    ));
                    tracing::warn!(peer = %link.node, %error, "malformed frame");
                    self.dead_letter(&link.node, &error);
                }
            }
        }
        self.flush(link, sender, frame, &mut run);
        routes.bodies = run.bodies;
        self.stats
            .envelopes_received
            .fetch_add(envelopes, Ordering::Relaxed);
    }

    /// How `envelope` (an ask if `ask`) reaches its process: from the link's cache, else
    /// resolved in the node's and the process's maps.
    fn route<'r>(
        &self,
        routes: &'r mut RouteCache,
        envelope: &EnvelopeRef<'_>,
        ask: bool,
    ) -> Result<&'r Route, RemoteError> {
        routes.find(self.changes.load(Ordering::Acquire), envelope, ask, || {
            self.resolve(envelope.to, envelope.type_name, ask)
        })
    }

    /// Where a tell goes, after its size is checked.
    fn tell_route<'r>(
        &self,
        routes: &'r mut RouteCache,
        envelope: &EnvelopeRef<'_>,
    ) -> Result<&'r Arc<TellRoute>, RemoteError> {
        self.check_size(envelope)?;
        match self.route(routes, envelope, false)? {
            Route::Tell(route) => Ok(route),
            // `route` answers the kind it was asked for.
            Route::Ask(_) => Err(RemoteError::Malformed(
                "an ask and a tell were mixed up".into(),
            )),
        }
    }

    /// Enqueues the run of tells gathered so far, if any.
    fn flush(&self, link: &PeerLink, sender: Option<&Peer>, frame: &Bytes, run: &mut TellRun) {
        if let Some(route) = run.route.take() {
            route(
                frame,
                &mut run.bodies.drain(..),
                sender,
                &mut |undelivered| {
                    self.dead_letter(&link.node, &undelivered.error);
                },
            );
        }
    }

    /// Refuses a body over the size limit.
    fn check_size(&self, envelope: &EnvelopeRef<'_>) -> Result<(), RemoteError> {
        let size = envelope.body.len();
        if size > self.config.max_message_size {
            return Err(RemoteError::Oversized {
                size,
                limit: self.config.max_message_size,
            });
        }
        Ok(())
    }

    /// Handles one envelope of `frame` that arrived on `link` from `sender` (its verified
    /// identity; `None` on an insecure node).
    fn receive(
        &self,
        link: &Arc<PeerLink>,
        sender: Option<&Peer>,
        routes: &mut RouteCache,
        frame: &Bytes,
        envelope: EnvelopeRef<'_>,
    ) {
        match Kind::try_from(envelope.kind) {
            Ok(Kind::Tell) => {
                // Gathered into runs by `receive_frame`; delivered as a run of one here.
                let mut run = TellRun::default();
                match self.tell_route(routes, &envelope) {
                    Ok(route) => {
                        run.route = Some(Arc::clone(route));
                        run.bodies.push(envelope.body.clone());
                        self.flush(link, sender, frame, &mut run);
                    }
                    Err(error) => self.dead_letter(&link.node, &error),
                }
            }
            Ok(Kind::Ask) => {
                let request_id = envelope.request_id;
                let origin = AskOrigin {
                    link: Arc::clone(link),
                    request_id,
                    max_message_size: self.config.max_message_size,
                };
                let delivered = self.deliver_ask(routes, frame, &envelope, origin, sender);
                if let Err(undelivered) = delivered {
                    link.send_error(request_id, &undelivered.error);
                    self.dead_letter(&link.node, &undelivered.error);
                    drop(undelivered.message);
                }
            }
            Ok(Kind::Reply | Kind::Error) => {
                let answer = Envelope {
                    kind: envelope.kind,
                    to: Bytes::new(),
                    type_name: frame.slice_ref(envelope.type_name),
                    body: frame.slice(envelope.body.clone()),
                    request_id: envelope.request_id,
                    error_code: envelope.error_code,
                    error: String::from_utf8_lossy(envelope.error).into_owned(),
                    // Its head, if left out, has been filled in.
                    same_head: false,
                };
                if !link.complete(answer) {
                    // The asker gave up (timeout) before the answer came.
                    self.stats.late_replies.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok(Kind::Unspecified) | Err(_) => {
                let error =
                    RemoteError::Malformed(format!("unknown envelope kind {}", envelope.kind));
                if envelope.request_id != 0 {
                    link.send_error(envelope.request_id, &error);
                }
                self.dead_letter(&link.node, &error);
            }
        }
    }

    fn deliver_ask(
        &self,
        routes: &mut RouteCache,
        frame: &Bytes,
        envelope: &EnvelopeRef<'_>,
        origin: AskOrigin,
        sender: Option<&Peer>,
    ) -> Result<(), Undelivered> {
        self.check_size(envelope)?;
        match self.route(routes, envelope, true)? {
            Route::Ask(deliver) => deliver(frame.slice(envelope.body.clone()), origin, sender),
            // `route` answers the kind it was asked for.
            Route::Tell(_) => {
                Err(RemoteError::Malformed("an ask and a tell were mixed up".into()).into())
            }
        }
    }

    /// How messages of `type_name` (asks if `ask`) reach the process named `to`.
    fn resolve(&self, to: &[u8], type_name: &[u8], ask: bool) -> Result<Route, RemoteError> {
        let to = std::str::from_utf8(to)
            .map_err(|_| RemoteError::Malformed("process name is not UTF-8".into()))?;
        let type_name = std::str::from_utf8(type_name)
            .map_err(|_| RemoteError::Malformed("type name is not UTF-8".into()))?;
        let processes = self.processes.read().unwrap_or_else(|p| p.into_inner());
        let inbox = processes
            .get(to)
            .ok_or_else(|| RemoteError::UnknownProcess(to.to_owned()))?;
        inbox.route(type_name, ask)
    }

    fn dead_letter(&self, peer: &str, error: &RemoteError) {
        self.system.add_dead_letters(1);
        self.stats.count_dead_letter(error);
        tracing::debug!(%peer, %error, "dead letter");
    }

    /// Reads a link's incoming frames, sent by `sender`, until it closes.
    pub(crate) async fn read_frames(
        &self,
        link: &Arc<PeerLink>,
        sender: Option<&Peer>,
        routes: &mut RouteCache,
        mut inbound: Streaming<Bytes>,
    ) {
        loop {
            match inbound.message().await {
                Ok(Some(frame)) => self.receive_frame(link, sender, routes, &frame),
                Ok(None) => return,
                Err(status) => {
                    tracing::warn!(peer = %link.node, error = %status, "link read failed");
                    return;
                }
            }
        }
    }

    /// Forgets `link` if it is still the registered link to its node.
    pub(crate) fn remove_peer(&self, link: &Arc<PeerLink>) {
        let mut peers = lock(&self.peers);
        if peers.get(&link.node).is_some_and(|l| Arc::ptr_eq(l, link)) {
            peers.remove(&link.node);
        }
    }
}

/// Tells of one route waiting to be enqueued together ([`NodeInner::receive_frame`]).
#[derive(Default)]
struct TellRun {
    route: Option<Arc<TellRoute>>,
    /// Where their bodies lie in the frame.
    bodies: Vec<Range<usize>>,
}
