//! The agent's link to the leading master: registration rounds over the configured masters
//! (after a random delay, with capped exponential backoff and jitter between failed rounds),
//! following `NotLeader` hints to the leader, re-registration with the agent's full state,
//! heartbeats at half of each TTL the master gives, and noticing that the master is gone (its
//! link breaks, it stops answering heartbeats or, if it takes none, stops pinging). Everything
//! that decides which master the agent talks to lives here.

use muster_transport::LinkRemote;
use std::collections::VecDeque;
use std::time::Duration;

use muster_actor::{AskError, Context, RemoteError, Reply, Upid};
use muster_proto::cluster::{
    Heartbeat, HeartbeatReply, Ping, Pong, RegisterAgent, RegistrationReply, ReregisterAgent,
    heartbeat_reply, registration_reply,
};
use tokio::time::Instant;

use super::{Agent, AgentMsg, AgentStatus, Msg};
use crate::backoff;
use crate::reregistration::{REREGISTRATION_BUDGET, fit_within, group_by_shared_labels};
use crate::runner::Stop;
use crate::store::{self, blocking};

/// How many `NotLeader` redirects one registration round follows before it gives up on them
/// (standbys that point at each other must not keep the agent busy forever).
const MAX_REDIRECTS: u32 = 8;

/// The shortest wait between two heartbeats, whatever TTL the master gives.
const MIN_HEARTBEAT_INTERVAL: Duration = Duration::from_millis(10);

/// Where the agent is in finding a master.
#[derive(Debug)]
pub(super) enum Connection {
    /// Waiting for the delay before the next round.
    Waiting,
    /// A round is on: a request to one master is out, `queue` are the ones left to try.
    Trying {
        queue: VecDeque<Upid>,
        redirects: u32,
    },
    /// Registered with this master.
    Registered { master: Upid },
}

/// Whether the current master takes heartbeats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Heartbeats {
    /// Not known yet: the first heartbeat is out.
    Unknown,
    /// It answers them with TTLs: its answers (within the master-silence timeout) say it is
    /// there.
    Active,
    /// It does not (a master from before heartbeats): its pings say it is there.
    Unsupported,
}

impl Agent {
    /// Any ping while registered counts as the master being there: the address a master
    /// names itself by may differ from the one the agent reached it at (`localhost` against
    /// `127.0.0.1`), and strictness would make the agent re-register for nothing. A master that
    /// is really gone is noticed by its link.
    pub(super) fn on_ping(&mut self, ping: &Ping, reply: Reply<Pong>) {
        if let Connection::Registered { master } = &self.connection {
            if !ping.master.is_empty() && ping.master != master.to_string() {
                tracing::debug!(from = %ping.master, %master, "ping from another master address");
            }
            self.last_ping = Instant::now();
        }
        reply.send(Pong {
            agent_id: self.agent_id.clone().unwrap_or_default(),
        });
    }

    // ---- finding a master -------------------------------------------------------------------

    /// Sends `Round` for the current generation after `delay`.
    pub(super) fn schedule_round(&mut self, ctx: &mut Context<Self>, delay: Duration) {
        self.connection = Connection::Waiting;
        let generation = self.generation;
        ctx.delay(delay, AgentMsg(Msg::Round { generation }));
    }

    /// Starts a round over the configured masters, the one lost last at the end, as a new
    /// registration of the agent (see `fencing::next_registration`).
    pub(super) fn begin_round(&mut self, ctx: &mut Context<Self>) {
        if let Some(probe) = self.probe.take() {
            probe.abort();
        }
        self.next_registration();
        let mut queue: VecDeque<Upid> = self
            .masters
            .iter()
            .filter(|m| Some(*m) != self.lost.as_ref())
            .cloned()
            .collect();
        if let Some(lost) = &self.lost
            && self.masters.contains(lost)
        {
            queue.push_back(lost.clone());
        }
        if let Some(preferred) = self.preferred.take() {
            queue.retain(|m| *m != preferred);
            queue.push_front(preferred);
        }
        self.connection = Connection::Trying {
            queue,
            redirects: 0,
        };
        self.try_next(ctx);
    }

    /// Asks the next master of the round, or ends the round with a backoff if none is left.
    fn try_next(&mut self, ctx: &mut Context<Self>) {
        let Connection::Trying { queue, .. } = &mut self.connection else {
            return;
        };
        let Some(master) = queue.pop_front() else {
            self.round_failed(ctx, "no master accepted the agent");
            return;
        };
        let remote = self.node.remote(master.clone());
        let timeout = self.config.ask_timeout;
        let generation = self.generation;
        let reply_to = master.clone();
        let ask: std::pin::Pin<
            Box<dyn Future<Output = Result<RegistrationReply, AskError>> + Send>,
        > = match &self.agent_id {
            Some(agent_id) => {
                let grouped = self.reads_tasks_sharing_labels.as_ref() == Some(&master);
                let request = self.reregister_request(agent_id, grouped);
                tracing::info!(
                    %master,
                    agent_id,
                    tasks = request.tasks.len()
                        + request
                            .tasks_sharing_labels
                            .iter()
                            .map(|group| group.tasks.len())
                            .sum::<usize>(),
                    completed_tasks = request.completed_tasks.len(),
                    "re-registering"
                );
                Box::pin(async move {
                    remote
                        .ask_timeout::<ReregisterAgent, RegistrationReply>(timeout, request)
                        .await
                })
            }
            None => {
                tracing::info!(%master, "registering");
                let request = RegisterAgent {
                    info: Some(self.info.clone()),
                    registration: self.registration,
                    version: muster_proto::version::BUILD_VERSION.to_owned(),
                };
                Box::pin(async move {
                    remote
                        .ask_timeout::<RegisterAgent, RegistrationReply>(timeout, request)
                        .await
                })
            }
        };
        ctx.defer(ask, move |_agent: &mut Agent, ctx, result| {
            let _ = ctx.pid().tell(AgentMsg(Msg::Replied {
                generation,
                master: reply_to,
                result,
            }));
        });
    }

    /// Everything the agent runs, for a master; with `grouped` (the master said it reads
    /// them), running tasks that share their labels go in groups.
    fn reregister_request(&self, agent_id: &str, grouped: bool) -> ReregisterAgent {
        let (tasks, tasks_sharing_labels) = if grouped {
            group_by_shared_labels(self.tasks.running())
        } else {
            (self.tasks.running(), Vec::new())
        };
        let mut request = ReregisterAgent {
            agent_id: agent_id.to_owned(),
            info: Some(self.info.clone()),
            frameworks: self.tasks.frameworks(),
            tasks,
            completed_frameworks: self.tasks.completed_frameworks(),
            completed_tasks: self.tasks.completed(),
            tasks_sharing_labels,
            registration: self.registration,
            version: muster_proto::version::BUILD_VERSION.to_owned(),
        };
        let stripped = fit_within(&mut request, REREGISTRATION_BUDGET);
        if stripped > 0 {
            tracing::warn!(
                tasks = stripped,
                budget = REREGISTRATION_BUDGET,
                "the re-registration is over its size budget: tasks are reported without their \
                 arguments and environments"
            );
        }
        request
    }

    /// No master took the agent this round: wait (capped exponential backoff with jitter)
    /// and try again.
    fn round_failed(&mut self, ctx: &mut Context<Self>, why: &str) {
        self.failed_rounds = self.failed_rounds.saturating_add(1);
        let delay = backoff::round_delay(
            self.config.registration_backoff_initial,
            self.config.registration_backoff_max,
            self.failed_rounds,
            fastrand::f64(),
        );
        tracing::warn!(
            rounds = self.failed_rounds,
            retry_in = ?delay,
            "{why}; trying again later"
        );
        self.schedule_round(ctx, delay);
        self.probe_masters(ctx);
    }

    /// While the agent waits out its back-off, looks every [`PROBE_INTERVAL`] for a master
    /// that takes a TCP connection, if none does now: the network came back (a partition
    /// healed, a master restarted), and the next round starts at once instead of at the end
    /// of a back-off that may have grown to a minute. A master that was reachable already
    /// (the round failed for another reason) starts nothing early: the back-off stands.
    fn probe_masters(&mut self, ctx: &mut Context<Self>) {
        if let Some(probe) = self.probe.take() {
            probe.abort();
        }
        let addresses: Vec<(String, u16)> = self
            .masters
            .iter()
            .filter_map(|master| {
                let (host, port) = master.node().rsplit_once(':')?;
                Some((host.trim_matches(['[', ']']).to_owned(), port.parse().ok()?))
            })
            .collect();
        let me = ctx.pid().clone();
        let generation = self.generation;
        let probe = tokio::spawn(async move {
            let any_reachable = async || {
                for (host, port) in &addresses {
                    let connect = muster_security::net::connect(host, *port);
                    if let Ok(Ok(_)) = tokio::time::timeout(PROBE_TIMEOUT, connect).await {
                        return true;
                    }
                }
                false
            };
            if any_reachable().await {
                return;
            }
            while me.is_alive() {
                tokio::time::sleep(PROBE_INTERVAL).await;
                if any_reachable().await {
                    tracing::info!("a master is reachable again: registering now");
                    let _ = me.tell(AgentMsg(Msg::Round { generation }));
                    return;
                }
            }
        });
        self.probe = Some(probe.abort_handle());
    }

    pub(super) async fn on_reply(
        &mut self,
        ctx: &mut Context<Self>,
        master: Upid,
        result: Result<RegistrationReply, AskError>,
    ) {
        let reply = match result {
            Ok(reply) => reply,
            Err(error) => {
                tracing::info!(%master, %error, "master did not answer; trying the next");
                self.try_next(ctx);
                return;
            }
        };
        match reply.result {
            Some(registration_reply::Result::AgentId(id)) if !id.is_empty() => {
                // Only one request is out at a time, and the id changes only between them
                // (`register_anew`): with an id now, the request was a re-registration.
                if self.agent_id.is_some() {
                    self.counts.reregistrations += 1;
                }
                self.reads_tasks_sharing_labels =
                    reply.reads_tasks_sharing_labels.then(|| master.clone());
                if std::mem::take(&mut self.rebase_term) {
                    self.rebase_term_to(reply.term);
                } else {
                    self.observe_term(reply.term);
                }
                self.registered(ctx, master, id, &reply.kill_tasks, reply.term)
                    .await;
            }
            Some(registration_reply::Result::UnknownAgent(reason)) => {
                self.register_anew(ctx, master, &reason).await;
            }
            Some(registration_reply::Result::AgentId(_)) => {
                tracing::warn!(%master, "master admitted the agent under an empty id; trying the next");
                self.try_next(ctx);
            }
            Some(registration_reply::Result::NotLeader(hint)) => {
                self.follow(ctx, &master, &hint.leader)
            }
            Some(registration_reply::Result::Refused(reason)) => {
                tracing::warn!(%master, %reason, "master refused the registration");
                self.round_failed(ctx, &format!("{master} refused the agent: {reason}"));
            }
            None => {
                tracing::warn!(%master, "registration reply without a result; trying the next");
                self.try_next(ctx);
            }
        }
    }

    /// A standby answered `NotLeader`: go to the leader it names, or to the next master if it
    /// names none (or too many redirects happened this round).
    fn follow(&mut self, ctx: &mut Context<Self>, from: &Upid, leader: &str) {
        let Connection::Trying { queue, redirects } = &mut self.connection else {
            return;
        };
        if leader.is_empty() {
            tracing::info!(%from, "master is not the leader and knows no leader; trying the next");
        } else if *redirects >= MAX_REDIRECTS {
            tracing::warn!(%from, %leader, "too many redirects this round; trying the next master");
        } else {
            // A bare `host:port` is taken as that node's master process.
            let hint = leader
                .parse::<Upid>()
                .or_else(|_| Upid::new("master", leader));
            match hint {
                Ok(upid) if upid == *from => {
                    tracing::warn!(%from, "master says it is not the leader but names itself");
                }
                Ok(upid) => {
                    tracing::info!(%from, leader = %upid, "master is not the leader; following its hint");
                    *redirects += 1;
                    queue.retain(|m| *m != upid);
                    queue.push_front(upid);
                }
                Err(error) => {
                    tracing::warn!(%from, %leader, %error, "ignoring an unusable leader hint");
                }
            }
        }
        self.try_next(ctx);
    }

    /// The master does not know the agent's id (never admitted, or forgotten): whatever the
    /// agent ran under it was replaced long ago, so it is killed; the id goes, and the agent
    /// registers anew, with that master first.
    async fn register_anew(&mut self, ctx: &mut Context<Self>, master: Upid, reason: &str) {
        let running = self.tasks.running_ids();
        tracing::warn!(
            %master,
            %reason,
            old_id = self.agent_id.as_deref().unwrap_or_default(),
            killing = running.len(),
            "the master does not know this agent's id: killing its old tasks and registering anew"
        );
        for task_id in &running {
            // The agent's own decision: the answer's term proves nothing.
            let stop = Stop {
                grace: Duration::ZERO,
                signal: libc::SIGKILL,
                term: None,
            };
            self.tasks.kill(task_id, stop);
        }
        self.unsent_updates.clear();
        self.agent_id = None;
        // A cluster that does not know the agent (rebuilt, or one that forgot it) counts its
        // terms anew: the agent takes the term of the leader that admits it (a quorum write),
        // not that of this answer, which a deposed master could give.
        self.rebase_term = true;
        let data_dir = self.config.data_dir.clone();
        if let Err(error) = blocking(move || store::remove_agent_id(&data_dir)).await {
            tracing::error!(%error, "cannot remove the stored agent id");
        }
        let Connection::Trying { queue, .. } = &mut self.connection else {
            return;
        };
        queue.retain(|m| *m != master);
        queue.push_front(master);
        self.try_next(ctx);
    }

    /// A master admitted the agent, as leader of `term`: kill what the cluster gave up on
    /// while the agent was away (`kill_tasks`) before anything else, remember the master,
    /// store a new id, link to it and watch for its pings.
    async fn registered(
        &mut self,
        ctx: &mut Context<Self>,
        master: Upid,
        id: String,
        kill_tasks: &[String],
        term: u64,
    ) {
        for task_id in kill_tasks {
            tracing::warn!(%master, task = %task_id, "the cluster replaced this task while the agent was away: killing it");
            let stop = Stop {
                grace: Duration::ZERO,
                signal: libc::SIGKILL,
                term: Some(term),
            };
            self.tasks.kill(task_id, stop);
        }
        // One link per master: a link's notice comes once, and re-registering with a master
        // whose link still stands must not pile up watchers on it.
        if self.linked.insert(master.clone()) {
            ctx.link_remote(&self.node.remote(master.clone()));
        }
        self.connection = Connection::Registered {
            master: master.clone(),
        };
        self.failed_rounds = 0;
        self.lost = None;
        self.last_ping = Instant::now();
        self.heartbeats = Heartbeats::Unknown;
        self.heartbeat_ttl = None;
        self.arm_silence_timer(ctx, self.config.master_silence_timeout);

        if self.agent_id.as_deref() != Some(id.as_str()) {
            if let Some(old) = &self.agent_id {
                tracing::warn!(%master, old, new = %id, "master gave the agent a new id");
            }
            self.agent_id = Some(id.clone());
            let data_dir = self.config.data_dir.clone();
            let stored = id.clone();
            if let Err(error) = blocking(move || store::write_agent_id(&data_dir, &stored)).await {
                tracing::error!(%error, "cannot store the agent id; a restarted agent will register anew");
            }
        }
        tracing::info!(%master, agent_id = %id, "registered");
        self.status.send_replace(AgentStatus::Registered {
            agent_id: id,
            master,
        });
        self.send_updates();
        self.send_heartbeat(ctx);
    }

    // ---- heartbeats -------------------------------------------------------------------------

    /// Sends a heartbeat to the master the agent is registered with; the answer comes back as
    /// a continuation. It waits up to the TTL the master last gave (past it the master counts
    /// the agent late, and may have marked it unreachable and replaced its tasks: better to
    /// ask again, or re-register and hear so, than to wait for a heartbeat lost in a cut
    /// link), and never longer than the master-silence timeout.
    pub(super) fn send_heartbeat(&mut self, ctx: &mut Context<Self>) {
        let (Connection::Registered { master }, Some(agent_id)) =
            (&self.connection, &self.agent_id)
        else {
            return;
        };
        let remote = self.node.remote(master.clone());
        let silence = self.config.master_silence_timeout;
        let timeout = self.heartbeat_ttl.map_or(silence, |ttl| ttl.min(silence));
        let heartbeat = Heartbeat {
            agent_id: agent_id.clone(),
        };
        let generation = self.generation;
        self.counts.heartbeats_sent += 1;
        ctx.defer(
            async move {
                remote
                    .ask_timeout::<Heartbeat, HeartbeatReply>(timeout, heartbeat)
                    .await
            },
            move |agent: &mut Agent, ctx, answered| {
                if generation == agent.generation {
                    agent.on_heartbeat_answer(ctx, answered);
                }
            },
        );
    }

    /// The master answered a heartbeat (or did not): heartbeat again at half the TTL it gave,
    /// re-register if it refused, look for the leader if it is no longer it or cannot be
    /// reached.
    fn on_heartbeat_answer(
        &mut self,
        ctx: &mut Context<Self>,
        mut answered: Result<HeartbeatReply, AskError>,
    ) {
        let Connection::Registered { master } = &self.connection else {
            return;
        };
        let master = master.clone();
        if let Ok(reply) = &answered {
            self.observe_term(reply.term);
        }
        let named_masters = answered
            .as_mut()
            .ok()
            .map(|reply| std::mem::take(&mut reply.masters));
        match answered.map(|reply| reply.result) {
            Ok(Some(heartbeat_reply::Result::TtlMs(ttl_ms))) => {
                if self.heartbeats != Heartbeats::Active {
                    tracing::debug!(%master, ttl_ms, "the master takes heartbeats");
                    self.heartbeats = Heartbeats::Active;
                    // From now on a heartbeat that stays unanswered says the master is gone;
                    // a long TTL must not look like silence.
                    if let Some(timer) = self.silence_timer.take() {
                        timer.cancel();
                    }
                }
                self.last_ping = Instant::now();
                if let Some(named) = &named_masters {
                    self.learn_masters(named);
                }
                let ttl = Duration::from_millis(ttl_ms);
                self.heartbeat_ttl = Some(ttl.max(MIN_HEARTBEAT_INTERVAL));
                let next = (ttl / 2).max(MIN_HEARTBEAT_INTERVAL);
                tracing::debug!(%master, ttl_ms, ?next, "heartbeat answered");
                let generation = self.generation;
                ctx.delay(next, AgentMsg(Msg::SendHeartbeat { generation }));
            }
            Ok(Some(heartbeat_reply::Result::Refused(reason))) => {
                tracing::warn!(%master, %reason, "master refused the heartbeat; re-registering");
                self.reregister_with(ctx, master);
            }
            Ok(Some(heartbeat_reply::Result::NotLeader(hint))) => {
                tracing::warn!(%master, leader = %hint.leader, "master no longer leads; re-registering");
                self.lose_master(ctx);
            }
            Ok(None) => {
                tracing::warn!(%master, "heartbeat reply without a result; re-registering");
                self.lose_master(ctx);
            }
            Err(AskError::Remote(RemoteError::UnknownType(_))) => {
                tracing::info!(%master, "master does not take heartbeats; going by its pings");
                self.heartbeats = Heartbeats::Unsupported;
            }
            Err(AskError::Timeout(waited)) if self.last_ping.elapsed() < waited => {
                // It still pings, so it is there: try again.
                tracing::debug!(%master, "heartbeat unanswered but the master pings; again");
                self.send_heartbeat(ctx);
            }
            Err(error) => {
                tracing::warn!(%master, %error, "heartbeat failed; counting the master as lost");
                self.lose_master(ctx);
            }
        }
    }

    /// The leader named the raft group's masters in a heartbeat reply: if they differ from
    /// those it named last, they join the masters a round tries (after the configured ones)
    /// and are kept in the data directory for the next start. An address that does not parse
    /// is skipped; an empty list (a master from before the field) changes nothing.
    fn learn_masters(&mut self, named: &[String]) {
        if named.is_empty() {
            return;
        }
        let learned: Vec<Upid> = named
            .iter()
            .filter_map(|address| match address.parse::<Upid>() {
                Ok(upid) => Some(upid),
                Err(error) => {
                    tracing::warn!(%address, %error, "the leader named a master that is no address");
                    None
                }
            })
            .collect();
        if learned == self.learned_masters {
            return;
        }
        tracing::info!(masters = ?learned.iter().map(ToString::to_string).collect::<Vec<_>>(), "the leader named the masters of the group");
        if let Err(error) = store::write_learned_masters(&self.config.data_dir, &learned) {
            tracing::warn!(%error, "cannot keep the masters the leader named; a restart tries the configured ones");
        }
        self.masters = with_learned(&self.configured_masters, &learned);
        self.learned_masters = learned;
    }

    /// A new leader announced itself: unless the agent follows a newer term, or is registered
    /// with that master already, it re-registers there (see `reregister_with`), instead of
    /// waiting for its heartbeats to a paused or cut-off master to fail.
    pub(super) fn on_announcement(
        &mut self,
        announcement: &muster_proto::cluster::LeaderAnnouncement,
        ctx: &mut Context<Self>,
    ) {
        if announcement.term < self.term {
            tracing::debug!(
                term = announcement.term,
                following = self.term,
                "ignoring an announcement of an older leader"
            );
            return;
        }
        let leader = match announcement.leader.parse::<Upid>() {
            Ok(leader) => leader,
            Err(error) => {
                tracing::warn!(leader = %announcement.leader, %error, "ignoring an announcement with an unusable leader");
                return;
            }
        };
        // Its term is followed once it answers the re-registration, not on its word.
        self.reads_tasks_sharing_labels = announcement
            .reads_tasks_sharing_labels
            .then(|| leader.clone());
        if matches!(&self.connection, Connection::Registered { master } if *master == leader) {
            return;
        }
        tracing::info!(%leader, term = announcement.term, "a new leader announced itself; re-registering with it");
        self.reregister_with(ctx, leader);
    }

    /// The master leads but wants the agent to re-register: do so, with it first, after a
    /// short random delay (a master that lost many agents at once must not get them all
    /// back at once).
    fn reregister_with(&mut self, ctx: &mut Context<Self>, master: Upid) {
        self.generation += 1;
        if let Some(timer) = self.silence_timer.take() {
            timer.cancel();
        }
        self.failed_rounds = 0;
        self.lost = None;
        self.preferred = Some(master);
        self.status.send_replace(AgentStatus::Registering);
        let delay =
            backoff::initial_delay(self.config.registration_backoff_initial, fastrand::f64());
        self.schedule_round(ctx, delay);
    }

    // ---- master silence ---------------------------------------------------------------------

    fn arm_silence_timer(&mut self, ctx: &mut Context<Self>, after: Duration) {
        if let Some(timer) = self.silence_timer.take() {
            timer.cancel();
        }
        let generation = self.generation;
        self.silence_timer = Some(ctx.delay(after, AgentMsg(Msg::CheckSilence { generation })));
    }

    pub(super) fn check_silence(&mut self, ctx: &mut Context<Self>) {
        let Connection::Registered { master } = &self.connection else {
            return;
        };
        if self.heartbeats == Heartbeats::Active {
            // Unanswered heartbeats are what count now.
            return;
        }
        let silent = self.last_ping.elapsed();
        let limit = self.config.master_silence_timeout;
        if silent >= limit {
            tracing::warn!(%master, ?silent, "no ping from the master; re-registering");
            self.lose_master(ctx);
        } else {
            self.arm_silence_timer(ctx, limit - silent);
        }
    }

    /// The master is gone (link lost, or silent): look for a master again, after a random
    /// delay so that the agents that lost it together do not all come back at once.
    pub(super) fn lose_master(&mut self, ctx: &mut Context<Self>) {
        if let Connection::Registered { master } = &self.connection {
            self.lost = Some(master.clone());
        }
        self.generation += 1;
        if let Some(timer) = self.silence_timer.take() {
            timer.cancel();
        }
        self.failed_rounds = 0;
        self.status.send_replace(AgentStatus::Registering);
        let delay =
            backoff::initial_delay(self.config.registration_backoff_initial, fastrand::f64());
        self.schedule_round(ctx, delay);
    }
}

/// How often an agent with no master reachable looks for one (see `probe_masters`).
const PROBE_INTERVAL: std::time::Duration = std::time::Duration::from_millis(250);

/// How long one look waits for a master's TCP connection.
const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(500);

/// The masters a round tries: `configured` in order, then those of `learned` not among them.
pub(super) fn with_learned(configured: &[Upid], learned: &[Upid]) -> Vec<Upid> {
    let mut masters = configured.to_vec();
    for master in learned {
        if !masters.contains(master) {
            masters.push(master.clone());
        }
    }
    masters
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_tries_the_configured_masters_then_the_named_ones_not_among_them() {
        let upid = |s: &str| s.parse::<Upid>().expect("an address");
        let configured = [upid("master@a:1"), upid("master@b:1")];
        let named = [upid("master@b:1"), upid("master@c:1")];
        assert_eq!(
            with_learned(&configured, &named),
            vec![upid("master@a:1"), upid("master@b:1"), upid("master@c:1")]
        );
        assert_eq!(with_learned(&configured, &[]), configured.to_vec());
    }
}
