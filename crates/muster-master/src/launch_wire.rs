//! A launch's wire form (`muster.cluster.v1.LaunchTasks`), written straight from the master's
//! task records into the frame that carries it.
//!
//! A plan places thousands of tasks of a few groups. Built as the generated structs, every
//! task would copy a dozen strings (its group's program, arguments, environment, labels, job
//! and owner) only for them to be encoded and dropped. Here what a plan's tasks of one group
//! share is encoded once ([`GroupWire`]), and each task adds only its own fields: id, slot
//! name, resources, state, exit code, message and job version. Protobuf lets a message's
//! fields come in any order, so the bytes decode as the generated `LaunchTasks` (the tests
//! decode them and compare with the generated structs' own encoding).

use std::sync::Arc;

use bytes::{Buf, BufMut};
use prost::DecodeError;
use prost::encoding::{self, DecodeContext, WireType};

use muster_proto::cluster as pb;
use muster_proto::model as model_pb;
use muster_scheduler::JobGroup;

use crate::task_record::{TaskDetail, TaskRecord};

/// `LaunchTasks` field numbers.
const LAUNCH_TASKS: u32 = 1;
const LAUNCH_TERM: u32 = 2;
const LAUNCH_REGISTRATION: u32 = 3;
const LAUNCH_DEADLINE: u32 = 4;
/// `RunTask` field numbers.
const RUN_FRAMEWORK: u32 = 1;
const RUN_TASK: u32 = 2;
const RUN_TERM: u32 = 3;
/// `Task` field numbers of a task's own fields (its group's are in [`GroupWire`]; its ports'
/// labels are its group's, but each number its own, so the ports are a task's).
const TASK_ID: u32 = 1;
const TASK_NAME: u32 = 2;
const TASK_RESOURCES: u32 = 4;
const TASK_STATE: u32 = 6;
const TASK_EXIT_CODE: u32 = 7;
const TASK_MESSAGE: u32 = 11;
const TASK_JOB_VERSION: u32 = 14;
const TASK_PORTS: u32 = 17;

/// What a plan's tasks of one group share on the wire, encoded once.
#[derive(Debug)]
pub(crate) struct GroupWire {
    /// `RunTask.framework`, key and length included: the job, as its framework.
    framework: Box<[u8]>,
    /// The `Task` fields every task of the group has alike: framework id, labels, command,
    /// arguments, environment, job, group, user and lifecycle.
    task_fields: Box<[u8]>,
}

impl GroupWire {
    /// The shared fields of `job_group`'s tasks that run `detail`, restarted, checked and
    /// stopped as `lifecycle` says.
    pub(crate) fn new(
        job_group: &JobGroup,
        detail: &TaskDetail,
        lifecycle: Option<model_pb::TaskLifecycle>,
    ) -> Self {
        let framework = pb::Framework {
            id: job_group.job.to_string(),
            name: job_group.job.to_string(),
        };
        let mut framework_field =
            Vec::with_capacity(encoding::message::encoded_len(RUN_FRAMEWORK, &framework));
        encoding::message::encode(RUN_FRAMEWORK, &framework, &mut framework_field);
        let shared = model_pb::Task {
            framework_id: detail.framework_id.clone(),
            labels: detail.wire_labels(),
            command: detail.command.clone(),
            args: detail.args.clone(),
            env: detail.env.iter().cloned().collect(),
            job: job_group.job.to_string(),
            group: job_group.group.to_string(),
            user: detail.user.clone(),
            lifecycle: lifecycle.map(Box::new),
            ..model_pb::Task::default()
        };
        GroupWire {
            framework: framework_field.into(),
            task_fields: prost::Message::encode_to_vec(&shared).into(),
        }
    }
}

/// One task of a launch: its record, and what its group shares on the wire.
#[derive(Debug)]
pub(crate) struct RunWire {
    pub(crate) task: TaskRecord,
    pub(crate) group: Arc<GroupWire>,
}

/// The `LaunchTasks` one agent gets from one plan: sent as that type, never decoded as this
/// one.
#[derive(Debug)]
pub(crate) struct LaunchWire {
    pub(crate) runs: Vec<RunWire>,
    /// The leader's raft term, in the launch and in each of its runs.
    pub(crate) term: u64,
    /// The agent's registration it is meant for, and when it expires (`LaunchTasks`'s
    /// `registration` and `deadline_unix_ms`): the agent refuses it for another registration
    /// of itself or past the deadline.
    pub(crate) fence: LaunchFence,
}

/// Whom and until when a launch is for (see [`LaunchWire::fence`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct LaunchFence {
    /// The agent's registration number (0: not fenced so).
    pub(crate) registration: u64,
    /// When it expires, in milliseconds since the Unix epoch (0: never).
    pub(crate) deadline_unix_ms: u64,
}

/// The most bytes of runs packed into one launch message: half the agent link's 4 MiB message
/// limit. A plan's runs for one agent that add up to more go in several messages; a run alone
/// is never larger, since a job's size is capped below the link's limit
/// ([`MAX_JOB_BYTES_CEILING`](muster_model::MAX_JOB_BYTES_CEILING)).
pub(crate) const LAUNCH_MESSAGE_BUDGET: usize = 2 * 1024 * 1024;

impl LaunchWire {
    /// `runs` for one agent under `term` and `fence`, in order, packed into launches of at
    /// most `budget` bytes each (a run larger than that goes alone).
    pub(crate) fn packed(
        runs: Vec<RunWire>,
        term: u64,
        fence: LaunchFence,
        budget: usize,
    ) -> Vec<LaunchWire> {
        let mut launches = Vec::new();
        let mut current = LaunchWire {
            runs: Vec::new(),
            term,
            fence,
        };
        let mut current_len = 0usize;
        for run in runs {
            let len = run.run_len(run.task_len(), term);
            if !current.runs.is_empty() && current_len.saturating_add(len) > budget {
                let full = std::mem::replace(
                    &mut current,
                    LaunchWire {
                        runs: Vec::new(),
                        term,
                        fence,
                    },
                );
                launches.push(full);
                current_len = 0;
            }
            current_len = current_len.saturating_add(len);
            current.runs.push(run);
        }
        if !current.runs.is_empty() {
            launches.push(current);
        }
        launches
    }
}

impl RunWire {
    fn resources(&self) -> model_pb::Resources {
        self.task.view.resources.clone().into()
    }

    /// Bytes of the run's `Task`.
    fn task_len(&self) -> usize {
        let view = &*self.task.view;
        string_len(TASK_ID, view.id())
            + string_len(TASK_NAME, view.name())
            + encoding::message::encoded_len(TASK_RESOURCES, &self.resources())
            + int32_len(TASK_STATE, view.state.into())
            + int32_len(TASK_EXIT_CODE, self.task.exit_code)
            + string_len(TASK_MESSAGE, &self.task.message)
            + uint64_len(TASK_JOB_VERSION, view.job_version)
            + encoding::message::encoded_len_repeated(TASK_PORTS, &self.task.wire_ports())
            + self.group.task_fields.len()
    }

    /// Bytes of the `RunTask`, given its task's.
    fn run_len(&self, task_len: usize, term: u64) -> usize {
        self.group.framework.len()
            + encoding::key_len(RUN_TASK)
            + encoding::encoded_len_varint(task_len as u64)
            + task_len
            + uint64_len(RUN_TERM, term)
    }

    /// Writes the `RunTask`, given its task's length.
    fn encode(&self, task_len: usize, term: u64, buf: &mut impl BufMut) {
        let view = &*self.task.view;
        buf.put_slice(&self.group.framework);
        encoding::encode_key(RUN_TASK, WireType::LengthDelimited, buf);
        encoding::encode_varint(task_len as u64, buf);
        put_string(TASK_ID, view.id(), buf);
        put_string(TASK_NAME, view.name(), buf);
        encoding::message::encode(TASK_RESOURCES, &self.resources(), buf);
        put_int32(TASK_STATE, view.state.into(), buf);
        put_int32(TASK_EXIT_CODE, self.task.exit_code, buf);
        put_string(TASK_MESSAGE, &self.task.message, buf);
        put_uint64(TASK_JOB_VERSION, view.job_version, buf);
        for port in self.task.wire_ports() {
            encoding::message::encode(TASK_PORTS, &port, buf);
        }
        buf.put_slice(&self.group.task_fields);
        put_uint64(RUN_TERM, term, buf);
    }
}

impl prost::Message for LaunchWire {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        for run in &self.runs {
            let task_len = run.task_len();
            encoding::encode_key(LAUNCH_TASKS, WireType::LengthDelimited, buf);
            encoding::encode_varint(run.run_len(task_len, self.term) as u64, buf);
            run.encode(task_len, self.term, buf);
        }
        put_uint64(LAUNCH_TERM, self.term, buf);
        put_uint64(LAUNCH_REGISTRATION, self.fence.registration, buf);
        put_uint64(LAUNCH_DEADLINE, self.fence.deadline_unix_ms, buf);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        // Only ever sent: a receiver decodes `LaunchTasks`.
        encoding::skip_field(wire_type, tag, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        let runs: usize = self
            .runs
            .iter()
            .map(|run| {
                let len = run.run_len(run.task_len(), self.term);
                encoding::key_len(LAUNCH_TASKS) + encoding::encoded_len_varint(len as u64) + len
            })
            .sum();
        runs + uint64_len(LAUNCH_TERM, self.term)
            + uint64_len(LAUNCH_REGISTRATION, self.fence.registration)
            + uint64_len(LAUNCH_DEADLINE, self.fence.deadline_unix_ms)
    }

    fn clear(&mut self) {
        self.runs.clear();
        self.term = 0;
        self.fence = LaunchFence::default();
    }
}

impl prost::Name for LaunchWire {
    const NAME: &'static str = <pb::LaunchTasks as prost::Name>::NAME;
    const PACKAGE: &'static str = <pb::LaunchTasks as prost::Name>::PACKAGE;

    fn full_name() -> String {
        <pb::LaunchTasks as prost::Name>::full_name()
    }

    fn type_url() -> String {
        <pb::LaunchTasks as prost::Name>::type_url()
    }
}

/// Bytes of a string field (none when empty).
fn string_len(tag: u32, value: &str) -> usize {
    if value.is_empty() {
        0
    } else {
        encoding::key_len(tag) + encoding::encoded_len_varint(value.len() as u64) + value.len()
    }
}

/// Bytes of an `int32` (or enum) field (none when zero, as proto3 leaves it out).
fn int32_len(tag: u32, value: i32) -> usize {
    if value == 0 {
        0
    } else {
        encoding::int32::encoded_len(tag, &value)
    }
}

/// Bytes of a `uint64` field (none when zero).
fn uint64_len(tag: u32, value: u64) -> usize {
    if value == 0 {
        0
    } else {
        encoding::uint64::encoded_len(tag, &value)
    }
}

/// Writes an `int32` (or enum) field (nothing when zero).
fn put_int32(tag: u32, value: i32, buf: &mut impl BufMut) {
    if value != 0 {
        encoding::int32::encode(tag, &value, buf);
    }
}

/// Writes a `uint64` field (nothing when zero).
fn put_uint64(tag: u32, value: u64, buf: &mut impl BufMut) {
    if value != 0 {
        encoding::uint64::encode(tag, &value, buf);
    }
}

/// Writes a string field (nothing when empty).
fn put_string(tag: u32, value: &str, buf: &mut impl BufMut) {
    if !value.is_empty() {
        encoding::encode_key(tag, WireType::LengthDelimited, buf);
        encoding::encode_varint(value.len() as u64, buf);
        buf.put_slice(value.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use muster_model::{Resources, TaskState};
    use muster_scheduler::TaskView;
    use prost::Message;

    fn detail() -> TaskDetail {
        TaskDetail {
            port_labels: Default::default(),
            framework_id: "web".into(),
            command: "/bin/server".into(),
            args: vec!["--port".into(), "8080".into()],
            env: vec![("A".into(), "1".into()), ("B".into(), "two".into())],
            user: "nobody".into(),
            labels: Arc::new(vec![("tier".into(), "front".into())]),
        }
    }

    fn record(
        job_group: &Arc<JobGroup>,
        detail: &Arc<TaskDetail>,
        slot: usize,
        state: TaskState,
        job_version: u64,
    ) -> TaskRecord {
        let name = format!("web.frontend[{slot}]");
        TaskRecord {
            view: Arc::new(TaskView::new(
                &format!("{name}-0123abcd"),
                &name,
                Arc::clone(job_group),
                Resources {
                    cpus: 0.25,
                    mem_mb: 64 * slot as u64,
                },
                state,
                job_version,
            )),
            detail: Arc::clone(detail),
            exit_code: 0,
            launch_deadline: None,
            message: Box::default(),
        }
    }

    /// The same launch as the generated structs, the way the master built it before.
    fn generated(launch: &LaunchWire) -> pb::LaunchTasks {
        pb::LaunchTasks {
            tasks: launch
                .runs
                .iter()
                .map(|run| pb::RunTask {
                    framework: Some(pb::Framework {
                        id: run.task.view.job().to_owned(),
                        name: run.task.view.job().to_owned(),
                    }),
                    task: Some(run.task.to_wire()),
                    term: launch.term,
                })
                .collect(),
            term: launch.term,
            registration: launch.fence.registration,
            deadline_unix_ms: launch.fence.deadline_unix_ms,
        }
    }

    #[test]
    fn a_launch_decodes_as_the_generated_launch_tasks_and_is_as_long() {
        let job_group = JobGroup::new("web", "frontend");
        let detail = Arc::new(detail());
        let group = Arc::new(GroupWire::new(&job_group, &detail, None));
        let mut failed = record(&job_group, &detail, 2, TaskState::Failed, 0);
        failed.exit_code = -1;
        failed.message = "could not start".into();
        let runs = [
            record(&job_group, &detail, 0, TaskState::Staging, 3),
            // A zero slot resource, job version and (below) term are left out, as prost does.
            record(&job_group, &detail, 0, TaskState::Staging, 0),
            failed,
        ];
        for term in [7, 0] {
            let launch = LaunchWire {
                runs: runs
                    .iter()
                    .map(|task| RunWire {
                        task: task.clone(),
                        group: Arc::clone(&group),
                    })
                    .collect(),
                term,
                fence: LaunchFence {
                    registration: term * 3,
                    deadline_unix_ms: term * 1_000_000_007,
                },
            };
            let bytes = launch.encode_to_vec();
            assert_eq!(bytes.len(), launch.encoded_len(), "term {term}");
            let expected = generated(&launch);
            assert_eq!(
                pb::LaunchTasks::decode(bytes.as_slice()).expect("decodes"),
                expected,
                "term {term}"
            );
            assert_eq!(bytes.len(), expected.encoded_len(), "term {term}");
        }
        // A group's lifecycle reaches every task of it.
        let lifecycle = model_pb::TaskLifecycle {
            kill_signal: "SIGINT".into(),
            kill_timeout_ms: Some(2_500),
            ..model_pb::TaskLifecycle::default()
        };
        let checked = Arc::new(GroupWire::new(&job_group, &detail, Some(lifecycle.clone())));
        let launch = LaunchWire {
            runs: vec![RunWire {
                task: runs[0].clone(),
                group: checked,
            }],
            term: 1,
            fence: LaunchFence {
                registration: 1,
                deadline_unix_ms: 1,
            },
        };
        let decoded = pb::LaunchTasks::decode(launch.encode_to_vec().as_slice()).expect("decodes");
        let task = decoded.tasks[0].task.as_ref().expect("a task");
        assert_eq!(task.lifecycle.as_deref(), Some(&lifecycle));
    }

    #[test]
    fn runs_are_packed_in_order_into_launches_within_the_budget() {
        let job_group = JobGroup::new("web", "frontend");
        let mut big = detail();
        big.env = vec![("BLOB".into(), "x".repeat(40_000))];
        let detail = Arc::new(big);
        let group = Arc::new(GroupWire::new(&job_group, &detail, None));
        let runs: Vec<RunWire> = (0..10)
            .map(|slot| RunWire {
                task: record(&job_group, &detail, slot, TaskState::Staging, 1),
                group: Arc::clone(&group),
            })
            .collect();
        let names: Vec<String> = runs.iter().map(|r| r.task.view.name().to_owned()).collect();
        let launches = LaunchWire::packed(runs, 4, LaunchFence::default(), 100_000);
        assert_eq!(launches.len(), 5, "two runs of about 40 kB fit in 100 kB");
        let mut packed_names = Vec::new();
        for launch in &launches {
            assert_eq!(launch.term, 4);
            assert!(
                launch.encoded_len() <= 100_000 + 16,
                "{}",
                launch.encoded_len()
            );
            packed_names.extend(launch.runs.iter().map(|r| r.task.view.name().to_owned()));
        }
        assert_eq!(packed_names, names);
        let alone = LaunchWire::packed(
            vec![RunWire {
                task: record(&job_group, &detail, 0, TaskState::Staging, 1),
                group,
            }],
            4,
            LaunchFence::default(),
            1_000,
        );
        assert_eq!(alone.len(), 1, "a run over the budget still goes, alone");
        assert!(LaunchWire::packed(Vec::new(), 4, LaunchFence::default(), 1_000).is_empty());
    }

    #[test]
    fn it_travels_as_launch_tasks() {
        use prost::Name;
        assert_eq!(LaunchWire::full_name(), pb::LaunchTasks::full_name());
        assert_eq!(LaunchWire::type_url(), pb::LaunchTasks::type_url());
    }
}
