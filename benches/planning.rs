//! One scheduler run (`binpack`, reconciliation included) against a large snapshot: what a
//! worker pays per evaluation, without the master around it.
//!
//! The cluster has the shape of the broker bench's `lost_agents`, at several sizes: agents ∈
//! {1,000, 5,000, 20,000}, each offering 16 cpus and 64 GiB and running 20 service tasks
//! (service jobs of count 1,000, dealt out so that consecutive agents run different jobs) and
//! one task of each of 10 system jobs. Every task needs cpus 0.01 and 1 MiB.
//!
//! Measures, each a whole `plan()` call:
//! - `service_in_place`: a service job of 1,000 whose tasks all run: nothing to do.
//! - `service_lost`: the same job after the first tenth of the agents left the snapshot: 100
//!   of its slots to place again.
//! - `system_in_place`: a system job with its task on every agent: nothing to do.
//! - `service_lost_zones`: `service_lost` in the same cluster with each agent in one of three
//!   zones and every service job spread evenly over them (a `spread` block on `zone`): the
//!   ranking counts the job's tasks per zone.
//!
//! The job is the same size at every cluster size, so a run whose cost follows the job, not
//! the cluster, takes about as long at 20,000 agents as at 1,000.
//!
//! Baseline `job_walk`, same run: the least any planner does, touching each of the job's
//! 1,000 tasks once (a `HashSet` of their slot names).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use muster::model::{
    AgentId, Evaluation, Job, Resources, SchedulerType, Spread, TaskGroup, TaskState, Trigger,
};
use muster_scheduler::{AgentView, ClusterSnapshot, JobGroup, JobIndex, TaskView, binpack};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SIZES: &[usize] = &[1_000, 5_000, 20_000];
const SERVICE_COUNT: usize = 1_000;
const SERVICE_PER_AGENT: usize = 20;
const SYSTEM_JOBS: usize = 10;
const TASK: Resources = Resources {
    cpus: 0.01,
    mem_mb: 1,
};

/// The zones agents are dealt out over in the zoned cluster.
const ZONES: usize = 3;

fn job(name: &str, scheduler: SchedulerType, count: u32, zoned: bool) -> Job {
    let spreads = if zoned && scheduler == SchedulerType::Service {
        vec![Spread {
            attribute: "zone".into(),
            weight: 50,
            targets: Vec::new(),
        }]
    } else {
        Vec::new()
    };
    Job {
        name: name.into(),
        scheduler,
        named_scheduler: None,
        priority: 50,
        stopped: false,
        version: 1,
        groups: vec![TaskGroup {
            name: "g".into(),
            count,
            resources: TASK,
            command: "run".into(),
            spreads,
            ..TaskGroup::default()
        }],
    }
}

/// A task of `group` filling slot `name`; the tasks of a group share it, as a master's do.
fn task(group: &Arc<JobGroup>, name: String, n: usize) -> TaskView {
    TaskView::new(
        &format!("{name}-{n:08x}"),
        &name,
        Arc::clone(group),
        TASK,
        TaskState::Running,
        1,
    )
}

fn service_name(j: usize) -> String {
    format!("service-{j:03}")
}

fn system_name(j: usize) -> String {
    format!("system-{j:03}")
}

/// The cluster of `agents` agents as described in the module docs; `zoned`, with each agent
/// in a zone and the service jobs spread over them.
fn snapshot(agents: usize, zoned: bool) -> ClusterSnapshot {
    let service_jobs = agents * SERVICE_PER_AGENT / SERVICE_COUNT;
    let mut jobs = BTreeMap::new();
    for j in 0..service_jobs {
        let name = service_name(j);
        jobs.insert(
            name.clone(),
            job(&name, SchedulerType::Service, SERVICE_COUNT as u32, zoned),
        );
    }
    for j in 0..SYSTEM_JOBS {
        let name = system_name(j);
        jobs.insert(name.clone(), job(&name, SchedulerType::System, 1, zoned));
    }
    let groups: HashMap<String, Arc<JobGroup>> = jobs
        .keys()
        .map(|name| (name.clone(), JobGroup::new(name, "g")))
        .collect();
    let views: Vec<Arc<AgentView>> = (0..agents)
        .map(|n| {
            let id = format!("agent-{n:05}");
            let mut tasks = Vec::new();
            for s in 0..SERVICE_PER_AGENT {
                let slot = n * SERVICE_PER_AGENT + s;
                let (j, index) = (slot % service_jobs, slot / service_jobs);
                let job = service_name(j);
                tasks.push(task(&groups[&job], format!("{job}.g[{index}]"), slot));
            }
            for j in 0..SYSTEM_JOBS {
                let job = system_name(j);
                tasks.push(task(&groups[&job], format!("{job}.g[{id}]"), n));
            }
            let attributes = if zoned {
                BTreeMap::from([("zone".to_owned(), format!("zone-{}", n % ZONES))])
            } else {
                BTreeMap::new()
            };
            Arc::new(AgentView::new(
                AgentId(id),
                attributes,
                Resources {
                    cpus: 16.0,
                    mem_mb: 65_536,
                },
                tasks,
            ))
        })
        .collect();
    let job_index = Some(JobIndex::update(None, &views));
    ClusterSnapshot {
        preemption: Default::default(),
        deployments: Default::default(),
        index: 1,
        agents: views,
        jobs,
        held: Default::default(),
        job_index,
        quotas: Default::default(),
    }
}

/// `full` after the first tenth of its agents left.
fn without_first_tenth(full: &ClusterSnapshot) -> ClusterSnapshot {
    let mut lost = full.clone();
    lost.agents.drain(..full.agents.len() / 10);
    lost.job_index = Some(JobIndex::update(full.job_index.as_ref(), &lost.agents));
    lost
}

fn eval(snapshot: &ClusterSnapshot, job: &str) -> Evaluation {
    Evaluation::new(&snapshot.jobs[job], Trigger::JobRegister)
}

fn planning(c: &mut Criterion) {
    let mut group = c.benchmark_group("planning");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    let mut scheduler = binpack();
    for &agents in SIZES {
        let full = snapshot(agents, false);
        let lost = without_first_tenth(&full);
        let lost_zones = without_first_tenth(&snapshot(agents, true));
        let service = eval(&full, &service_name(0));
        let system = eval(&full, &system_name(0));
        assert!(scheduler.plan(&service, &full).is_noop());
        assert!(scheduler.plan(&system, &full).is_noop());
        assert_eq!(
            scheduler.plan(&service, &lost).place.len(),
            SERVICE_COUNT / 10
        );
        assert_eq!(
            scheduler.plan(&service, &lost_zones).place.len(),
            SERVICE_COUNT / 10
        );

        let names: Vec<String> = full
            .agents
            .iter()
            .flat_map(|agent| agent.tasks_of(&service.job))
            .map(|task| task.name().to_owned())
            .collect();
        assert_eq!(names.len(), SERVICE_COUNT);
        group.bench_function(BenchmarkId::new("job_walk", agents), |b| {
            b.iter(|| {
                let seen: HashSet<&str> = names.iter().map(String::as_str).collect();
                black_box(seen.len())
            })
        });
        group.bench_function(BenchmarkId::new("service_in_place", agents), |b| {
            b.iter(|| black_box(scheduler.plan(&service, &full)))
        });
        group.bench_function(BenchmarkId::new("service_lost", agents), |b| {
            b.iter(|| black_box(scheduler.plan(&service, &lost)))
        });
        group.bench_function(BenchmarkId::new("service_lost_zones", agents), |b| {
            b.iter(|| black_box(scheduler.plan(&service, &lost_zones)))
        });
        group.bench_function(BenchmarkId::new("system_in_place", agents), |b| {
            b.iter(|| black_box(scheduler.plan(&system, &full)))
        });
    }
    group.finish();
}

criterion_group!(benches, planning);
criterion_main!(benches);
