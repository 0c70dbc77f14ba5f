//! Tasks: one run of a task group's program on an agent, and where it is in its life.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::resources::Resources;

/// One task on an agent, as the master and the agent running it know it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Task {
    /// Its unique id (`web.frontend[0]-1a2b3c4d`).
    pub id: String,
    /// The slot it fills (`web.frontend[0]`; system jobs: `web.frontend[agent-1]`).
    pub name: String,
    /// The job it belongs to; empty for a task an operator launched by hand.
    pub job: String,
    /// Its task group within the job.
    pub group: String,
    /// The job version it was placed at; 0 if unknown (such a task is never outdated).
    pub job_version: u64,
    /// The framework that owns it (the job's name for tasks the schedulers place).
    pub framework_id: String,
    /// What it holds while not terminal.
    pub resources: Resources,
    /// Labels, in order (`key`, `value`).
    pub labels: Vec<(String, String)>,
    /// Where it is.
    pub state: TaskState,
    /// Its exit code, once it ended.
    pub exit_code: i32,
    /// The program it runs.
    pub command: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Its environment.
    pub env: BTreeMap<String, String>,
    /// Why it is in its state, when there is more to say (why its agent could not start it).
    pub message: String,
    /// The user it runs as; empty for its agent's task user.
    pub user: String,
    /// The ports it was given, in its group's order.
    #[serde(default)]
    pub ports: Vec<crate::AssignedPort>,
    /// What its checks say of it.
    #[serde(default)]
    pub health: crate::TaskHealth,
    /// How many times its agent restarted it in place.
    #[serde(default)]
    pub restarts: u32,
}

/// Where a task is in its life (Mesos's task states).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub enum TaskState {
    /// Placed and sent to its agent; not started yet.
    #[default]
    Staging,
    /// Its agent is starting it.
    Starting,
    /// Running.
    Running,
    /// Exited successfully.
    Finished,
    /// Exited with an error, or could not be started.
    Failed,
    /// Stopped on request.
    Killed,
    /// Its agent was lost, or no longer knows it.
    Lost,
    /// Its agent is unreachable: it may still run there. It stays so until the agent comes
    /// back (and it is kept or stopped, by its group's `disconnect` policy) or it is given up
    /// as lost for good (`disconnect.lost_after`). Not ended: its slot may still be its own.
    Unknown,
}

impl TaskState {
    /// Whether the task has ended: it holds no resources and will not run again.
    pub fn is_terminal(self) -> bool {
        !matches!(
            self,
            TaskState::Staging | TaskState::Starting | TaskState::Running | TaskState::Unknown
        )
    }

    /// Whether the task was placed but has not reported running yet.
    pub fn is_pending(self) -> bool {
        matches!(self, TaskState::Staging | TaskState::Starting)
    }

    /// The upper-case name operators see (`RUNNING`).
    pub fn name(self) -> &'static str {
        match self {
            TaskState::Staging => "STAGING",
            TaskState::Starting => "STARTING",
            TaskState::Running => "RUNNING",
            TaskState::Finished => "FINISHED",
            TaskState::Failed => "FAILED",
            TaskState::Killed => "KILLED",
            TaskState::Lost => "LOST",
            TaskState::Unknown => "UNKNOWN",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_states() {
        use TaskState::*;
        for (state, terminal) in [
            (Staging, false),
            (Starting, false),
            (Running, false),
            (Finished, true),
            (Failed, true),
            (Killed, true),
            (Lost, true),
        ] {
            assert_eq!(state.is_terminal(), terminal, "{state:?}");
        }
    }
}
