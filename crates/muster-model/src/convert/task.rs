//! [`Task`] and [`TaskState`] to and from their `muster.model.v1` messages.

use muster_proto::model as pb;

use crate::convert::{
    bad_enum, job_id_from_wire, job_id_to_wire, read, required, sorted, unsorted,
};
use crate::error::FieldError;
use crate::task::{Task, TaskState};

impl From<Task> for pb::Task {
    fn from(task: Task) -> Self {
        let (namespace, job) = job_id_to_wire(task.job);
        pb::Task {
            namespace,
            id: task.id,
            name: task.name,
            framework_id: task.framework_id,
            resources: Some(task.resources.into()),
            labels: task
                .labels
                .into_iter()
                .map(|(key, value)| pb::Label { key, value })
                .collect(),
            state: task.state.into(),
            exit_code: task.exit_code,
            command: task.command,
            args: task.args,
            env: unsorted(task.env),
            message: task.message,
            job,
            group: task.group,
            job_version: task.job_version,
            user: task.user,
            ports: crate::convert::all(task.ports),
            health: task.health.into(),
            restarts: task.restarts,
            lifecycle: None,
        }
    }
}

impl TryFrom<pb::Task> for Task {
    type Error = FieldError;

    fn try_from(proto: pb::Task) -> Result<Self, FieldError> {
        Ok(Task {
            id: proto.id,
            name: proto.name,
            job: job_id_from_wire(&proto.namespace, proto.job),
            group: proto.group,
            job_version: proto.job_version,
            framework_id: proto.framework_id,
            resources: required(proto.resources, "resources")?,
            labels: proto
                .labels
                .into_iter()
                .map(|label| (label.key, label.value))
                .collect(),
            state: read(proto.state, "state")?,
            exit_code: proto.exit_code,
            command: proto.command,
            args: proto.args,
            env: sorted(proto.env),
            message: proto.message,
            user: proto.user,
            ports: crate::convert::each(proto.ports, "ports")?,
            health: crate::TaskHealth::from_wire(proto.health),
            restarts: proto.restarts,
        })
    }
}

impl From<TaskState> for i32 {
    fn from(state: TaskState) -> Self {
        let proto = match state {
            TaskState::Staging => pb::TaskState::Staging,
            TaskState::Starting => pb::TaskState::Starting,
            TaskState::Running => pb::TaskState::Running,
            TaskState::Finished => pb::TaskState::Finished,
            TaskState::Failed => pb::TaskState::Failed,
            TaskState::Killed => pb::TaskState::Killed,
            TaskState::Lost => pb::TaskState::Lost,
            TaskState::Unknown => pb::TaskState::Unknown,
        };
        proto as i32
    }
}

impl TryFrom<i32> for TaskState {
    type Error = FieldError;

    fn try_from(proto: i32) -> Result<Self, FieldError> {
        match pb::TaskState::try_from(proto) {
            Ok(pb::TaskState::Staging) => Ok(TaskState::Staging),
            Ok(pb::TaskState::Starting) => Ok(TaskState::Starting),
            Ok(pb::TaskState::Running) => Ok(TaskState::Running),
            Ok(pb::TaskState::Finished) => Ok(TaskState::Finished),
            Ok(pb::TaskState::Failed) => Ok(TaskState::Failed),
            Ok(pb::TaskState::Killed) => Ok(TaskState::Killed),
            Ok(pb::TaskState::Lost) => Ok(TaskState::Lost),
            Ok(pb::TaskState::Unknown) => Ok(TaskState::Unknown),
            Ok(pb::TaskState::Unspecified) | Err(_) => Err(bad_enum(proto)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Resources;

    #[test]
    fn a_task_round_trips_and_a_bad_one_names_its_field() {
        let task = Task {
            id: "web.fe[0]-1a2b3c4d".into(),
            name: "web.fe[0]".into(),
            job: "web".into(),
            group: "fe".into(),
            job_version: 3,
            framework_id: "web".into(),
            resources: Resources {
                cpus: 0.5,
                mem_mb: 64,
            },
            labels: vec![("b".into(), "2".into()), ("a".into(), "1".into())],
            state: TaskState::Failed,
            exit_code: 2,
            command: "sh".into(),
            args: vec!["-c".into(), "exit 2".into()],
            env: [("K".to_owned(), "V".to_owned())].into(),
            message: "exited with 2".into(),
            user: String::new(),
            ports: vec![crate::AssignedPort {
                label: "http".into(),
                port: 20_017,
            }],
            health: crate::TaskHealth::Healthy,
            restarts: 2,
        };
        assert_eq!(
            Task::try_from(pb::Task::from(task.clone())),
            Ok(task.clone())
        );
        let mut bad = pb::Task::from(task);
        bad.state = 0;
        assert_eq!(
            Task::try_from(bad.clone()).map_err(|e| e.to_string()),
            Err("invalid state: unspecified".into())
        );
        bad.resources = None;
        assert_eq!(
            Task::try_from(bad).map_err(|e| e.field().to_owned()),
            Err("resources".into())
        );
    }
}
