//! Who may call each method of the master's gRPC APIs: declared here, once, and checked by
//! the guard in front of each service (`server.rs` installs them) before a call reaches a
//! handler.
//!
//! | service | method | needs |
//! |---|---|---|
//! | `Operator` | `GetState`, `ListNamespaces` | client certificate, any token (the answer holds only what it may see) |
//! | `Operator` | `JobStatus`, `ListJobs`, `ListEvaluations`, `StreamEvents`, `JobVersions`, `PlanJob` | client certificate, `read-job` somewhere (checked per namespace by the call) |
//! | `Operator` | `TaskLogs` | `read-logs` somewhere (per namespace by the call) |
//! | `Operator` | `ListDeployments` | client certificate, `read-job` somewhere (checked per namespace by the call) |
//! | `Operator` | `SubmitJob`, `ChangeDeployment`, `StopJob`, `LaunchTask` | `submit-job`, `submit-job`, `stop-job`, `dispatch-job` somewhere (per namespace by the call) |
//! | `Operator` | `DrainAgent`, `SetAgentEligibility` | agent `write` |
//! | `Operator` | `GetMetrics`, `ListRaftPeers` | operator `read` |
//! | `Operator` | `SnapshotSave`, `AddRaftPeer`, `RemoveRaftPeer`, `TransferLeadership`, `Monitor` | operator `write` |
//! | `Operator` | `CreateToken`, `ListTokens`, `DeleteToken`, `ApplyPolicy`, `ListPolicies`, `DeletePolicy`, `ApplyNamespace`, `DeleteNamespace`, `SnapshotRestore` | a management token |
//! | `Operator` | `AclBootstrap` | client certificate (the registry allows it once) |
//! | `Scheduling` | every method | client certificate, a scheduler rule (checked per namespace by the call) |
//! | `Raft` | every method | master certificate (see `RegistryNode::raft_service`) |
//!
//! Per namespace, the checks and the redaction of answers are in
//! [`visibility`](crate::visibility).
//!
//! The actor transport's messages declare theirs where they are installed: agent messages to
//! the master from agent certificates (`server.rs`), launches and kills to an agent from
//! master certificates (the agent's `handle.rs`).

use muster_security::{Access, Capability, Permission, Requirement, Role, Rules};

const CLIENTS: &[Role] = &[Role::Client];

fn token(permission: Permission) -> Requirement {
    Requirement::Token(CLIENTS, permission)
}

/// The `muster.cluster.v1.Operator` service's rules. A method without a row needs a
/// management token: closed by default.
pub fn operator_rules() -> Rules {
    let read_job = token(Permission::Namespaced(Capability::ReadJob));
    let mut rules = Rules::new(token(Permission::Manage))
        .method("GetState", token(Permission::AnyToken))
        .method("ListNamespaces", token(Permission::AnyToken))
        .method("GetMetrics", token(Permission::Operator(Access::Read)))
        .method(
            "TaskLogs",
            token(Permission::Namespaced(Capability::ReadLogs)),
        )
        .method(
            "SubmitJob",
            token(Permission::Namespaced(Capability::SubmitJob)),
        )
        .method(
            "ChangeDeployment",
            token(Permission::Namespaced(Capability::SubmitJob)),
        )
        .method(
            "StopJob",
            token(Permission::Namespaced(Capability::StopJob)),
        )
        .method(
            "LaunchTask",
            token(Permission::Namespaced(Capability::DispatchJob)),
        )
        .method("DrainAgent", token(Permission::Agent(Access::Write)))
        .method(
            "SetAgentEligibility",
            token(Permission::Agent(Access::Write)),
        )
        .method("SnapshotSave", token(Permission::Operator(Access::Write)))
        .method("ListRaftPeers", token(Permission::Operator(Access::Read)))
        .method("AddRaftPeer", token(Permission::Operator(Access::Write)))
        .method("RemoveRaftPeer", token(Permission::Operator(Access::Write)))
        .method(
            "TransferLeadership",
            token(Permission::Operator(Access::Write)),
        )
        .method("Monitor", token(Permission::Operator(Access::Write)))
        .method("AclBootstrap", Requirement::Certificate(CLIENTS));
    for method in [
        "JobStatus",
        "ListJobs",
        "ListEvaluations",
        "StreamEvents",
        "JobVersions",
        "PlanJob",
        "ListDeployments",
    ] {
        rules = rules.method(method, read_job);
    }
    rules
}

/// The `muster.scheduling.v1.Scheduling` service's rules (remote scheduler workers).
pub fn scheduling_rules() -> Rules {
    Rules::new(token(Permission::Schedule))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operator_method_has_the_permission_its_table_row_says() {
        let rules = operator_rules();
        let namespaced = |c| token(Permission::Namespaced(c));
        assert_eq!(rules.requirement("GetState"), token(Permission::AnyToken));
        assert_eq!(
            rules.requirement("ListJobs"),
            namespaced(Capability::ReadJob)
        );
        assert_eq!(
            rules.requirement("ListEvaluations"),
            namespaced(Capability::ReadJob)
        );
        assert_eq!(
            rules.requirement("TaskLogs"),
            namespaced(Capability::ReadLogs)
        );
        assert_eq!(
            rules.requirement("SubmitJob"),
            namespaced(Capability::SubmitJob)
        );
        assert_eq!(
            rules.requirement("StopJob"),
            namespaced(Capability::StopJob)
        );
        assert_eq!(
            rules.requirement("ListDeployments"),
            namespaced(Capability::ReadJob)
        );
        assert_eq!(
            rules.requirement("ChangeDeployment"),
            namespaced(Capability::SubmitJob)
        );
        assert_eq!(rules.requirement("ListTokens"), token(Permission::Manage));
        assert_eq!(rules.requirement("ApplyPolicy"), token(Permission::Manage));
        assert_eq!(
            rules.requirement("ApplyNamespace"),
            token(Permission::Manage)
        );
        assert_eq!(
            rules.requirement("DrainAgent"),
            token(Permission::Agent(Access::Write))
        );
        assert_eq!(
            rules.requirement("SetAgentEligibility"),
            token(Permission::Agent(Access::Write))
        );
        assert_eq!(
            rules.requirement("SnapshotSave"),
            token(Permission::Operator(Access::Write))
        );
        assert_eq!(
            rules.requirement("SnapshotRestore"),
            token(Permission::Manage)
        );
        // A method added later without a row needs management: closed by default.
        assert_eq!(rules.requirement("SomethingNew"), token(Permission::Manage));
        assert_eq!(
            rules.requirement("AclBootstrap"),
            Requirement::Certificate(CLIENTS)
        );
    }
}
