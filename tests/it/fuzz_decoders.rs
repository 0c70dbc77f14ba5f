//! Property fuzzing of the decoders that take bytes from outside, with proptest: transport
//! frames and envelopes, each domain and scheduling message through its conversion and
//! validation, and raft payloads (the JSON the registry's raft service decodes). Inputs are
//! arbitrary bytes and valid encodings with bytes flipped, inserted and cut. None may panic;
//! a decoder answers an error for what it cannot use.
//!
//! CI runs 2,000 inputs per target. A long run:
//! `MUSTER_FUZZ_CASES=1000000 cargo test --release --test it -- fuzz_decoders::`.

use muster::model::{Evaluation, Job, JobLimits, Task, Trigger};
use muster::proto::model as model_pb;
use muster::proto::scheduling as sched_pb;
use muster::proto::transport as transport_pb;
use muster::registry::types::{Batch, TypeConfig};
use muster::scheduler::{ClusterSnapshot, Plan, PlanResult};
use proptest::prelude::*;
use prost::Message;

/// Inputs per target: `MUSTER_FUZZ_CASES`, or 2,000.
fn config() -> ProptestConfig {
    let cases = std::env::var("MUSTER_FUZZ_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(2_000);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Byte edits: (position, what to do, byte).
type Edits = Vec<(usize, u8, u8)>;

/// `seed` with `edits` applied: overwrite, insert or cut at each position.
fn mutate(seed: &[u8], edits: &Edits) -> Vec<u8> {
    let mut bytes = seed.to_vec();
    for (at, how, byte) in edits {
        let at = if bytes.is_empty() {
            0
        } else {
            at % bytes.len()
        };
        match how % 3 {
            0 if !bytes.is_empty() => bytes[at] = *byte,
            1 => bytes.insert(at, *byte),
            _ => bytes.truncate(at),
        }
    }
    bytes
}

/// Arbitrary bytes, or a mutation of one of `seeds`.
fn inputs(seeds: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    let edits = proptest::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..8);
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..256),
        (0..seeds.len(), edits).prop_map(move |(i, edits)| mutate(&seeds[i], &edits)),
    ]
}

fn job_seed() -> model_pb::Job {
    model_pb::Job {
        name: "web".into(),
        priority: 50,
        scheduler: model_pb::SchedulerType::Service as i32,
        groups: vec![model_pb::TaskGroup {
            name: "main".into(),
            count: 3,
            resources: Some(model_pb::Resources {
                cpus: 0.5,
                mem_mb: 64,
            }),
            command: "sleep".into(),
            args: vec!["60".into()],
            env: [("A".to_owned(), "b".to_owned())].into(),
            constraints: vec![model_pb::Constraint {
                attribute: "rack".into(),
                op: model_pb::ConstraintOp::Equal as i32,
                value: "r1".into(),
            }],
            user: "nobody".into(),
            ..model_pb::TaskGroup::default()
        }],
        ..model_pb::Job::default()
    }
}

fn task_seed() -> model_pb::Task {
    model_pb::Task {
        id: "web.main[0]-1".into(),
        name: "web.main[0]".into(),
        framework_id: "web".into(),
        resources: Some(model_pb::Resources {
            cpus: 0.5,
            mem_mb: 64,
        }),
        state: model_pb::TaskState::Running as i32,
        command: "sleep".into(),
        job: "web".into(),
        group: "main".into(),
        job_version: 2,
        ..model_pb::Task::default()
    }
}

fn eval_seed() -> Vec<u8> {
    let job = match Job::from_submitted(job_seed()) {
        Ok(job) => job,
        Err(e) => panic!("the seed job is valid: {e}"),
    };
    model_pb::Evaluation::from(Evaluation::new(&job, Trigger::Reconcile)).encode_to_vec()
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn transport_frames(bytes in inputs(vec![
        transport_pb::Frame::default().encode_to_vec(),
    ])) {
        if let Ok(frame) = transport_pb::Frame::decode(bytes.as_slice()) {
            // What the node reads of a frame: re-encoding is total.
            let _ = frame.encode_to_vec();
        }
        let _ = transport_pb::Envelope::decode(bytes.as_slice());
    }

    #[test]
    fn submitted_jobs(bytes in inputs(vec![job_seed().encode_to_vec()])) {
        if let Ok(proto) = model_pb::Job::decode(bytes.as_slice()) {
            if let Ok(job) = Job::from_submitted(proto.clone()) {
                let _ = job.validate();
                let _ = job.check_limits(&JobLimits::default());
            }
            let _ = Job::try_from(proto);
        }
    }

    #[test]
    fn tasks_and_evaluations(bytes in inputs(vec![task_seed().encode_to_vec(), eval_seed()])) {
        if let Ok(proto) = model_pb::Task::decode(bytes.as_slice()) {
            let _ = Task::try_from(proto);
        }
        if let Ok(proto) = model_pb::Evaluation::decode(bytes.as_slice()) {
            let _ = Evaluation::try_from(proto);
        }
        if let Ok(proto) = model_pb::AgentInfo::decode(bytes.as_slice()) {
            let _ = muster::model::AgentInfo::try_from(proto);
        }
    }

    #[test]
    fn scheduling_messages(bytes in inputs(vec![
        sched_pb::ClusterSnapshot::default().encode_to_vec(),
        sched_pb::Plan { job: "web".into(), ..sched_pb::Plan::default() }.encode_to_vec(),
    ])) {
        if let Ok(proto) = sched_pb::ClusterSnapshot::decode(bytes.as_slice()) {
            let _ = ClusterSnapshot::try_from(proto);
        }
        if let Ok(proto) = sched_pb::Plan::decode(bytes.as_slice()) {
            let _ = Plan::try_from(proto);
        }
        if let Ok(proto) = sched_pb::PlanResult::decode(bytes.as_slice()) {
            let _ = PlanResult::try_from(proto);
        }
    }

    #[test]
    fn raft_payloads(bytes in inputs(vec![
        br#"{"ops":[]}"#.to_vec(),
        br#"{"vote":{"leader_id":{"term":1,"node_id":1},"committed":true},"prev_log_id":null,"entries":[],"leader_commit":null}"#.to_vec(),
    ])) {
        let _ = serde_json::from_slice::<Batch>(&bytes);
        let _ = serde_json::from_slice::<openraft::raft::AppendEntriesRequest<TypeConfig>>(&bytes);
        let _ = serde_json::from_slice::<openraft::raft::VoteRequest<u64>>(&bytes);
    }
}
