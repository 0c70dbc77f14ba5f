//! Fencing by term: every command a master sends (run, launch, kill) carries the raft term of
//! the leader that sent it, and so do the answers to registrations and heartbeats. The agent
//! remembers, durably, the highest term a leader answered it with (never a term a command or
//! an announcement merely claims), and refuses a command of a lower one: a deposed leader that resumes after a pause cannot launch or kill anything on an
//! agent that has heard from its successor. Each refusal is logged and counted.
//!
//! Fencing by registration: a launch is a one-way message that may wait in a link's queue, so
//! it also names the agent's registration it was meant for, and a deadline. The agent raises
//! its registration number, durably, before every registration round (at start, after a
//! restart, after losing its master) and refuses a launch for another one, or past its
//! deadline, reporting each of its tasks LOST: what a master counted lost when the agent came
//! back without it (or when its deadline passed) never starts after all.

use muster_proto::cluster::RunTask;
use muster_proto::model::TaskState;

use super::Agent;
use crate::store;

/// Why a command of a master was refused: it comes from an older leader term, or is a launch
/// meant for another registration of the agent or past its deadline. Said to the master (the
/// answer's error, or the refused tasks' message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum Fenced {
    /// The command (`what`) comes from a leader of `term`, older than the one the agent
    /// follows.
    #[error(
        "refused {what}: it comes from a leader of term {term}, but this agent follows \
         term {following} (the sender is no longer the leader)"
    )]
    StaleTerm {
        /// What was refused: `a RunTask`, `a KillTask`, ...
        what: &'static str,
        /// The command's term.
        term: u64,
        /// The term the agent follows.
        following: u64,
    },
    /// A launch meant for an earlier registration of the agent.
    #[error(
        "refused a launch meant for registration {meant} of this agent, which has registered \
         again since (registration {current}): it was counted lost"
    )]
    OtherRegistration {
        /// The registration it was meant for.
        meant: u64,
        /// The agent's registration now.
        current: u64,
    },
    /// A launch that waited in a queue past its deadline.
    #[error(
        "refused a launch that expired {ago_ms} ms ago (it waited in a queue): it was counted \
         lost"
    )]
    Expired {
        /// How long ago its deadline passed, in milliseconds.
        ago_ms: u64,
    },
}

impl Agent {
    /// Whether a command (`what`) of leader term `term` may be obeyed: not if the agent follows
    /// a higher term. A higher term than the agent's is not taken up: the agent follows a term
    /// only once a leader of it answers its registration or heartbeat (a leader commands an
    /// agent only after that exchange), so no single command, however high its term, can
    /// fence the agent off from the real leader.
    pub(super) fn admit_term(&mut self, term: u64, what: &'static str) -> Result<(), Fenced> {
        if term < self.term {
            self.stale_commands_refused += 1;
            let why = Fenced::StaleTerm {
                what,
                term,
                following: self.term,
            };
            tracing::warn!(term, following = self.term, "{why}");
            return Err(why);
        }
        Ok(())
    }

    /// A leader of `term` answered the agent (a registration, a heartbeat): from now on it
    /// obeys no lower term. Written
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

    /// Starts a new registration of the agent: its number is raised and written durably
    /// before any master hears it. If the write fails the agent says so and goes on with the
    /// raised number; after a restart it could then take the number again.
    pub(super) fn next_registration(&mut self) {
        self.registration = self.registration.saturating_add(1);
        if let Err(error) = store::write_registration(&self.config.data_dir, self.registration) {
            tracing::error!(%error, registration = self.registration, "cannot record the agent's registration; after a restart, a launch meant for this one could be taken");
        }
    }

    /// Whether a launch for `registration` (0: not fenced so) that expires at
    /// `deadline_unix_ms` (0: never) may run now.
    pub(super) fn admit_launch(
        &mut self,
        registration: u64,
        deadline_unix_ms: u64,
    ) -> Result<(), Fenced> {
        if registration != 0 && registration != self.registration {
            self.stale_commands_refused += 1;
            return Err(Fenced::OtherRegistration {
                meant: registration,
                current: self.registration,
            });
        }
        let now_ms = muster_model::clock::unix_ms();
        if deadline_unix_ms != 0 && now_ms > deadline_unix_ms {
            self.stale_commands_refused += 1;
            return Err(Fenced::Expired {
                ago_ms: now_ms - deadline_unix_ms,
            });
        }
        Ok(())
    }

    /// Reports a task of a refused launch LOST with the reason, without starting it.
    pub(super) fn refuse_launch(&mut self, request: RunTask, why: &Fenced) {
        let Some(mut task) = request.task else {
            return;
        };
        tracing::warn!(task = %task.id, "{why}");
        if self.tasks.knows(&task.id) {
            // Already here (an earlier copy of the same launch): not this copy's to report.
            return;
        }
        task.state = TaskState::Lost as i32;
        task.exit_code = -1;
        task.message = why.to_string();
        self.report(task);
    }
}
