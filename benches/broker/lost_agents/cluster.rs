//! The cluster of the lost-agents scenario: its jobs, its agents and their re-registrations
//! and heartbeats, the master started on its data dir, and the workers' backend that counts
//! what they do.

use super::*;

pub(super) fn service_job_name(j: usize) -> String {
    format!("service-{j:03}")
}

pub(super) fn system_job_name(j: usize) -> String {
    format!("system-{j:03}")
}

pub(super) fn job_spec(
    name: String,
    kind: model_pb::SchedulerType,
    group: &str,
    count: u32,
) -> model_pb::Job {
    model_pb::Job {
        name,
        priority: 50,
        scheduler: kind as i32,
        groups: vec![model_pb::TaskGroup {
            name: group.into(),
            count,
            resources: Some(model_pb::Resources {
                cpus: TASK_CPUS,
                mem_mb: TASK_MEM_MB,
            }),
            command: group.into(),
            ..model_pb::TaskGroup::default()
        }],
        ..model_pb::Job::default()
    }
}

/// The service job and slot index of agent `n`'s `s`-th service task: slots are dealt out in
/// turn, so any 5 consecutive agents run a task of every service job.
pub(super) fn service_slot(n: usize, s: usize) -> (usize, usize) {
    let slot = n * SERVICE_PER_AGENT + s;
    (slot % SERVICE_JOBS, slot / SERVICE_JOBS)
}

pub(super) fn agent_info(n: usize, agents_address: &str) -> model_pb::AgentInfo {
    model_pb::AgentInfo {
        dynamic_ports: Default::default(),
        hostname: format!("host-{n}"),
        address: format!("agent-{n}@{agents_address}"),
        resources: Some(model_pb::Resources {
            cpus: 16.0,
            mem_mb: 65_536,
        }),
        attributes: Default::default(),
    }
}

/// A running task of `job` in slot `name`, as the master's plan applier builds it
/// (`apply_plan` in `muster-master/src/master/plans.rs`): framework = job, its
/// job and group, the group's resources and command.
pub(super) fn task(job: &str, group: &str, name: String, id: String) -> model_pb::Task {
    model_pb::Task {
        id,
        name,
        framework_id: job.to_owned(),
        resources: Some(model_pb::Resources {
            cpus: TASK_CPUS,
            mem_mb: TASK_MEM_MB,
        }),
        job: job.to_owned(),
        group: group.to_owned(),
        state: model_pb::TaskState::Running as i32,
        command: group.to_owned(),
        ..model_pb::Task::default()
    }
}

/// What agent `n`, admitted as `id`, tells the new leader: its 20 service tasks and 100
/// system tasks, named as the schedulers name their slots (`{job}.{group}[{index}]`,
/// `{job}.{group}[{agent id}]`), and their frameworks.
pub(super) fn reregistration(n: usize, id: &str, agents_address: &str) -> pb::ReregisterAgent {
    let mut tasks = Vec::with_capacity(SERVICE_PER_AGENT + SYSTEM_JOBS);
    let mut frameworks = Vec::with_capacity(SERVICE_PER_AGENT + SYSTEM_JOBS);
    for s in 0..SERVICE_PER_AGENT {
        let (j, index) = service_slot(n, s);
        let job = service_job_name(j);
        let name = format!("{job}.{SERVICE_GROUP}[{index}]");
        let task_id = format!("{name}-{n:08x}");
        tasks.push(task(&job, SERVICE_GROUP, name, task_id));
        frameworks.push(job);
    }
    for j in 0..SYSTEM_JOBS {
        let job = system_job_name(j);
        let name = format!("{job}.{SYSTEM_GROUP}[{id}]");
        let task_id = format!("{name}-{n:08x}");
        tasks.push(task(&job, SYSTEM_GROUP, name, task_id));
        frameworks.push(job);
    }
    frameworks.sort();
    frameworks.dedup();
    pb::ReregisterAgent {
        agent_id: id.to_owned(),
        info: Some(agent_info(n, agents_address)),
        frameworks: frameworks
            .into_iter()
            .map(|job| pb::Framework {
                id: job.clone(),
                name: job,
            })
            .collect(),
        tasks,
        ..pb::ReregisterAgent::default()
    }
}

/// The process's resident memory (`/proc/self/statm`), whatever the allocator; 0 if it
/// cannot be read.
pub(super) fn resident() -> u64 {
    // SAFETY: sysconf only reads a system setting; it has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(0) as u64;
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|statm| statm.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * page)
}

pub(super) fn mib(bytes: i64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

pub(super) async fn metrics(master: &MasterServer) -> pb::MasterMetrics {
    master
        .pid()
        .ask(|reply| GetMetrics { reply }.into())
        .await
        .expect("master answers")
}

pub(super) async fn broker_stats(broker: &Pid<EvalBroker>) -> BrokerStats {
    broker.ask(BrokerMsg::Stats).await.expect("broker answers")
}

pub(super) fn broker_empty(stats: &BrokerStats) -> bool {
    let total = stats.total();
    total.ready + total.unacked + total.pending + total.cancelable == 0
}

/// Starts a master and waits until it leads. A restart on the same data dir may have to wait
/// for the previous master's store to close. Returns it with bounds on when it took the lead:
/// no earlier than the first, no later than the second (within about a millisecond).
pub(super) async fn start_master(config: &MasterConfig) -> (MasterServer, Instant, Instant) {
    let starting = Instant::now();
    let deadline = starting + Duration::from_secs(30);
    let master = loop {
        match MasterServer::start(config.clone()).await {
            Ok(master) => break master,
            Err(e) => {
                assert!(Instant::now() < deadline, "master did not start: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    // Not leading when it answered: it took the lead after the question was sent.
    let mut not_before = starting;
    loop {
        let asked = Instant::now();
        if metrics(&master).await.is_leader {
            return (master, not_before, Instant::now());
        }
        not_before = asked;
        assert!(Instant::now() < deadline, "master did not lead");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// What the workers did, counted in their backend: the master's [`WorkerStats`] come only
/// when the workers stop.
#[derive(Debug, Default)]
pub(super) struct Counts {
    pub(super) runs: HashMap<String, u64>,
    pub(super) placed: u64,
    pub(super) rejected: u64,
    pub(super) stopped: u64,
    pub(super) blocked: u64,
    /// Time in each backend call, both workers together.
    pub(super) spent: BTreeMap<&'static str, Duration>,
}

impl Counts {
    pub(super) fn runs(&self) -> u64 {
        self.runs.values().sum()
    }
}

/// The master's in-process backend, counting scheduler runs per job and plan results.
#[derive(Clone)]
pub(super) struct Counting {
    pub(super) inner: LocalBackend,
    pub(super) counts: Arc<Mutex<Counts>>,
}

impl Counting {
    pub(super) fn take(&self) -> Counts {
        std::mem::take(&mut *self.counts.lock().expect("counts"))
    }

    pub(super) async fn time<T>(&self, what: &'static str, call: impl Future<Output = T>) -> T {
        let started = Instant::now();
        let out = call.await;
        let mut counts = self.counts.lock().expect("counts");
        *counts.spent.entry(what).or_default() += started.elapsed();
        out
    }
}

impl muster_scheduler::Backend for Counting {
    async fn dequeue(
        &self,
        schedulers: &[String],
        timeout: Duration,
    ) -> Result<Option<muster_scheduler::Assignment>, muster_scheduler::WorkerError> {
        let assignment = self
            .time("dequeue", self.inner.dequeue(schedulers, timeout))
            .await;
        if let Ok(Some(assignment)) = &assignment {
            let mut counts = self.counts.lock().expect("counts");
            *counts.runs.entry(assignment.eval.job.clone()).or_default() += 1;
        }
        assignment
    }
    async fn snapshot(
        &self,
        min_index: u64,
    ) -> Result<muster_scheduler::ClusterSnapshot, muster_scheduler::WorkerError> {
        self.time("snapshot", self.inner.snapshot(min_index)).await
    }
    async fn submit(
        &self,
        plan: muster_scheduler::Plan,
    ) -> Result<muster_scheduler::PlanResult, muster_scheduler::WorkerError> {
        let result = self.time("submit", self.inner.submit(plan)).await;
        if let Ok(result) = &result {
            let mut counts = self.counts.lock().expect("counts");
            counts.placed += result.committed.len() as u64;
            counts.rejected += result.rejected.len() as u64;
            counts.stopped += result.stopped.len() as u64;
        }
        result
    }
    async fn ack(&self, eval: &EvalId, token: &str) -> Result<(), muster_scheduler::WorkerError> {
        self.time("ack", self.inner.ack(eval, token)).await
    }
    async fn nack(&self, eval: &EvalId, token: &str) -> Result<(), muster_scheduler::WorkerError> {
        self.time("nack", self.inner.nack(eval, token)).await
    }
    async fn block(
        &self,
        eval: Evaluation,
        token: &str,
        unplaced: Vec<muster_scheduler::Demand>,
    ) -> Result<(), muster_scheduler::WorkerError> {
        self.counts.lock().expect("counts").blocked += 1;
        self.time("block", self.inner.block(eval, token, unplaced))
            .await
    }
    async fn complete(
        &self,
        eval: &Evaluation,
        token: &str,
    ) -> Result<(), muster_scheduler::WorkerError> {
        self.time("complete", self.inner.complete(eval, token))
            .await
    }
}

/// Heartbeats as an agent does (at once, then at half of each TTL) until `stop`; counts
/// heartbeats the master did not answer with a TTL.
pub(super) async fn heartbeat(
    master: Pid<muster::master::Master>,
    agent_id: String,
    mut stop: watch::Receiver<bool>,
    refused: Arc<AtomicU64>,
) {
    loop {
        let request = pb::Heartbeat {
            agent_id: agent_id.clone(),
        };
        let answer = master
            .ask(|r| {
                Heartbeat {
                    heartbeat: request,
                    reply: r,
                    sender: None,
                }
                .into()
            })
            .await
            .map(|reply| reply.result);
        let Ok(Some(HeartbeatAnswer::TtlMs(ttl_ms))) = answer else {
            refused.fetch_add(1, Ordering::Relaxed);
            return;
        };
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(ttl_ms) / 2) => {}
            _ = stop.changed() => return,
        }
    }
}
