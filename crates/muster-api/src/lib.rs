//! The documents of Muster's HTTP API, shared by the master that serves them and the CLI that
//! prints them with `--json`: one JSON shape per answer, each with an OpenAPI schema
//! (`utoipa`), made from the operator API's reply it stands for.
//!
//! - [`JobSpec`]: the job document users write, a TOML file or the same document as JSON.
//! - [`documents`]: what the API answers (jobs, tasks, evaluations, agents, status, errors).

pub mod documents;
pub mod job_spec;

pub use documents::{
    AgentDetail, AgentList, AgentScheduling, AgentSummary, ApiError, ClusterStatus,
    DeploymentGroupInfo, DeploymentInfo, DeploymentList, DrainRequest, EVENT_TOPICS,
    EligibilityRequest, EvaluationInfo, EvaluationList, Event, JobDetail, JobList, JobPlan,
    JobSummary, JobVersion, JobVersions, Member, NamespaceInfo, PlannedTask, REDACTED,
    RaftConfiguration, RaftServer, ReadInfo, Submitted, TaskCounts, TaskInfo, TaskLogs, job_status,
};
pub use job_spec::{
    AffinitySpec, CheckSpec, ConstraintSpec, DisconnectSpec, GroupSpec, JobSpec, PortSpec,
    RescheduleSpec, RestartSpec, SpecError, SpreadSpec, SpreadTargetSpec, UpdateSpec,
};
