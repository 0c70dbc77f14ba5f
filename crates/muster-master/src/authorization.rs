//! Who may call each method of the master's gRPC APIs: declared here, once, and checked by
//! the guard in front of each service (`server.rs` installs them) before a call reaches a
//! handler.
//!
//! | service | method | needs |
//! |---|---|---|
//! | `Operator` | `GetState`, `GetMetrics`, `JobStatus`, `ListJobs`, `ListEvaluations`, `StreamEvents`, `TaskLogs`, `JobVersions`, `PlanJob` | client certificate, token with `read` |
//! | `Operator` | `SubmitJob`, `StopJob`, `LaunchTask` | client certificate, token with `submit` |
//! | `Operator` | `CreateToken`, `ListTokens`, `DeleteToken`, `SnapshotSave`, `SnapshotRestore`, `DrainAgent`, `SetAgentEligibility` | client certificate, `management` token |
//! | `Operator` | `AclBootstrap` | client certificate (the registry allows it once) |
//! | `Scheduling` | every method | client certificate, token with `schedule` |
//! | `Raft` | every method | master certificate (see `RegistryNode::raft_service`) |
//!
//! The actor transport's messages declare theirs where they are installed: agent messages to
//! the master from agent certificates (`server.rs`), launches and kills to an agent from
//! master certificates (the agent's `handle.rs`).

use muster_security::{Permission, Requirement, Role, Rules};

const CLIENTS: &[Role] = &[Role::Client];

/// The `muster.cluster.v1.Operator` service's rules.
pub fn operator_rules() -> Rules {
    Rules::new(Requirement::Token(CLIENTS, Permission::Manage))
        .method("GetState", Requirement::Token(CLIENTS, Permission::Read))
        .method("GetMetrics", Requirement::Token(CLIENTS, Permission::Read))
        .method("JobStatus", Requirement::Token(CLIENTS, Permission::Read))
        .method("ListJobs", Requirement::Token(CLIENTS, Permission::Read))
        .method(
            "ListEvaluations",
            Requirement::Token(CLIENTS, Permission::Read),
        )
        .method(
            "StreamEvents",
            Requirement::Token(CLIENTS, Permission::Read),
        )
        .method("TaskLogs", Requirement::Token(CLIENTS, Permission::Read))
        .method("JobVersions", Requirement::Token(CLIENTS, Permission::Read))
        .method("PlanJob", Requirement::Token(CLIENTS, Permission::Read))
        .method("SubmitJob", Requirement::Token(CLIENTS, Permission::Submit))
        .method("StopJob", Requirement::Token(CLIENTS, Permission::Submit))
        .method(
            "LaunchTask",
            Requirement::Token(CLIENTS, Permission::Submit),
        )
        .method("AclBootstrap", Requirement::Certificate(CLIENTS))
}

/// The `muster.scheduling.v1.Scheduling` service's rules (remote scheduler workers).
pub fn scheduling_rules() -> Rules {
    Rules::new(Requirement::Token(CLIENTS, Permission::Schedule))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operator_method_has_the_permission_its_table_row_says() {
        let rules = operator_rules();
        let token = |p| Requirement::Token(CLIENTS, p);
        assert_eq!(rules.requirement("GetState"), token(Permission::Read));
        assert_eq!(rules.requirement("ListJobs"), token(Permission::Read));
        assert_eq!(
            rules.requirement("ListEvaluations"),
            token(Permission::Read)
        );
        assert_eq!(rules.requirement("SubmitJob"), token(Permission::Submit));
        assert_eq!(rules.requirement("ListTokens"), token(Permission::Manage));
        assert_eq!(rules.requirement("DrainAgent"), token(Permission::Manage));
        assert_eq!(
            rules.requirement("SetAgentEligibility"),
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
