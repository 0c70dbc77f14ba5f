//! Mesos-style pings (with `--pings`): besides heartbeats, the leader asks each connected
//! agent for a pong, and marks one that misses too many in a row unreachable.

use muster_actor::Context;
use muster_proto::cluster as pb;

use super::PingAgents;
use crate::master::Master;

impl Master {
    /// [`PingAgents`]: asks each connected agent for a pong, at most one ping in flight per
    /// agent; one that misses `max_missed_pings` in a row is marked unreachable.
    pub(in crate::master) fn ping_agents(&mut self, _timer: PingAgents, ctx: &mut Context<Self>) {
        let (Some(node), Some(_)) = (&self.node, self.leading_term()) else {
            return;
        };
        let me = format!("master@{}", self.address);
        let timeout = self.config.ping_timeout;
        for (id, agent) in &mut self.cluster.agents {
            if !agent.connected || agent.ping_in_flight {
                continue;
            }
            let Some(remote) = agent.remote(node).cloned() else {
                agent.missed_pings += 1;
                continue;
            };
            agent.ping_in_flight = true;
            let ping = pb::Ping { master: me.clone() };
            let id = id.clone();
            ctx.defer(
                async move {
                    remote
                        .ask_timeout::<pb::Ping, pb::Pong>(timeout, ping)
                        .await
                },
                move |master: &mut Master, ctx, answered| master.on_pong(id, answered.is_ok(), ctx),
            );
        }
    }

    /// An agent answered a ping, or did not.
    fn on_pong(&mut self, id: String, answered: bool, ctx: &mut Context<Self>) {
        let max = self.config.max_missed_pings;
        let Some(agent) = self.cluster.agents.get_mut(&id) else {
            return;
        };
        agent.ping_in_flight = false;
        if answered {
            agent.missed_pings = 0;
            return;
        }
        agent.missed_pings += 1;
        tracing::debug!(agent = %id, missed = agent.missed_pings, "agent missed a ping");
        if agent.missed_pings >= max && agent.connected {
            agent.connected = false;
            tracing::warn!(agent = %id, missed = max, "agent missed too many pings");
            self.mark_unreachable(vec![id], false, ctx);
        }
    }
}
