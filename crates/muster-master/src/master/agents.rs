//! Agents: registration, re-registration and heartbeats (sent by agents over the actor
//! transport), drains and eligibility (operators), and the timers that find agents gone.
//! What happens around them lives beside: `heartbeats` (deadlines and TTLs), `pings`
//! (Mesos-style pings), `drains`, `lost` (marking agents unreachable), `arriving` (an agent
//! joining or coming back) and `reregistration` (rebuilding an agent after a failover).
//!
//! Only agent certificates reach these handlers (the types are installed for
//! [`Role::Agent`](muster_security::Role::Agent) in `server.rs`). Each message also carries
//! the sender's certificate name: registration binds the new agent id to it, and every later
//! message for that id must come from a certificate of the same name ([`Master::speaks_for`]),
//! so one agent cannot speak for another.

use muster_actor::{Context, Reply};
use muster_model::AgentId;
use muster_proto::cluster as pb;
use muster_proto::model as model_pb;
use muster_registry::{Op, Outcome, WriteError};
use muster_security::Peer;

pub(super) mod arriving;
pub(super) mod drains;
pub(super) mod heartbeats;
pub(super) mod lost;
mod pings;
pub(super) mod reregistration;

use super::leadership::Role;
use super::{Master, Request, answered_request, notice};
use crate::cluster::{AgentEntry, live_jobs_reported, registry_info, running_reported, same_info};
use crate::error::ServiceError;

/// An agent asks to be admitted (`RegisterAgent`, over the actor transport).
#[derive(Debug)]
pub struct RegisterAgent {
    /// What it says of itself.
    pub request: pb::RegisterAgent,
    /// Its new id, or why not.
    pub reply: Reply<pb::RegistrationReply>,
    /// The sender's verified certificate (`None` from this process or on an insecure cluster).
    pub sender: Option<Peer>,
}

/// An agent comes back with everything it runs (`ReregisterAgent`).
#[derive(Debug)]
pub struct ReregisterAgent {
    /// What it says of itself and what it runs.
    pub request: pb::ReregisterAgent,
    /// Whether it is taken back, and the tasks it must kill.
    pub reply: Reply<pb::RegistrationReply>,
    /// The sender's verified certificate.
    pub sender: Option<Peer>,
}

/// An agent's heartbeat.
#[derive(Debug)]
pub struct Heartbeat {
    /// Which agent.
    pub heartbeat: pb::Heartbeat,
    /// Its next TTL, or why not.
    pub reply: Reply<pb::HeartbeatReply>,
    /// The sender's verified certificate.
    pub sender: Option<Peer>,
}

/// Drain an agent (`muster agent drain`), or cancel its drain.
#[derive(Debug)]
pub struct DrainAgent {
    /// The agent, the deadline, whether to cancel.
    pub request: pb::DrainAgentRequest,
    /// The agent's scheduling as written.
    pub reply: Reply<Result<pb::AgentSchedulingReply, ServiceError>>,
}

/// Whether new tasks may go to an agent.
#[derive(Debug)]
pub struct SetAgentEligibility {
    /// The agent and its eligibility.
    pub request: pb::AgentEligibilityRequest,
    /// The agent's scheduling as written.
    pub reply: Reply<Result<pb::AgentSchedulingReply, ServiceError>>,
}

/// The master's timer: ping the connected agents (with `--pings`).
#[derive(Debug)]
pub struct PingAgents;

/// The master's timer: mark the agents whose heartbeat deadline passed unreachable.
#[derive(Debug)]
pub struct CheckHeartbeats;

/// The master's timer: carry the drains under way forward.
#[derive(Debug)]
pub struct CheckDrains;

impl Request for RegisterAgent {
    fn waits_for_registry(&self) -> bool {
        true
    }
    /// This master does not lead, and knows no leader.
    fn refuse(self, _error: ServiceError) {
        self.reply.send(not_leader(None));
    }
}

impl Request for ReregisterAgent {
    fn waits_for_registry(&self) -> bool {
        true
    }
    fn refuse(self, _error: ServiceError) {
        self.reply.send(not_leader(None));
    }
}

impl Request for Heartbeat {
    fn waits_for_registry(&self) -> bool {
        true
    }
    fn refuse(self, _error: ServiceError) {
        self.reply
            .send(heartbeat_reply(pb::heartbeat_reply::Result::NotLeader(
                model_pb::NotLeader::default(),
            )));
    }
}

answered_request!(DrainAgent, SetAgentEligibility);
notice!(PingAgents, CheckHeartbeats, CheckDrains);

/// The certificate name a message came from; `None` for a message from this process (a test,
/// a bench) or on an insecure cluster, which is trusted and binds nothing.
pub(super) fn identity(sender: Option<&Peer>) -> Option<&str> {
    sender.map(|peer| peer.name.as_str())
}

/// An agent's answer from a master that does not lead: the leader's process
/// (`master@host:port`) if known, for the agent to try next.
fn not_leader(leader: Option<&(u64, String)>) -> pb::RegistrationReply {
    pb::RegistrationReply {
        result: Some(pb::registration_reply::Result::NotLeader(
            model_pb::NotLeader {
                leader: leader
                    .map(|(_, address)| format!("master@{address}"))
                    .unwrap_or_default(),
            },
        )),
        ..pb::RegistrationReply::default()
    }
}

/// Admitted under `id` by the leader of `term`; the agent kills `kill_tasks` first.
fn admitted(id: String, kill_tasks: Vec<String>, term: u64) -> pb::RegistrationReply {
    pb::RegistrationReply {
        result: Some(pb::registration_reply::Result::AgentId(id)),
        kill_tasks,
        term,
        reads_tasks_sharing_labels: true,
    }
}

/// Refused, and why.
fn refused(why: String) -> pb::RegistrationReply {
    pb::RegistrationReply {
        result: Some(pb::registration_reply::Result::Refused(why)),
        ..pb::RegistrationReply::default()
    }
}

/// A re-registration under an id the registry does not hold: the agent should register anew.
fn unknown_agent(id: &str) -> pb::RegistrationReply {
    pb::RegistrationReply {
        result: Some(pb::registration_reply::Result::UnknownAgent(format!(
            "agent id {id:?} was never admitted to this cluster (or has been forgotten); \
             register anew"
        ))),
        ..pb::RegistrationReply::default()
    }
}

fn heartbeat_reply(result: pb::heartbeat_reply::Result) -> pb::HeartbeatReply {
    pb::HeartbeatReply {
        result: Some(result),
        term: 0,
        masters: Vec::new(),
    }
}

impl Master {
    /// The raft group's masters now, as agents address them (`master@host:port`): every
    /// master serves the actor transport on its raft address.
    fn master_processes(&self) -> Vec<String> {
        self.registry
            .members()
            .values()
            .map(|address| format!("master@{address}"))
            .collect()
    }

    /// [`RegisterAgent`].
    pub(super) fn register_agent(
        &mut self,
        RegisterAgent {
            request,
            reply,
            sender,
        }: RegisterAgent,
        ctx: &mut Context<Self>,
    ) {
        self.register(request, reply, sender.as_ref(), ctx);
    }

    /// [`ReregisterAgent`].
    pub(super) fn reregister_agent(
        &mut self,
        ReregisterAgent {
            request,
            reply,
            sender,
        }: ReregisterAgent,
        ctx: &mut Context<Self>,
    ) {
        self.reregister(request, reply, sender.as_ref(), ctx);
    }

    /// [`Heartbeat`].
    pub(super) fn heartbeat(
        &mut self,
        Heartbeat {
            heartbeat,
            reply,
            sender,
        }: Heartbeat,
        _ctx: &mut Context<Self>,
    ) {
        self.instruments.heartbeat_received();
        self.on_heartbeat(heartbeat, reply, identity(sender.as_ref()));
    }

    /// Whether a message from certificate `identity` may speak for agent `agent_id`: the
    /// certificate name the agent registered with must be the sender's. An agent this master
    /// does not hold in memory is checked by the caller against the registry.
    pub(super) fn speaks_for(&self, agent_id: &str, identity: Option<&str>) -> Result<(), String> {
        match self.cluster.agents.get(agent_id) {
            Some(agent) => bound_to(agent_id, &agent.info.identity, identity),
            None => Ok(()),
        }
    }

    fn register(
        &mut self,
        request: pb::RegisterAgent,
        reply: Reply<pb::RegistrationReply>,
        sender: Option<&Peer>,
        ctx: &mut Context<Self>,
    ) {
        let identity = identity(sender);
        if !matches!(self.role, Role::Leading { .. }) {
            return reply.send(not_leader(self.leader().as_ref()));
        }
        let registration = request.registration;
        let version = request.version;
        let Some(info) = request.info else {
            return reply.send(refused("RegisterAgent carries no agent info".into()));
        };
        if let Err(why) = proves_address(sender, &info.address) {
            self.metrics.impersonations += 1;
            tracing::warn!(address = %info.address, %why, "registration refused");
            return reply.send(refused(why));
        }
        // The same agent asking again (its first answer was lost, say in a failover, after the
        // admission was written): taken back under the id it was given, never admitted twice.
        let admitted_before = self.registry.reader().read(|state| {
            state
                .registered_as(identity.unwrap_or_default(), &info.address, &info.hostname)
                .map(|id| id.0.clone())
        });
        if let Some(agent_id) = admitted_before {
            tracing::info!(agent = %agent_id, address = %info.address, "an admitted agent registers again: taken back under its id");
            let again = pb::ReregisterAgent {
                agent_id,
                info: Some(info),
                registration,
                ..pb::ReregisterAgent::default()
            };
            return self.reregister(again, reply, sender, ctx);
        }
        if let Some(identity) = identity {
            match self.certificate_holds(identity, &info) {
                Holds::Room => {}
                Holds::TakeOver(agent_id) => {
                    tracing::info!(agent = %agent_id, certificate = identity, address = %info.address, "the agent of this certificate registers from elsewhere: taken back under its id");
                    let again = pb::ReregisterAgent {
                        agent_id,
                        info: Some(info),
                        registration,
                        ..pb::ReregisterAgent::default()
                    };
                    return self.reregister(again, reply, sender, ctx);
                }
                Holds::Full(why) => {
                    self.metrics.impersonations += 1;
                    tracing::warn!(certificate = identity, address = %info.address, %why, "registration refused");
                    return reply.send(refused(why));
                }
            }
        }
        let info = registry_info(&info, identity.unwrap_or_default());
        let Role::Leading { registrar, .. } = &self.role else {
            return reply.send(not_leader(self.leader().as_ref()));
        };
        let write = self.write_registry(registrar, Op::AdmitAgent(info.clone()));
        let term = self.term;
        ctx.defer(
            write,
            move |master: &mut Master, ctx, written| match written {
                Ok(Ok(Outcome::Admitted(id))) => {
                    if master.leading_term() == Some(term) {
                        tracing::info!(agent = %id, address = %info.address, "agent registered");
                        master.metrics.registered += 1;
                        let mut entry =
                            AgentEntry::connected(info, registration, Vec::new(), Vec::new());
                        entry.version = version;
                        master.cluster.agents.insert(id.0.clone(), entry);
                        master.heartbeat_received(&id.0);
                        master.publish_agent(&id.0, "agent-registered");
                        master.agent_joined(&id.0, ctx);
                    }
                    reply.send(admitted(id.0, Vec::new(), term));
                }
                Ok(Err(WriteError::NotLeader { leader })) => {
                    reply.send(not_leader(leader.as_ref()))
                }
                Ok(other) => reply.send(refused(format!("registry write failed: {other:?}"))),
                // The registrar stops only when this master stops leading: the agent should
                // look for the leader, not back off.
                Err(e) => {
                    tracing::debug!(error = %e, "registrar gone: no longer leading");
                    reply.send(not_leader(master.leader().as_ref()));
                }
            },
        );
    }

    fn reregister(
        &mut self,
        request: pb::ReregisterAgent,
        reply: Reply<pb::RegistrationReply>,
        sender: Option<&Peer>,
        ctx: &mut Context<Self>,
    ) {
        let identity = identity(sender);
        if self.leading_term().is_none() {
            return reply.send(not_leader(self.leader().as_ref()));
        }
        let Some(info) = request.info.as_ref() else {
            return reply.send(refused("ReregisterAgent carries no agent info".into()));
        };
        if let Err(why) = proves_address(sender, &info.address) {
            self.metrics.impersonations += 1;
            tracing::warn!(agent = %request.agent_id, address = %info.address, %why, "re-registration refused");
            return reply.send(refused(why));
        }
        if request.agent_id.is_empty() {
            return reply.send(refused("ReregisterAgent carries no agent id".into()));
        }
        let id = AgentId(request.agent_id.clone());
        let (unchanged, bound, away) = self.registry.reader().read(|state| {
            let admitted = state.agents.get(&id);
            let unchanged = admitted.is_some_and(|stored| {
                same_info(info, stored) && identity.is_none_or(|id| stored.identity == id)
            });
            let unreachable = state.unreachable.get(&id);
            let stored = admitted.or(unreachable.map(|u| &u.info));
            (
                unchanged,
                stored.map(|stored| stored.identity.clone()),
                // Back from unreachable: what it ran then, as the registry kept it.
                unreachable.filter(|_| admitted.is_none()).cloned(),
            )
        });
        let Some(bound) = bound else {
            tracing::warn!(agent = %request.agent_id, "re-registration under an id never admitted: the agent must register anew");
            self.metrics.unknown_agents += 1;
            return reply.send(unknown_agent(&request.agent_id));
        };
        if let Err(why) = bound_to(&request.agent_id, &bound, identity) {
            self.metrics.impersonations += 1;
            tracing::warn!(agent = %request.agent_id, %why, "re-registration refused");
            return reply.send(refused(why));
        }
        // Who it stays bound to: the sender's certificate, or (from this process) as before.
        let identity = identity.map_or(bound, str::to_owned);
        if unchanged {
            // The common case after a failover: nothing to write.
            let (id, kill) = self.readmit(request, &identity, None, ctx);
            return reply.send(admitted(id, kill, self.term));
        }
        // Changed info, or an agent marked unreachable coming back: store it, with an
        // evaluation for each job its return affects, in one raft entry; then take it back.
        // What an unreachable agent still runs is UNKNOWN: settled by each group's
        // `disconnect` policy when it is back.
        let evals = self.evals_for_arriving_agent(
            &request.agent_id,
            &live_jobs_reported(running_reported(&request)),
        );
        let info = registry_info(info, &identity);
        let term = self.term;
        self.write_with_evals(
            vec![Op::UpdateAgent { id, info }],
            evals,
            ctx,
            move |master, ctx, written| match written {
                Ok(_) if master.leading_term() == Some(term) => {
                    let (id, kill) = master.readmit(request, &identity, away, ctx);
                    reply.send(admitted(id, kill, term));
                }
                Ok(_) => reply.send(not_leader(master.leader().as_ref())),
                Err(WriteError::NotLeader { leader }) => reply.send(not_leader(leader.as_ref())),
                Err(e) => reply.send(refused(format!("registry write failed: {e}"))),
            },
        );
    }

    /// Answers an agent's heartbeat with its next TTL, and moves its deadline.
    fn on_heartbeat(
        &mut self,
        heartbeat: pb::Heartbeat,
        reply: Reply<pb::HeartbeatReply>,
        identity: Option<&str>,
    ) {
        use pb::heartbeat_reply::Result as Answer;
        if self.leading_term().is_none() {
            let leader = self
                .leader()
                .map(|(_, address)| format!("master@{address}"))
                .unwrap_or_default();
            return reply.send(heartbeat_reply(Answer::NotLeader(model_pb::NotLeader {
                leader,
            })));
        }
        let id = heartbeat.agent_id;
        if let Err(why) = self.speaks_for(&id, identity) {
            self.metrics.impersonations += 1;
            tracing::warn!(agent = %id, %why, "heartbeat refused");
            return reply.send(heartbeat_reply(Answer::Refused(why)));
        }
        let connected = self.cluster.agents.get(&id).is_some_and(|a| a.connected);
        if !connected {
            let why = if id.is_empty() {
                "the heartbeat carries no agent id".to_owned()
            } else if self.cluster.agents.contains_key(&id) {
                format!("agent {id} has not re-registered with this master; re-register")
            } else {
                format!("agent {id} is not registered (unknown or unreachable); re-register")
            };
            return reply.send(heartbeat_reply(Answer::Refused(why)));
        }
        let ttl = self.heartbeat_received(&id);
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        reply.send(pb::HeartbeatReply {
            result: Some(Answer::TtlMs(ttl_ms)),
            term: self.term,
            masters: self.master_processes(),
        });
    }
}

/// Whether a registration from `sender` may claim `address` (`name@host:port`): the host must
/// be one its certificate is valid for. A message from this process (`None`) may claim any.
fn proves_address(sender: Option<&Peer>, address: &str) -> Result<(), String> {
    let Some(peer) = sender else {
        return Ok(());
    };
    let authority = address
        .rsplit_once('@')
        .map_or(address, |(_, authority)| authority);
    let Some((host, _port)) = authority.rsplit_once(':') else {
        return Err(format!(
            "the agent address {address:?} is not NAME@HOST:PORT"
        ));
    };
    if peer.proves_host(host) {
        return Ok(());
    }
    Err(format!(
        "the agent certificate {:?} is not valid for {host:?}, the host of the address it \
         registers ({address}); an agent registers only an address its certificate names \
         (muster tls cert create --additional-ipaddress or --additional-dnsname)",
        peer.name
    ))
}

/// What an agent certificate holds when a new agent registers with it.
enum Holds {
    /// Fewer agents than it may: a new one is admitted.
    Room,
    /// Its one agent, which is not connected: the new registration takes its id over.
    TakeOver(String),
    /// As many as it may, connected: refused, and why.
    Full(String),
}

impl Master {
    /// Whether the agent certificate `identity` may register another agent (described by
    /// `info`): one certificate speaks for one agent id (or `agents_per_certificate`).
    fn certificate_holds(&self, identity: &str, info: &model_pb::AgentInfo) -> Holds {
        let limit = self.config.agents_per_certificate;
        let held: Vec<AgentId> = self
            .registry
            .reader()
            .read(|state| state.agents_of_certificate(identity).to_vec());
        if held.len() < limit {
            return Holds::Room;
        }
        let connected = |id: &AgentId| self.cluster.agents.get(&id.0).is_some_and(|a| a.connected);
        if let [only] = held.as_slice()
            && !connected(only)
        {
            return Holds::TakeOver(only.0.clone());
        }
        let holder = held
            .iter()
            .find(|id| connected(id))
            .or(held.first())
            .map_or_else(String::new, |id| id.0.clone());
        Holds::Full(format!(
            "the agent certificate {identity:?} already holds {} ({holder} among them, still \
             connected); an agent at {} needs a certificate of its own",
            if limit == 1 {
                "an agent".to_owned()
            } else {
                format!("{limit} agents, as many as this master allows per certificate")
            },
            info.address
        ))
    }
}

/// Whether certificate `identity` may speak for `agent_id`, bound to certificate `bound` at
/// registration. An agent admitted without TLS (bound to no name) is taken over by the first
/// certificate that re-registers it.
fn bound_to(agent_id: &str, bound: &str, identity: Option<&str>) -> Result<(), String> {
    let Some(identity) = identity else {
        return Ok(());
    };
    if bound.is_empty() || bound == identity {
        return Ok(());
    }
    Err(format!(
        "agent {agent_id} registered with the certificate of {bound:?}; a certificate of \
         {identity:?} cannot speak for it"
    ))
}
