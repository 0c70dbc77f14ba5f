//! [`Node`]: serves this system's named processes to other nodes and links to theirs.

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use bytes::Bytes;
use futures_util::Stream;
use muster_proto::transport::{Envelope, Kind};
use muster_security::net::Listener;
use muster_security::{Peer, Role, Security};
use tokio::sync::watch;
use tonic::Streaming;
use tonic::service::Routes;
use tonic::transport::Server;

use crate::accept::LinkService;
use crate::dial::run_outbound;
use crate::inbox::{AskOrigin, Inbox, ProcessInbox, Registration, Route, TellRoute, Undelivered};
use crate::peer::{Limits, PeerLink};
use crate::route_cache::RouteCache;
use crate::stats::{Stats, TransportStats};
use crate::sync::lock;
use crate::wire::{EnvelopeRef, Envelopes, Item};
use crate::{NodeConfig, RemotePid};
use muster_actor::Upid;
use muster_actor::{Pid, Process, RemoteError, System};

/// Why a node could not start or a name could not be registered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    /// The listen address is not `host:port`.
    #[error("invalid listen address {address:?} (expected host:port)")]
    InvalidListenAddress {
        /// The address as given.
        address: String,
        /// Why it did not parse.
        source: std::net::AddrParseError,
    },
    /// The port is in use, or binding failed otherwise.
    #[error("cannot listen on {address}")]
    Bind {
        /// The address.
        address: SocketAddr,
        /// The operating system's error (e.g. address in use).
        source: std::io::Error,
    },
    /// Another process is registered under that name on this node.
    #[error("a process named {0:?} is already registered on this node")]
    NameTaken(String),
    /// The name cannot be part of an address.
    #[error(transparent)]
    InvalidName(#[from] RemoteError),
}

/// One node of a Muster cluster: a tonic server for the named processes of a [`System`], and
/// one long-lived bidirectional stream per peer node for messages both ways.
///
/// Cheap to clone. Stop it with [`shutdown`](Node::shutdown).
#[derive(Clone)]
pub struct Node {
    pub(crate) inner: Arc<NodeInner>,
}

pub(crate) struct NodeInner {
    pub(super) address: String,
    pub(crate) system: System,
    pub(crate) config: NodeConfig,
    processes: RwLock<HashMap<String, Arc<dyn Inbox>>>,
    /// Bumped after every change to `processes` or to what a registered process installed:
    /// link readers drop their cached routes when it moves.
    changes: Arc<AtomicU64>,
    pub(super) peers: Mutex<HashMap<String, Arc<PeerLink>>>,
    next_request: AtomicU64,
    /// Shared with the streams that write frames, which count what they send.
    pub(crate) stats: Arc<Stats>,
    pub(super) shutdown: watch::Sender<bool>,
}

impl Node {
    /// Listens on `address` (`host:port`; port 0 picks a free one) with `security` and the
    /// default limits.
    ///
    /// # Errors
    /// [`NodeError::Bind`] if the port is in use or cannot be bound, naming the address.
    pub async fn bind(
        system: &System,
        address: &str,
        security: Security,
    ) -> Result<Node, NodeError> {
        Node::bind_with(system, address, NodeConfig::new(security)).await
    }

    /// Listens on `address` with `config`.
    ///
    /// # Errors
    /// As [`bind`](Node::bind).
    pub async fn bind_with(
        system: &System,
        address: &str,
        config: NodeConfig,
    ) -> Result<Node, NodeError> {
        let listener = Node::listen(address).await?;
        Node::serve(system, listener, config, Routes::default())
    }

    /// Binds `address` (`host:port`; port 0 picks a free one) for [`serve`](Node::serve), so a
    /// caller can learn the address before it builds the other services the node will serve.
    ///
    /// # Errors
    /// [`NodeError::InvalidListenAddress`], or [`NodeError::Bind`] naming the address if the
    /// port is in use or cannot be bound.
    pub async fn listen(address: &str) -> Result<Listener, NodeError> {
        let socket: SocketAddr =
            address
                .parse()
                .map_err(|source| NodeError::InvalidListenAddress {
                    address: address.to_owned(),
                    source,
                })?;
        muster_security::net::bind(socket)
            .await
            .map_err(|source| NodeError::Bind {
                address: socket,
                source,
            })
    }

    /// Serves the transport on `listener`, together with the other tonic services in
    /// `routes` (a master adds its raft and operator services), on one port.
    ///
    /// # Errors
    /// [`NodeError::Bind`] if the listener has no local address.
    pub fn serve(
        system: &System,
        listener: Listener,
        config: NodeConfig,
        routes: Routes,
    ) -> Result<Node, NodeError> {
        let local = listener.local_addr();
        let (shutdown, mut stopped) = watch::channel(false);
        let address = config
            .advertise
            .clone()
            .unwrap_or_else(|| local.to_string());
        let inner = Arc::new(NodeInner {
            address,
            system: system.clone(),
            config,
            processes: RwLock::new(HashMap::new()),
            changes: Arc::default(),
            peers: Mutex::new(HashMap::new()),
            next_request: AtomicU64::new(1),
            stats: Arc::default(),
            shutdown,
        });
        let service = LinkService {
            node: Arc::clone(&inner),
        };
        let router = Server::builder()
            .tcp_nodelay(true)
            .http2_keepalive_interval(Some(inner.config.keepalive_interval))
            .http2_keepalive_timeout(Some(inner.config.keepalive_timeout))
            .add_routes(routes)
            .add_service(service);
        let stopped = async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        };
        let address = inner.address.clone();
        match &inner.config.security {
            Security::Tls(tls) => {
                let incoming = muster_security::tls::incoming(listener, tls.clone());
                tokio::spawn(async move {
                    if let Err(e) = router.serve_with_incoming_shutdown(incoming, stopped).await {
                        tracing::error!(node = %address, error = %e, "transport server failed");
                    }
                });
            }
            Security::Insecure => {
                let incoming = listener.incoming();
                tokio::spawn(async move {
                    if let Err(e) = router.serve_with_incoming_shutdown(incoming, stopped).await {
                        tracing::error!(node = %address, error = %e, "transport server failed");
                    }
                });
            }
        }
        Ok(Node { inner })
    }

    /// This node's address, `host:port`.
    pub fn address(&self) -> &str {
        &self.inner.address
    }

    /// The system whose processes this node serves.
    pub fn system(&self) -> &System {
        &self.inner.system
    }

    /// Makes `pid` reachable from other nodes as `name@<this node>`. Install the message types
    /// it accepts on the returned [`Registration`]. The name is freed when the process ends.
    ///
    /// # Errors
    /// [`NodeError::NameTaken`] if the name is in use, [`NodeError::InvalidName`] if it
    /// cannot be part of an address.
    pub fn register<P: Process>(
        &self,
        name: &str,
        pid: &Pid<P>,
    ) -> Result<Registration<P>, NodeError> {
        Upid::new(name, self.address())?;
        let inbox = Arc::new(ProcessInbox::new(
            pid.clone(),
            Arc::clone(&self.inner.changes),
        ));
        {
            let mut processes = self
                .inner
                .processes
                .write()
                .unwrap_or_else(|p| p.into_inner());
            if processes.contains_key(name) {
                return Err(NodeError::NameTaken(name.to_owned()));
            }
            processes.insert(name.to_owned(), inbox.clone() as Arc<dyn Inbox>);
            self.inner.changes.fetch_add(1, Ordering::Release);
        }
        let node = Arc::downgrade(&self.inner);
        let name = name.to_owned();
        let registered = Arc::downgrade(&inbox);
        pid.on_exit(move |_| {
            let Some(node) = node.upgrade() else { return };
            let mut processes = node.processes.write().unwrap_or_else(|p| p.into_inner());
            let same = processes.get(&name).is_some_and(|current| {
                std::ptr::addr_eq(Arc::as_ptr(current), registered.as_ptr())
            });
            if same {
                processes.remove(&name);
                node.changes.fetch_add(1, Ordering::Release);
            }
        });
        Ok(Registration { inbox })
    }

    /// A handle to the process at `upid` (which may be on this node or another).
    pub fn remote(&self, upid: Upid) -> RemotePid {
        RemotePid::new(self.clone(), upid)
    }

    /// Counters of what arrived and what could not be delivered.
    pub fn stats(&self) -> TransportStats {
        self.inner.stats.snapshot()
    }

    /// Stops serving and drops every link. Pending asks fail with `ConnectionLost`.
    pub fn shutdown(&self) {
        let _ = self.inner.shutdown.send(true);
        let peers = std::mem::take(&mut *lock(&self.inner.peers));
        for link in peers.into_values() {
            link.close(RemoteError::ConnectionLost(link.node.clone()));
        }
    }
}

impl fmt::Debug for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Node")
            .field("address", &self.inner.address)
            .finish()
    }
}

impl NodeInner {
    pub(crate) fn next_request_id(&self) -> u64 {
        self.next_request.fetch_add(1, Ordering::Relaxed)
    }

    pub(super) fn is_shut_down(&self) -> bool {
        *self.shutdown.borrow()
    }

    /// The link to `node`, connecting (in the background) if there is none.
    pub(crate) fn peer(self: &Arc<Self>, node: &str) -> Arc<PeerLink> {
        let mut peers = lock(&self.peers);
        if let Some(link) = peers.get(node) {
            return Arc::clone(link);
        }
        let link = PeerLink::new(node.to_owned(), self.limits(), Arc::clone(&self.stats));
        if self.is_shut_down() {
            link.close(RemoteError::ConnectionLost(node.to_owned()));
            return link;
        }
        peers.insert(node.to_owned(), Arc::clone(&link));
        tokio::spawn(run_outbound(Arc::clone(self), Arc::clone(&link)));
        link
    }

    /// How this node's links batch and bound what they send.
    pub(super) fn limits(&self) -> Limits {
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
    pub(super) fn receive_frame(
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
    pub(super) async fn read_frames(
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
    pub(super) fn remove_peer(&self, link: &Arc<PeerLink>) {
        let mut peers = lock(&self.peers);
        if peers.get(&link.node).is_some_and(|l| Arc::ptr_eq(l, link)) {
            peers.remove(&link.node);
        }
    }
}

/// The roles a node links with: the cluster's members. Client certificates (people, the CLI)
/// use the APIs, never the actor transport.
pub(super) const MEMBER_ROLES: &[Role] = &[Role::Master, Role::Agent];

/// `frames`, each counted in `stats` as it is written.
pub(super) fn counted(
    stats: &Arc<Stats>,
    frames: impl Stream<Item = Bytes> + Send + 'static,
) -> impl Stream<Item = Bytes> + Send + 'static {
    let stats = Arc::clone(stats);
    futures_util::StreamExt::inspect(frames, move |frame| {
        stats
            .bytes_sent
            .fetch_add(frame.len() as u64, Ordering::Relaxed);
    })
}

/// Tells of one route waiting to be enqueued together ([`NodeInner::receive_frame`]).
#[derive(Default)]
struct TellRun {
    route: Option<Arc<TellRoute>>,
    /// Where their bodies lie in the frame.
    bodies: Vec<Range<usize>>,
}
