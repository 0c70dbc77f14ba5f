//! A whole master: its port, registry member, master process, operator and scheduling APIs,
//! started together.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;

use muster_actor::{Pid, System};
use muster_proto::cluster as pb;
use muster_registry::{RegistryConfig, RegistryError, RegistryNode, StoreLocation};
use muster_transport::health;
use muster_transport::{Node, NodeConfig, NodeError};
use std::sync::Arc;

use muster_security::{Guarded, Role, TokenSource};

/// Who may send the master's agent-facing messages: agent certificates only.
const AGENTS: &[Role] = &[Role::Agent];

use crate::authorization::{operator_rules, scheduling_rules};
use crate::config::{MasterConfig, Placement};
use crate::master::Master;
use crate::master::requests::{
    GetSchedulingPids, Heartbeat, RegisterAgent, ReregisterAgent, TaskStatus, UseNode,
};
use crate::operator::OperatorService;
use crate::scheduling_service::SchedulingService;
use crate::workers::{LocalBackend, Workers};

/// Why a master could not start (a refused request is a
/// [`ServiceError`](crate::ServiceError)).
#[derive(Debug, thiserror::Error)]
pub enum MasterError {
    /// The listening address is malformed or the port is taken.
    #[error(transparent)]
    Listen(#[from] NodeError),
    /// The registry could not start (data dir, raft).
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// The config is inconsistent.
    #[error("invalid master config: {0}")]
    Config(String),
}

/// The services whose health the master reports (beside the whole server's).
const HEALTH_SERVICES: &[&str] = &[
    pb::operator_server::SERVICE_NAME,
    muster_proto::scheduling::scheduling_server::SERVICE_NAME,
];

/// A running master.
#[derive(Debug)]
pub struct MasterServer {
    system: System,
    node: Node,
    registry: RegistryNode,
    master: Pid<Master>,
    address: String,
    http_address: String,
    http_stop: tokio::sync::watch::Sender<bool>,
    workers: Workers,
}

impl MasterServer {
    /// Binds the port, starts the registry member, spawns the master process, and serves the
    /// actor transport, raft and the operator API on the one port.
    ///
    /// # Errors
    /// [`MasterError`] naming the address, data dir or config problem.
    #[inline(never)]
    pub fn start(
        config: MasterConfig,
    ) -> Pin<Box<dyn Future<Output = Result<Self, MasterError>> + Send>> {
        // A plain function that boxes the start: the whole start-up, and every future it awaits, is
        // compiled here once rather than again in each crate that awaits it (an `async fn` is
        // compiled where it is first polled, and release builds share no generic code).
        Box::pin(Self::start_here(config))
    }

    async fn start_here(config: MasterConfig) -> Result<Self, MasterError> {
        config.job_limits.validate().map_err(MasterError::Config)?;
        if config.agents_per_certificate == 0 {
            return Err(MasterError::Config(
                "--agents-per-certificate must be at least 1".into(),
            ));
        }
        let listener = Node::listen(&config.listen).await?;
        let local = listener.local_addr().to_string();
        let members = if config.members.is_empty() {
            BTreeMap::from([(config.id, local.clone())])
        } else {
            config.members.clone()
        };
        let address = members.get(&config.id).cloned().ok_or_else(|| {
            MasterError::Config(format!(
                "master id {} is not among the peers {:?}",
                config.id,
                members.keys().collect::<Vec<_>>()
            ))
        })?;
        if config.removal_limit.is_nan() || !(0.0..=1.0).contains(&config.removal_limit) {
            return Err(MasterError::Config(format!(
                "removal limit {} is not a share between 0 and 1",
                config.removal_limit
            )));
        }
        if config.ping_interval.is_zero() {
            return Err(MasterError::Config("ping interval must be non-zero".into()));
        }
        // The HTTP API's port is bound before anything starts, so a port in use is named at
        // once.
        // A master told to take any free port (`:0`) takes any free port for HTTP too: its
        // gRPC port plus ten may be another program's.
        let any_port = config
            .listen
            .rsplit_once(':')
            .is_some_and(|(_, port)| port == "0");
        let http_listen = config
            .http_address(if any_port { &config.listen } else { &local })
            .map_err(MasterError::Config)?;
        let http_listener = Node::listen(&http_listen).await?;
        let http_config = crate::http::HttpConfig {
            members: members.clone(),
            http_members: config.http_members.clone(),
            grpc_address: address.clone(),
            http_address: http_listener.local_addr().to_string(),
        };
        let link_keepalive = config.link_keepalive;
        if link_keepalive.is_zero() {
            return Err(MasterError::Config(
                "link keepalive must be non-zero".into(),
            ));
        }
        let registry = RegistryNode::start(RegistryConfig {
            id: config.id,
            members,
            store: match &config.registry_store {
                Some(disk) => StoreLocation::Memory(disk.clone()),
                None => StoreLocation::Directory(config.data_dir.clone()),
            },
            heartbeat_interval: config.raft_heartbeat,
            election_timeout: config.raft_election_timeout,
            snapshot_after_entries: 5_000,
            entries_kept_after_snapshot: 1_000,
            security: config.security.clone(),
            rejoin_damaged: config.rejoin_damaged,
            encoding: config.registry_encoding,
            join: config.join.clone(),
        })
        .await?;

        let workers = config.workers;
        let placement = config.placement;
        let security = config.security.clone();
        let system = System::new();
        let master = Master::new(config, address.clone(), registry.clone(), &system);
        let serving = master.serving();
        let master = system.spawn(master);
        let scheduling = master
            .ask(|reply| GetSchedulingPids { reply }.into())
            .await
            .map_err(|e| MasterError::Config(format!("the master process did not start: {e}")))?;
        let backend = LocalBackend::new(master.clone(), scheduling.broker);
        // Each service behind its guard, with the rules of `authorization.rs`; tokens are
        // the registry's applied ones.
        let tokens: Arc<dyn TokenSource> = Arc::new(registry.reader().clone());
        let http_address = http_config.http_address.clone();
        let (http_stop, mut http_stopped) = tokio::sync::watch::channel(false);
        crate::http::serve(
            http_listener,
            &security,
            crate::http::router(crate::http::ApiState {
                operator: OperatorService::new(master.clone(), registry.clone()),
                master: master.clone(),
                tokens: Arc::clone(&tokens),
                rules: Arc::new(crate::authorization::operator_rules()),
                secure: !security.is_insecure(),
                serving: serving.clone(),
                config: Arc::new(http_config),
            }),
            async move {
                let _ = http_stopped.wait_for(|stop| *stop).await;
            },
        );
        // Health and reflection need a certificate of the cluster (as every connection does)
        // but no token: load balancers and grpcurl ask them. SERVING while this master leads,
        // or stands by knowing the leader.
        let routes = health::operator_routes(serving, HEALTH_SERVICES)
            .await
            .map_err(|e| MasterError::Config(format!("gRPC reflection: {e}")))?
            .add_service(registry.raft_service())
            .add_service(Guarded::new(
                OperatorService::new(master.clone(), registry.clone()).into_server(),
                operator_rules(),
                &security,
                Arc::clone(&tokens),
            ))
            .add_service(Guarded::new(
                SchedulingService::new(backend.clone(), address.clone()).into_server(),
                scheduling_rules(),
                &security,
                tokens,
            ));
        let mut node_config = NodeConfig::new(security.clone());
        node_config.keepalive_interval = link_keepalive;
        node_config.keepalive_timeout = link_keepalive;
        let node = Node::serve(&system, listener, node_config, routes)?;
        // Only fails if the master already ended, which `start` would have no way to cause.
        let _ = master.tell(UseNode { node: node.clone() }.into());
        node.register("master", &master)?
            .install_ask_from::<pb::RegisterAgent, pb::RegistrationReply>(AGENTS, |m, r, s| {
                RegisterAgent {
                    request: m,
                    reply: r,
                    sender: s,
                }
                .into()
            })
            .install_ask_from::<pb::ReregisterAgent, pb::RegistrationReply>(AGENTS, |m, r, s| {
                ReregisterAgent {
                    request: m,
                    reply: r,
                    sender: s,
                }
                .into()
            })
            .install_ask_from::<pb::Heartbeat, pb::HeartbeatReply>(AGENTS, |m, r, s| {
                Heartbeat {
                    heartbeat: m,
                    reply: r,
                    sender: s,
                }
                .into()
            })
            .install_from::<pb::TaskStatusUpdate>(AGENTS, |m, s| {
                TaskStatus {
                    update: m,
                    sender: s,
                }
                .into()
            });
        let config = muster_scheduler::WorkerConfig::default();
        let workers = match placement {
            Placement::Binpack => {
                Workers::start(workers, backend, config, muster_scheduler::binpack)
            }
            Placement::Spread => Workers::start(workers, backend, config, muster_scheduler::spread),
        };
        Ok(MasterServer {
            workers,
            system,
            node,
            registry,
            master,
            address,
            http_address,
            http_stop,
        })
    }

    /// The address agents, peers and operators use (`host:port`).
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Where the HTTP/JSON API listens (`host:port`).
    pub fn http_address(&self) -> &str {
        &self.http_address
    }

    /// The master process.
    pub fn pid(&self) -> &Pid<Master> {
        &self.master
    }

    /// This master's registry member.
    pub fn registry(&self) -> &RegistryNode {
        &self.registry
    }

    /// The node serving the port.
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// Stops serving, stops raft and ends the master's processes.
    pub async fn shutdown(self) {
        self.workers.stop().await;
        let _ = self.http_stop.send(true);
        self.node.shutdown();
        self.registry.shutdown().await;
        self.system.shutdown().await;
    }
}
