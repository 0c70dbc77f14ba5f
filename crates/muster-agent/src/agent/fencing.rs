//! Fencing by term: every command a master sends (run, launch, kill) carries the raft term of
//! the leader that sent it, and so do the answers to registrations and heartbeats. The agent
//! remembers, durably, the highest term it has seen from a leader, and refuses a command of a
//! lower one: a deposed leader that resumes after a pause cannot launch or kill anything on an
//! agent that has heard from its successor. Each refusal is logged and counted.

use super::Agent;
use crate::store;

impl Agent {
    /// Whether a command (`what`) of leader term `term` may be obeyed: not if the agent follows
    /// a higher term. A higher term than the agent's is recorded first.
    pub(super) fn admit_term(&mut self, term: u64, what: &str) -> Result<(), String> {
        if term < self.term {
            self.stale_commands_refused += 1;
            let why = format!(
                "refused {what}: it comes from a leader of term {term}, but this agent follows \
                 term {} (the sender is no longer the leader)",
                self.term
            );
            tracing::warn!(term, following = self.term, "{why}");
            return Err(why);
        }
        self.observe_term(term);
        Ok(())
    }

    /// A leader of `term` spoke to the agent: from now on it obeys no lower term. Written
    /// durably before it counts, so a restarted agent keeps the promise; if the write fails
    /// the agent still keeps it while it runs, and says so.
    pub(super) fn observe_term(&mut self, term: u64) {
        if term <= self.term {
            return;
        }
        if let Err(error) = store::write_term(&self.config.data_dir, term) {
            tracing::error!(%error, term, "cannot record the leader's term; a restart may forget it");
        }
        tracing::info!(term, previous = self.term, "following a new leader term");
        self.term = term;
    }

    /// Follows `term` from now on, even if lower than before: the agent was admitted anew by
    /// a cluster that did not know it (see `master_link::register_anew`), whose terms are its
    /// own.
    pub(super) fn rebase_term_to(&mut self, term: u64) {
        if let Err(error) = store::write_term(&self.config.data_dir, term) {
            tracing::error!(%error, term, "cannot record the leader's term; a restart may forget it");
        }
        tracing::info!(
            term,
            previous = self.term,
            "admitted anew: following this cluster's leader term"
        );
        self.term = term;
    }
}
