//! [`Node`]: serves this system's named processes to other nodes and links to theirs.

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use muster_security::Security;
use muster_security::net::Listener;
use tokio::sync::watch;
use tonic::service::Routes;
use tonic::transport::Server;

use crate::accept::LinkService;
use crate::config::NodeConfig;
use crate::inbox::{Inbox, ProcessInbox, Registration};
use crate::receive::NodeInner;
use crate::remote_pid::RemotePid;
use crate::stats::TransportStats;
use crate::sync::lock;
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
        RemotePid::new(Arc::clone(&self.inner), upid)
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
