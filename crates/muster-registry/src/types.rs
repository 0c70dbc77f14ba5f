//! What the registry stores and the operations that change it.

use std::fmt;
use std::io::Cursor; // `declare_raft_types!` names `Cursor` unqualified.

use serde::{Deserialize, Serialize};

use muster_model::{
    AgentId, AgentInfo, AgentScheduling, EvalId, EvalStatus, Evaluation, Job, Namespace,
};
use muster_security::{AclToken, Policy};

openraft::declare_raft_types!(
    /// openraft's type configuration for the registry: a raft entry carries a [`Batch`] of
    /// operations and yields one [`BatchOutcome`].
    pub TypeConfig:
        D = Batch,
        R = BatchOutcome,
        NodeId = NodeId,
        Node = openraft::BasicNode,
);

/// A master's id within its registry group.
pub type NodeId = u64;

/// The raft handle of a registry node.
pub type Raft = openraft::Raft<TypeConfig>;

/// The largest raft message a master sends or accepts: a batch of registry entries or one
/// snapshot chunk. The log reader keeps a batch of entries under
/// [`REPLICATION_BATCH_BYTES`](crate::store::REPLICATION_BATCH_BYTES) (one entry alone may be
/// larger), so this only bounds what a peer may send.
pub const MAX_RAFT_MESSAGE: usize = 64 * 1024 * 1024;

/// One change to the registry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Op {
    /// Admit a new agent; the registry assigns its id.
    AdmitAgent(AgentInfo),
    /// Store an admitted agent's changed info, or take back an unreachable or forgotten agent
    /// under its old id.
    UpdateAgent {
        /// The agent.
        id: AgentId,
        /// Its info now.
        info: AgentInfo,
    },
    /// Move an admitted agent to the unreachable set.
    MarkUnreachable {
        /// The agent.
        id: AgentId,
        /// When, in milliseconds since the Unix epoch.
        at_ms: u64,
        /// What it ran then (see [`UnreachableAgent::tasks`](muster_model::UnreachableAgent)).
        #[serde(default)]
        tasks: Vec<muster_model::Task>,
    },
    /// Forget an agent, admitted or unreachable.
    RemoveAgent(AgentId),
    /// Set how schedulers may use an agent, admitted or unreachable (an operator's drain or
    /// eligibility). The default scheduling is not stored.
    SetScheduling {
        /// The agent.
        id: AgentId,
        /// Its scheduling now.
        scheduling: AgentScheduling,
    },
    /// Store a job, new or changed; the registry bumps its version.
    UpsertJob(Job),
    /// Record batch slots whose task ran to completion (exit 0): each slot's name, and the
    /// job version its task was placed at. Whichever master leads knows them, so a finished
    /// slot is never run again (its agent may be away, or not yet back after a failover).
    /// A job not registered is skipped.
    BatchSlotsFinished {
        /// The job.
        job: String,
        /// The slots (`etl.load[3]`) and the job versions their tasks were placed at.
        slots: Vec<(String, u64)>,
    },
    /// Stop a stored job: set its `stopped`, bump its version. Applied to the job as it is
    /// when the entry applies, so a submission committed in between is kept, not overwritten
    /// by an older copy.
    StopJob(String),
    /// Store evaluations, new or changed. Each takes the entry's index as its modify index,
    /// and as its create index if it is new.
    UpsertEvals(Vec<Evaluation>),
    /// Set the status of many evaluations at once (the broker's batched cancellations).
    /// Unknown ids are skipped.
    SetEvalStatus {
        /// The evaluations.
        ids: Vec<EvalId>,
        /// Their new status.
        status: EvalStatus,
        /// Why, for operators.
        description: String,
    },
    /// Several operations applied in order in the same raft entry (a job and its
    /// evaluation; an agent marked unreachable and the evaluations that follow).
    Together(Vec<Op>),
    /// Store the first management token; refused once the ACL system is bootstrapped.
    BootstrapAcl(AclToken),
    /// Store a new token.
    CreateToken(AclToken),
    /// Delete the token with this accessor; refused for the last management token.
    DeleteToken {
        /// Its public id.
        accessor: String,
    },
    /// Replace the whole registry with a saved copy (`muster operator snapshot restore`).
    /// Agent numbers never go back: an id handed out after the copy was saved is not handed
    /// out again.
    Restore(Box<crate::RegistryState>),
    /// Store a new management token although the ACL system is bootstrapped: the reset of a
    /// lost one (Nomad's bootstrap reset). Applied only if `reset_index` is the index of the
    /// last bootstrap, which the operator read from the refusal of a plain bootstrap and wrote
    /// on the leader's disk.
    BootstrapAclAgain {
        /// The new management token.
        token: AclToken,
        /// The index of the bootstrap it replaces.
        reset_index: u64,
    },
    /// Store a policy, new or changed.
    ApplyPolicy(StoredPolicy),
    /// Delete a stored policy; the tokens that carry it lose what it granted.
    DeletePolicy(String),
    /// Store a namespace, new or changed.
    ApplyNamespace(Namespace),
    /// Delete a namespace with its stopped jobs; refused for `default`, and while a job in it
    /// is not stopped.
    DeleteNamespace(String),
    /// Start the deployment of a job's stored version (written with the job itself, after
    /// it), begun at `at_ms` (the leader's clock, so every member stores the same); the
    /// running one it supersedes is cancelled. A job without update policies starts none.
    StartDeployment {
        /// The job.
        job: String,
        /// When, in milliseconds since the Unix epoch.
        at_ms: u64,
        /// It goes back to a version that deployed well (an automatic revert): no canaries.
        #[serde(default)]
        revert: bool,
    },
    /// Fail a running or paused deployment, saying why, and with `revert` store that job (an
    /// earlier version that deployed well) as the job's next version with its own deployment,
    /// which rolls back without canaries and is not rolled back in turn: all or nothing,
    /// refused (with nothing stored) once the deployment ended.
    FailDeployment {
        /// The deployment.
        id: String,
        /// Why it failed.
        description: String,
        /// The version to go back to, as the registry keeps it.
        revert: Option<Job>,
        /// When the rollback's deployment begins, in milliseconds since the Unix epoch.
        at_ms: u64,
    },
    /// Change a running or paused deployment; refused once it ended.
    ChangeDeployment {
        /// The deployment (`{job}.v{version}`).
        id: String,
        /// What changes.
        change: DeploymentChange,
    },
}

/// A change to a deployment ([`Op::ChangeDeployment`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum DeploymentChange {
    /// New tasks counted healthy or unhealthy (each with its group), and the new progress
    /// deadline, if it moved.
    Progress {
        /// `(group, task id)` of each task now counted healthy.
        healthy: Vec<(String, String)>,
        /// `(group, task id)` of each task now counted unhealthy.
        unhealthy: Vec<(String, String)>,
        /// When it fails without further progress, in milliseconds since the Unix epoch.
        progress_by_ms: Option<u64>,
    },
    /// Promote the canaries of these groups (none named: every group); refused if none
    /// awaited promotion.
    Promote {
        /// The groups.
        groups: Vec<String>,
    },
    /// Say anew where it is, its status unchanged (`canaries await promotion`).
    Describe {
        /// Why it is where it is, for people.
        description: String,
    },
    /// Set its status (paused, resumed as running, successful, failed), saying why; running
    /// again only from paused.
    Status {
        /// The new status.
        status: muster_model::DeploymentStatus,
        /// Why, for people.
        description: String,
        /// The version a failed deployment went back to.
        reverted_to: Option<u64>,
    },
}

/// A policy an operator stored: its rules as written, and as read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredPolicy {
    /// Its name.
    pub name: String,
    /// Its rules, as the operator wrote them (TOML).
    pub rules: String,
    /// Its rules, read.
    pub policy: Policy,
}

/// What one [`Op`] did.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Outcome {
    /// The agent was admitted under this id.
    Admitted(AgentId),
    /// The agent's info (or scheduling) is stored (and it is no longer unreachable).
    Updated,
    /// The agent is now unreachable.
    MarkedUnreachable,
    /// The agent is forgotten.
    Removed,
    /// The job is stored at this version.
    JobStored {
        /// Its version now.
        version: u64,
    },
    /// This many evaluations were stored or changed.
    EvalsStored(usize),
    /// This many finished batch slots were recorded.
    SlotsRecorded(usize),
    /// The results of a [`Op::Together`], in order.
    Together(Vec<Result<Outcome, OpError>>),
    /// The token is stored.
    TokenStored,
    /// The token is deleted.
    TokenDeleted,
    /// The registry now holds the restored copy.
    Restored,
    /// The policy or namespace is stored.
    Stored,
    /// The policy or namespace is deleted.
    Deleted,
}

/// Why an [`Op`] changed nothing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum OpError {
    /// The operation names an agent the registry does not know (in that state).
    #[error("agent {0} is not in the registry")]
    UnknownAgent(AgentId),
    /// The applied entry carried fewer results than operations (a registry bug).
    #[error("the registry returned no result for this operation")]
    MissingResult,
    /// The ACL system has its first management token already; it was bootstrapped at
    /// `reset_index`, which a reset must name ([`Op::BootstrapAclAgain`]).
    #[error("ACL already bootstrapped (reset index: {reset_index})")]
    AclAlreadyBootstrapped {
        /// The registry index of the last bootstrap.
        reset_index: u64,
    },
    /// No token has this accessor.
    #[error("no token with accessor {0:?}")]
    UnknownToken(String),
    /// The token is the last management token: deleting it would leave nobody able to manage
    /// the ACL system.
    #[error("token {0:?} is the last management token; create another before deleting it")]
    LastManagementToken(String),
    /// No job has this name.
    #[error("no job named {0:?}")]
    UnknownJob(String),
    /// No deployment has this id.
    #[error("no deployment {0:?}")]
    UnknownDeployment(String),
    /// The deployment ended: it changes no more.
    #[error("deployment {id:?} is {status}: it changes no more")]
    DeploymentEnded {
        /// The deployment.
        id: String,
        /// Its final status.
        status: String,
    },
    /// The deployment has no canaries waiting for promotion.
    #[error("deployment {0:?} has no canaries awaiting promotion")]
    NothingToPromote(String),
    /// The deployment has no group of that name.
    #[error("deployment {id:?} has no group {group:?}")]
    UnknownDeploymentGroup {
        /// The deployment.
        id: String,
        /// The group named.
        group: String,
    },
    /// Only a paused deployment can be resumed.
    #[error("deployment {0:?} is not paused")]
    DeploymentNotPaused(String),
    /// No policy has this name.
    #[error("no policy named {0:?}")]
    UnknownPolicy(String),
    /// No namespace has this name.
    #[error("no namespace named {0:?}; create it with `muster namespace apply {0}`")]
    UnknownNamespace(String),
    /// The `default` namespace cannot be deleted.
    #[error("the default namespace cannot be deleted")]
    DefaultNamespace,
    /// The namespace still holds jobs that are not stopped.
    #[error("namespace {name:?} still holds {jobs} jobs that are not stopped; stop them first")]
    NamespaceNotEmpty {
        /// The namespace.
        name: String,
        /// How many jobs in it are not stopped.
        jobs: usize,
    },
}

/// The operations of one raft entry. Operations queued while a write is in flight travel
/// together in the next entry.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Batch {
    /// Applied in order.
    pub ops: Vec<Op>,
}

impl fmt::Display for Batch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "batch of {} ops", self.ops.len())
    }
}

/// One result per operation of a [`Batch`], in order.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BatchOutcome {
    /// The results.
    pub results: Vec<Result<Outcome, OpError>>,
}

/// The group's membership as `raft`'s member holds it now (a copy: the metrics are not held).
pub(crate) fn membership_of(raft: &Raft) -> openraft::Membership<NodeId, openraft::BasicNode> {
    raft.metrics()
        .borrow()
        .membership_config
        .membership()
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;
    use muster_model::Resources;

    #[test]
    fn a_batch_survives_its_round_trip_through_the_registry_encoding() {
        let batch = Batch {
            ops: vec![
                Op::AdmitAgent(AgentInfo {
                    dynamic_ports: Default::default(),
                    hostname: "h1".into(),
                    address: "agent@127.0.0.1:1".into(),
                    resources: Resources {
                        cpus: 0.5,
                        mem_mb: 128,
                    },
                    attributes: [("rack".to_owned(), "r1".to_owned())].into(),
                    identity: "node-1".into(),
                }),
                Op::MarkUnreachable {
                    id: AgentId("agent-1".into()),
                    at_ms: 7,
                    tasks: vec![muster_model::Task {
                        id: "web.server[0]-1".into(),
                        name: "web.server[0]".into(),
                        state: muster_model::TaskState::Running,
                        ..muster_model::Task::default()
                    }],
                },
            ],
        };
        let bytes = crate::codec::encode(&batch).expect("encode");
        let back: Batch = crate::codec::decode(&bytes).expect("decode");
        assert_eq!(back, batch);
    }
}
