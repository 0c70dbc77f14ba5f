//! The SDK's own types on the wire (`muster.scheduling.v1`): snapshots, plans, their results
//! and assignments, with `From` one way and `TryFrom` the other.
//!
//! The domain types inside them (jobs, evaluations, resources, demands) convert in
//! `muster-model`; like those, a message that does not make a valid value is a [`FieldError`]
//! naming the field from the outermost message down (`agents[0].tasks[2].resources.cpus`).

use std::collections::BTreeMap;
use std::sync::Arc;

use muster_model::convert::{all, each, read, required, sorted, unsorted};
use muster_model::{AgentId, EvalId, FieldError};
use muster_proto::scheduling as pb;

use crate::plan::{
    AgentView, ClusterSnapshot, JobGroup, Placement, Plan, PlanResult, Preemption, Stop, TaskView,
};
use crate::worker::Assignment;

mod brief;
mod parts;

pub use brief::{brief_plan_result, plan_result_from_brief};

pub(crate) use parts::{
    deployments_from_wire, preemption_from_wire, quota_from_wire, quota_to_wire,
};

impl From<TaskView> for pb::TaskView {
    fn from(this: TaskView) -> Self {
        let ports = this.ports().iter().map(|&p| u32::from(p)).collect();
        pb::TaskView {
            id: this.id().to_string(),
            name: this.name().to_string(),
            job: this.job().to_string(),
            group: this.group().to_string(),
            resources: Some(this.resources.into()),
            state: this.state.into(),
            job_version: this.job_version,
            ports,
            health: this.health.into(),
        }
    }
}

impl TryFrom<pb::TaskView> for TaskView {
    type Error = FieldError;

    fn try_from(proto: pb::TaskView) -> Result<Self, FieldError> {
        let ports = proto
            .ports
            .iter()
            .enumerate()
            .map(|(i, &port)| {
                u16::try_from(port).ok().filter(|&p| p > 0).ok_or_else(|| {
                    FieldError::new(format!("ports[{i}]"), format!("{port} is not a port"))
                })
            })
            .collect::<Result<Vec<u16>, FieldError>>()?;
        let mut view = TaskView::new(
            &proto.id,
            &proto.name,
            JobGroup::new(&proto.job, &proto.group),
            required(proto.resources, "resources")?,
            read(proto.state, "state")?,
            proto.job_version,
        )
        .with_ports(ports);
        view.health = muster_model::TaskHealth::from_wire(proto.health);
        Ok(view)
    }
}

impl From<AgentView> for pb::AgentView {
    fn from(mut this: AgentView) -> Self {
        let id = std::mem::take(&mut this.id.0);
        let attributes = unsorted(std::mem::take(&mut this.attributes));
        let total = Some(this.total.clone().into());
        let ineligible = !this.eligible;
        let drain = muster_proto::model::DrainPhase::from(this.drain).into();
        let dynamic_ports = Some(this.dynamic_ports.into());
        pb::AgentView {
            id,
            attributes,
            total,
            dynamic_ports,
            tasks: this
                .into_tasks()
                .into_iter()
                .map(|task| Arc::unwrap_or_clone(task).into())
                .collect(),
            ineligible,
            drain,
        }
    }
}

impl TryFrom<pb::AgentView> for AgentView {
    type Error = FieldError;

    fn try_from(proto: pb::AgentView) -> Result<Self, FieldError> {
        let mut view = AgentView::new(
            AgentId(proto.id),
            sorted(proto.attributes),
            required(proto.total, "total")?,
            each::<TaskView, _>(proto.tasks, "tasks")?,
        );
        view.eligible = !proto.ineligible;
        if let Some(range) = proto.dynamic_ports {
            view.dynamic_ports = read(range, "dynamic_ports")?;
        }
        view.drain = muster_proto::model::DrainPhase::try_from(proto.drain)
            .map_err(|_| FieldError::new("drain", format!("unknown drain phase {}", proto.drain)))?
            .into();
        Ok(view)
    }
}

impl From<ClusterSnapshot> for pb::ClusterSnapshot {
    fn from(this: ClusterSnapshot) -> Self {
        pb::ClusterSnapshot {
            index: this.index,
            agents: this
                .agents
                .into_iter()
                .map(|agent| Arc::unwrap_or_clone(agent).into())
                .collect(),
            jobs: this
                .jobs
                .into_iter()
                .map(|(name, job)| (name, job.into()))
                .collect(),
            held: this.held.into_iter().collect(),
            quotas: this
                .quotas
                .into_iter()
                .map(|(namespace, quota)| (namespace, quota_to_wire(quota)))
                .collect(),
            deployments: this.deployments.into_values().map(Into::into).collect(),
            preemption: Some(pb::PreemptionConfig {
                service: this.preemption.service,
                batch: this.preemption.batch,
                system: this.preemption.system,
            }),
        }
    }
}

impl TryFrom<pb::ClusterSnapshot> for ClusterSnapshot {
    type Error = FieldError;

    fn try_from(proto: pb::ClusterSnapshot) -> Result<Self, FieldError> {
        let mut jobs = BTreeMap::new();
        for (name, job) in proto.jobs {
            let job = read(job, &format!("jobs[{name:?}]"))?;
            jobs.insert(name, job);
        }
        let mut quotas = BTreeMap::new();
        for (namespace, quota) in proto.quotas {
            let quota = quota_from_wire(quota, &format!("quotas[{namespace:?}]"))?;
            quotas.insert(namespace, quota);
        }
        Ok(ClusterSnapshot {
            index: proto.index,
            agents: each::<AgentView, _>(proto.agents, "agents")?
                .into_iter()
                .map(Arc::new)
                .collect(),
            jobs,
            held: proto.held.into_iter().collect(),
            job_index: None,
            quotas,
            deployments: deployments_from_wire(proto.deployments)?,
            preemption: preemption_from_wire(proto.preemption),
        })
    }
}

impl From<Placement> for pb::Placement {
    fn from(this: Placement) -> Self {
        pb::Placement {
            agent: this.agent.0,
            task_id: this.task_id,
            name: this.name,
            job: this.job,
            group: this.group,
            resources: Some(this.resources.into()),
            job_version: this.job_version,
            ports: all(this.ports),
            ..pb::Placement::default()
        }
    }
}

impl TryFrom<pb::Placement> for Placement {
    type Error = FieldError;

    fn try_from(proto: pb::Placement) -> Result<Self, FieldError> {
        Ok(Placement {
            agent: AgentId(proto.agent),
            task_id: proto.task_id,
            name: proto.name,
            job: proto.job,
            group: proto.group,
            resources: required(proto.resources, "resources")?,
            job_version: proto.job_version,
            ports: each(proto.ports, "ports")?,
        })
    }
}

impl From<Stop> for pb::Stop {
    fn from(this: Stop) -> Self {
        pb::Stop {
            agent: this.agent.0,
            task_id: this.task_id,
        }
    }
}

impl TryFrom<pb::Stop> for Stop {
    type Error = FieldError;

    fn try_from(proto: pb::Stop) -> Result<Self, FieldError> {
        Ok(Stop {
            agent: AgentId(proto.agent),
            task_id: proto.task_id,
        })
    }
}

impl From<Preemption> for pb::Preemption {
    fn from(this: Preemption) -> Self {
        pb::Preemption {
            agent: this.agent.0,
            task_id: this.task_id,
            job: this.job,
        }
    }
}

impl TryFrom<pb::Preemption> for Preemption {
    type Error = FieldError;

    fn try_from(proto: pb::Preemption) -> Result<Self, FieldError> {
        Ok(Preemption {
            agent: AgentId(proto.agent),
            task_id: proto.task_id,
            job: proto.job,
        })
    }
}

impl From<Plan> for pb::Plan {
    fn from(this: Plan) -> Self {
        pb::Plan {
            atomic: this.atomic,
            preempt: all(this.preempt),
            eval_id: this.eval.0,
            job: this.job,
            job_version: this.job_version,
            snapshot_index: this.snapshot_index,
            place: all(this.place),
            stop: all(this.stop),
            unplaced: all(this.unplaced),
            eval_token: this.eval_token,
        }
    }
}

impl TryFrom<pb::Plan> for Plan {
    type Error = FieldError;

    fn try_from(proto: pb::Plan) -> Result<Self, FieldError> {
        Ok(Plan {
            eval: EvalId(proto.eval_id),
            job: proto.job,
            job_version: proto.job_version,
            snapshot_index: proto.snapshot_index,
            place: each(proto.place, "place")?,
            stop: each(proto.stop, "stop")?,
            unplaced: each(proto.unplaced, "unplaced")?,
            eval_token: proto.eval_token,
            atomic: proto.atomic,
            preempt: each(proto.preempt, "preempt")?,
        })
    }
}

impl From<PlanResult> for pb::PlanResult {
    fn from(this: PlanResult) -> Self {
        pb::PlanResult {
            committed: all(this.committed),
            rejected: all(this.rejected),
            stopped: all(this.stopped),
            index: this.index,
            over_quota: this.over_quota.into_iter().collect(),
            preempted: all(this.preempted),
            committed_ids: Vec::new(),
            rejected_ids: Vec::new(),
        }
    }
}

impl TryFrom<pb::PlanResult> for PlanResult {
    type Error = FieldError;

    fn try_from(proto: pb::PlanResult) -> Result<Self, FieldError> {
        Ok(PlanResult {
            committed: each(proto.committed, "committed")?,
            rejected: each(proto.rejected, "rejected")?,
            stopped: each(proto.stopped, "stopped")?,
            index: proto.index,
            over_quota: proto.over_quota.into_iter().collect(),
            preempted: each(proto.preempted, "preempted")?,
        })
    }
}

impl From<Assignment> for pb::Assignment {
    fn from(this: Assignment) -> Self {
        pb::Assignment {
            evaluation: Some(this.eval.into()),
            token: this.token,
            state_index: this.state_index,
        }
    }
}

impl TryFrom<pb::Assignment> for Assignment {
    type Error = FieldError;

    fn try_from(proto: pb::Assignment) -> Result<Self, FieldError> {
        Ok(Assignment {
            eval: required(proto.evaluation, "evaluation")?,
            token: proto.token,
            state_index: proto.state_index,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::fmt;

    use muster_model::{
        Constraint, ConstraintOp, Demand, EvalStatus, Evaluation, Job, Quota, Resources,
        SchedulerType, TaskGroup, TaskState, Trigger,
    };
    use muster_proto::model as model_pb;

    use super::*;

    fn resources(cpus: f64, mem_mb: u64) -> Resources {
        Resources { cpus, mem_mb }
    }

    fn rack(op: ConstraintOp, value: &str) -> Constraint {
        Constraint {
            attribute: "rack".into(),
            op,
            value: value.into(),
        }
    }

    fn job() -> Job {
        Job {
            name: "web".into(),
            priority: 70,
            scheduler: SchedulerType::System,
            named_scheduler: None,
            groups: vec![TaskGroup {
                gang: false,
                update: None,
                migrate_max_parallel: 0,
                disconnect: Default::default(),
                restart: None,
                reschedule: None,
                checks: Vec::new(),
                kill_signal: None,
                kill_timeout_ms: None,
                max_run_duration_ms: None,
                name: "fe".into(),
                count: 3,
                resources: resources(0.25, 128),
                command: "sleep".into(),
                args: vec!["30".into()],
                env: BTreeMap::from([("A".to_owned(), "1".to_owned())]),
                constraints: vec![
                    rack(ConstraintOp::Equal, "r1"),
                    rack(ConstraintOp::NotEqual, "r2"),
                    rack(ConstraintOp::Regexp, "^r[0-9]+$"),
                ],
                spec_version: 7,
                user: String::new(),
                affinities: vec![muster_model::Affinity {
                    attribute: "zone".into(),
                    op: ConstraintOp::SetContains,
                    value: "a,b".into(),
                    weight: -25,
                }],
                spreads: vec![muster_model::Spread {
                    attribute: "zone".into(),
                    weight: 80,
                    targets: vec![muster_model::SpreadTarget {
                        value: "a".into(),
                        percent: 40,
                    }],
                }],
                ports: vec![muster_model::PortRequest {
                    label: "http".into(),
                    static_port: 8080,
                }],
            }],
            stopped: true,
            version: 9,
        }
    }

    fn eval(trigger: Trigger, status: EvalStatus) -> Evaluation {
        Evaluation {
            id: EvalId("e-1".into()),
            job: "web".into(),
            priority: 255,
            scheduler: SchedulerType::Batch,
            named_scheduler: None,
            trigger,
            status,
            status_description: "why".into(),
            create_index: 1,
            modify_index: 2,
            snapshot_index: 3,
            wait_until_ms: 4,
        }
    }

    fn placement(task: &str) -> Placement {
        Placement {
            agent: AgentId("agent-1".into()),
            task_id: format!("{task}-0000abcd"),
            name: task.into(),
            job: "web".into(),
            group: "fe".into(),
            resources: resources(1.5, 64),
            job_version: 9,
            ports: vec![muster_model::AssignedPort {
                label: "http".into(),
                port: 20_400,
            }],
        }
    }

    fn snapshot() -> ClusterSnapshot {
        let states = [
            TaskState::Staging,
            TaskState::Starting,
            TaskState::Running,
            TaskState::Finished,
            TaskState::Failed,
            TaskState::Killed,
            TaskState::Lost,
        ];
        ClusterSnapshot {
            preemption: Default::default(),
            deployments: Default::default(),
            index: 42,
            agents: vec![Arc::new(AgentView::new(
                AgentId("agent-1".into()),
                BTreeMap::from([("rack".to_owned(), "r1".to_owned())]),
                resources(8.0, 4096),
                states
                    .iter()
                    .enumerate()
                    .map(|(i, state)| {
                        TaskView::new(
                            // An id that does not start with the name, as an operator may give.
                            &format!("t{i}"),
                            &format!("web.fe[{i}]"),
                            JobGroup::new("web", "fe"),
                            resources(0.5, 32),
                            *state,
                            // 0 (unknown) included.
                            i as u64,
                        )
                        .with_ports(vec![20_000 + i as u16; i % 2])
                    })
                    .collect::<Vec<_>>(),
            ))],
            jobs: BTreeMap::from([("web".to_owned(), job())]),
            held: ["web.fe[0]".to_owned()].into(),
            job_index: None,
            quotas: BTreeMap::from([(
                "team-a".to_owned(),
                Quota {
                    cpus: Some(2.5),
                    mem_mb: None,
                    tasks: Some(3),
                },
            )]),
        }
    }

    /// Into the message, through bytes, and back.
    fn round_trip<P, T>(value: T) -> T
    where
        P: From<T> + prost::Message + Default,
        T: TryFrom<P, Error = FieldError>,
    {
        let bytes = P::from(value).encode_to_vec();
        let decoded = P::decode(bytes.as_slice()).expect("decodes");
        T::try_from(decoded).expect("converts back")
    }

    #[test]
    fn evaluations_round_trip_with_every_trigger_and_status() {
        let triggers = [
            Trigger::JobRegister,
            Trigger::JobDeregister,
            Trigger::AgentUnreachable(AgentId("agent-3".into())),
            Trigger::AgentUpdate(AgentId("agent-4".into())),
            Trigger::Unblocked,
            Trigger::TaskEnded("web.fe[0]-1".into()),
            Trigger::FailedFollowUp(EvalId("e-0".into())),
        ];
        let statuses = [
            EvalStatus::Pending,
            EvalStatus::Blocked,
            EvalStatus::Complete,
            EvalStatus::Failed,
            EvalStatus::Canceled,
        ];
        for trigger in triggers {
            for status in statuses {
                let eval = eval(trigger.clone(), status);
                assert_eq!(round_trip::<model_pb::Evaluation, _>(eval.clone()), eval);
            }
        }
        for scheduler in SchedulerType::ALL {
            let eval = Evaluation {
                scheduler,
                ..eval(Trigger::JobRegister, EvalStatus::Pending)
            };
            assert_eq!(round_trip::<model_pb::Evaluation, _>(eval.clone()), eval);
        }
        let assignment = Assignment {
            eval: eval(Trigger::Unblocked, EvalStatus::Blocked),
            token: "tok".into(),
            state_index: 12,
        };
        assert_eq!(
            round_trip::<pb::Assignment, _>(assignment.clone()),
            assignment
        );
    }

    #[test]
    fn snapshots_plans_and_results_round_trip() {
        assert_eq!(round_trip::<pb::ClusterSnapshot, _>(snapshot()), snapshot());
        assert_eq!(
            round_trip::<pb::ClusterSnapshot, _>(ClusterSnapshot::default()),
            ClusterSnapshot::default()
        );
        let plan = Plan {
            preempt: Vec::new(),
            atomic: false,
            eval: EvalId("e-1".into()),
            job: "web".into(),
            job_version: 9,
            snapshot_index: 42,
            place: vec![placement("web.fe[0]"), placement("web.fe[1]")],
            stop: vec![Stop {
                agent: AgentId("agent-2".into()),
                task_id: "old".into(),
            }],
            unplaced: vec![
                Demand {
                    gang_fitting: 0,
                    gang: 0,
                    resources: resources(2.0, 10),
                    constraints: vec![rack(ConstraintOp::Equal, "r9")],
                    over_quota: None,
                },
                Demand {
                    gang_fitting: 0,
                    gang: 0,
                    resources: resources(1.0, 10),
                    constraints: Vec::new(),
                    over_quota: Some("namespace \"web\" is at its quota of 2 tasks".into()),
                },
            ],
            eval_token: "token-1".into(),
        };
        assert_eq!(round_trip::<pb::Plan, _>(plan.clone()), plan);
        let result = PlanResult {
            preempted: Vec::new(),
            committed: vec![placement("web.fe[0]")],
            rejected: vec![placement("web.fe[1]")],
            stopped: plan.stop.clone(),
            index: 43,
            over_quota: BTreeMap::from([(
                placement("web.fe[1]").task_id,
                "namespace \"default\" is at its quota of 1 tasks (it would have 2)".to_owned(),
            )]),
        };
        assert_eq!(round_trip::<pb::PlanResult, _>(result.clone()), result);
    }

    #[test]
    fn odd_cpu_amounts_are_sent_as_the_sdk_counts_them() {
        for (cpus, sent) in [
            (f64::NAN, 0.0),
            (-1.0, 0.0),
            (f64::INFINITY, f64::MAX),
            (0.0, 0.0),
            (2.5, 2.5),
        ] {
            let proto = model_pb::Resources::from(resources(cpus, 1));
            assert_eq!(proto.cpus, sent, "{cpus}");
            assert!(Resources::try_from(proto).is_ok());
        }
    }

    fn error_of<T, P>(proto: P) -> FieldError
    where
        T: TryFrom<P, Error = FieldError> + fmt::Debug,
    {
        T::try_from(proto).expect_err("malformed")
    }

    #[test]
    fn malformed_messages_name_the_field() {
        // An unknown enum value, deep in a snapshot.
        let mut proto = pb::ClusterSnapshot::from(snapshot());
        proto.agents[0].tasks[2].state = 99;
        let error = error_of::<ClusterSnapshot, _>(proto);
        assert_eq!(error.field(), "agents[0].tasks[2].state");
        assert_eq!(error.problem(), "unknown value 99");
        assert_eq!(
            error.to_string(),
            "invalid agents[0].tasks[2].state: unknown value 99"
        );

        // NaN and negative resources.
        let mut proto = pb::ClusterSnapshot::from(snapshot());
        proto.agents[0].tasks[1].resources = Some(model_pb::Resources {
            cpus: f64::NAN,
            mem_mb: 1,
        });
        let error = error_of::<ClusterSnapshot, _>(proto);
        assert_eq!(error.field(), "agents[0].tasks[1].resources.cpus");
        assert!(error.problem().contains("NaN"), "{error}");
        let mut proto = pb::ClusterSnapshot::from(snapshot());
        proto.agents[0].total = Some(model_pb::Resources {
            cpus: -2.0,
            mem_mb: 1,
        });
        assert_eq!(
            error_of::<ClusterSnapshot, _>(proto).field(),
            "agents[0].total.cpus"
        );

        // A missing required message.
        let mut proto = pb::ClusterSnapshot::from(snapshot());
        proto.agents[0].total = None;
        let error = error_of::<ClusterSnapshot, _>(proto);
        assert_eq!(
            (error.field(), error.problem()),
            ("agents[0].total", "missing")
        );

        // Inside a job of the snapshot.
        let mut proto = pb::ClusterSnapshot::from(snapshot());
        let job = proto.jobs.get_mut("web").expect("web");
        job.groups[0].constraints[1].op = 0;
        let error = error_of::<ClusterSnapshot, _>(proto);
        assert_eq!(error.field(), r#"jobs["web"].groups[0].constraints[1].op"#);
        assert_eq!(error.problem(), "unspecified");

        // Evaluations: trigger, status, scheduler, priority.
        let good = model_pb::Evaluation::from(eval(Trigger::JobRegister, EvalStatus::Pending));
        type Break = fn(&mut model_pb::Evaluation);
        let cases: [(Break, &str); 5] = [
            (|e| e.trigger = None, "trigger"),
            (
                |e| e.trigger = Some(model_pb::Trigger { kind: None }),
                "trigger",
            ),
            (|e| e.status = 0, "status"),
            (|e| e.scheduler = 7, "scheduler"),
            (|e| e.priority = 256, "priority"),
        ];
        for (break_it, field) in cases {
            let mut proto = good.clone();
            break_it(&mut proto);
            assert_eq!(error_of::<Evaluation, _>(proto).field(), field);
        }
        let error = error_of::<Assignment, _>(pb::Assignment {
            evaluation: None,
            token: "t".into(),
            state_index: 0,
        });
        assert_eq!(error.field(), "evaluation");

        // Plans and results.
        let mut proto = pb::Plan::from(Plan {
            place: vec![placement("a"), placement("b")],
            ..Plan::empty(EvalId("e".into()), "web", 1)
        });
        proto.place[1].resources = None;
        assert_eq!(error_of::<Plan, _>(proto).field(), "place[1].resources");
        let proto = pb::PlanResult {
            rejected: vec![pb::Placement {
                resources: Some(model_pb::Resources {
                    cpus: f64::INFINITY,
                    mem_mb: 0,
                }),
                ..pb::Placement::default()
            }],
            ..pb::PlanResult::default()
        };
        assert_eq!(
            error_of::<PlanResult, _>(proto).field(),
            "rejected[0].resources.cpus"
        );
        let proto = model_pb::Demand {
            gang_fitting: 0,
            gang: 0,
            resources: Some(model_pb::Resources::default()),
            constraints: vec![model_pb::Constraint {
                op: 99,
                ..model_pb::Constraint::default()
            }],
            over_quota: String::new(),
        };
        assert_eq!(error_of::<Demand, _>(proto).field(), "constraints[0].op");

        // A quota that is not a number of cpus.
        let mut proto = pb::ClusterSnapshot::from(snapshot());
        if let Some(quota) = proto.quotas.get_mut("team-a") {
            quota.cpus = Some(f64::NAN);
        }
        assert_eq!(
            error_of::<ClusterSnapshot, _>(proto).field(),
            "quotas[\"team-a\"].cpus"
        );

        // Request-level helpers name the request's field.
        let error = required::<Plan, pb::Plan>(None, "plan").expect_err("missing");
        assert_eq!(error.to_string(), "invalid plan: missing");
        let error = each::<Demand, _>(
            vec![model_pb::Demand::default(), model_pb::Demand::default()],
            "unplaced",
        )
        .expect_err("no resources");
        assert_eq!(error.field(), "unplaced[0].resources");
    }
}
