//! The registry's raft traffic: what its encoding costs, how fast a real three-member group
//! commits writes, and how fast a follower far behind catches up.
//!
//! Every member here is the real one (`RegistryNode`: openraft on sled in a temp dir, raft
//! over tonic with mutual TLS from the shared test PKI, the pre-vote elections, replication
//! in batches of at most `REPLICATION_BATCH_BYTES`), on loopback, in one process on the
//! bench's 2-worker runtime. Groups, each with a baseline of the same shape in the same run:
//!
//! - `registry_codec`: encode and decode one AppendEntries request as it travels between
//!   members: 64 entries, each a batch of a job submission (`Op::UpsertJob`, 3 groups with
//!   arguments, constraints and a few KiB of environment: a JSON config, a PEM bundle) and its
//!   evaluations (`Op::UpsertEvals`). `msgpack` is `codec::encode`/`codec::decode`, the
//!   registry's encoding; `json` is `serde_json::to_vec`/`from_slice`, the encoding before it,
//!   on the same value. Throughput is in entries. The encoded sizes are printed once
//!   (`registry_codec: ...`).
//! - `registry_write`: writes of one `Op::AdmitAgent` through `RegistryNode::write` on the
//!   leader of three members over mutual TLS, each returning once the entry is committed
//!   (leader and one follower synced to disk) and applied on the leader: `sequential/...`, one
//!   at a time (time per write), and `concurrent_64/...`, 64 spawned at once (time for all 64;
//!   throughput in writes). Each runs on three members writing MessagePack (`msgpack`, the
//!   registry's encoding) and then on three writing JSON (`json`, the encoding before it:
//!   `RegistryConfig::encoding`), in the same run. The encoding's own share:
//!   `entry_roundtrip/{msgpack,json}` encodes and decodes that write's raft entry once,
//!   `append_entries_64_roundtrip/{msgpack,json}` an AppendEntries of 64 such entries.
//! - `follower_catch_up`: three members, one follower stopped, ~100 MB written through the
//!   leader in 100 entries of ~1 MiB (one `Op::UpsertJob` each, a 1 MiB environment value,
//!   distinct job names so the state holds them all), the follower restarted on its data dir
//!   and address, and the clock run from its restart until it has applied the leader's last
//!   index. Target: under 10 s, with no election meanwhile (the leader's term is asserted
//!   unchanged). Each run takes tens of seconds to set up, and a fresh lag is needed for each,
//!   so it is measured once per snapshot policy, outside criterion's statistics, and printed
//!   (`follower_catch_up/...` lines on stderr; the line says which way the follower caught up
//!   and whether the 10 s target was met). The policies: `snapshot_after_50` (the timings and
//!   snapshot policy of `crates/muster-registry/tests/it/cluster.rs`: a snapshot every 50 entries,
//!   none kept behind it, so the leader has purged what the follower misses and sends its
//!   snapshot in 1 MiB chunks), and `snapshot_after_5000` (the master's policy: 5,000 entries,
//!   1,000 kept; the follower gets the missed log, an AppendEntries of at most 1 MiB at a
//!   time). Baseline of the same shape in the same run: the time the leader took to write
//!   those 100 MB to itself and the other follower (the `... baseline:` line after each),
//!   with its slowest write and any write it refused (the writes are setup: a refused one is
//!   written again through the leader of the moment). The three members share this process
//!   and its 2 worker threads, so one member's CPU-bound work (building or installing a
//!   ~100 MB snapshot) delays the others' heartbeats; a leader whose lease lapses stands by
//!   in its term (counted as `stood by`), which is not an election. Under `cargo test
//!   --benches` (criterion's test mode) it runs once with 8 entries.
//!
//! Run with `cargo bench --bench registry` (a few minutes), or one group with
//! `cargo bench --bench registry -- registry_codec`.
//!
//! Each group is in a module of its name; this file holds what they share: the entries, and a
//! group of three members.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use criterion::{
    BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group, criterion_main,
};
use futures_util::future::join_all;
use muster::actor::{Node, NodeConfig, System};
use muster::model::{
    AgentInfo, Constraint, ConstraintOp, EvalStatus, Evaluation, Job, Resources, SchedulerType,
    TaskGroup, Trigger,
};
use muster::registry::codec::{self, Encoding};
use muster::registry::types::{Batch, NodeId, TypeConfig};
use muster::registry::{Op, Outcome, RegistryConfig, RegistryError, RegistryNode};
use muster_security::Role;
use muster_security::testing::TestPki;
use openraft::raft::AppendEntriesRequest;
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, Vote};
use tokio::runtime::Runtime;
use tonic::service::Routes;

#[path = "registry/follower_catch_up.rs"]
mod follower_catch_up;
#[path = "registry/registry_codec.rs"]
mod registry_codec;
#[path = "registry/registry_write.rs"]
mod registry_write;

/// The allocator Muster's binaries use, so figures match them; the baselines use it too.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Entries in the AppendEntries of `registry_codec`.
const ENTRIES_PER_APPEND: usize = 64;

/// Writes spawned at once in `registry_write/concurrent_64`.
const CONCURRENT_WRITES: usize = 64;

/// The entries a follower misses in `follower_catch_up` (each ~1 MiB).
const CATCH_UP_ENTRIES: usize = 100;

/// The size of the environment value of each job written in `follower_catch_up`.
const CATCH_UP_ENTRY_BYTES: usize = 1024 * 1024;

/// How long a follower may take to catch up.
const CATCH_UP_TARGET: Duration = Duration::from_secs(10);

/// How long the setup steps may take before the bench gives up.
const DEADLINE: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// What the entries carry.

/// `len` characters of base64-like text, from `rng`.
fn text(rng: &mut fastrand::Rng, len: usize) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    (0..len)
        .map(|_| char::from(ALPHABET[rng.usize(..ALPHABET.len())]))
        .collect()
}

/// A PEM bundle of `certificates`, as a job passes a CA bundle in its environment: lines of 64
/// characters, newlines included (JSON writes each as `\n`).
fn pem(rng: &mut fastrand::Rng, certificates: usize) -> String {
    let mut pem = String::new();
    for _ in 0..certificates {
        pem.push_str("-----BEGIN CERTIFICATE-----\n");
        for _ in 0..10 {
            pem.push_str(&text(rng, 64));
            pem.push('\n');
        }
        pem.push_str("-----END CERTIFICATE-----\n");
    }
    pem
}

/// One task group of job `job`: a service with arguments, a constraint and a few KiB of
/// environment (plain settings, a JSON config, a PEM bundle).
fn task_group(rng: &mut fastrand::Rng, job: usize, group: usize) -> TaskGroup {
    let mut env = BTreeMap::from([
        ("RUST_LOG".to_owned(), "info,hyper=warn".to_owned()),
        ("PORT".to_owned(), format!("{}", 8000 + group)),
        (
            "DATABASE_URL".to_owned(),
            format!(
                "postgres://svc-{job}:{}@db-{group}.internal:5432/app",
                text(rng, 24)
            ),
        ),
        (
            "APP_CONFIG".to_owned(),
            format!(
                "{{\"service\":\"job-{job}-{group}\",\"features\":{{\"cache\":true,\"tracing\":\
                 \"sampled\",\"rate\":0.25}},\"upstreams\":[\"http://a.internal:80\",\
                 \"http://b.internal:80\"],\"token\":\"{}\"}}",
                text(rng, 96)
            ),
        ),
        ("CA_BUNDLE".to_owned(), pem(rng, 2)),
    ]);
    for n in 0..12 {
        env.insert(format!("SETTING_{n}"), text(rng, 32));
    }
    TaskGroup {
        gang: false,
        update: None,
        restart: None,
        reschedule: None,
        checks: Vec::new(),
        kill_signal: None,
        kill_timeout_ms: None,
        max_run_duration_ms: None,
        ports: Default::default(),
        name: format!("group-{group}"),
        count: 3 + group as u32,
        resources: Resources {
            cpus: 0.5,
            mem_mb: 512,
        },
        command: "/usr/local/bin/service".into(),
        args: vec![
            "--listen".into(),
            format!("0.0.0.0:{}", 8000 + group),
            "--config".into(),
            "/etc/service/config.toml".into(),
            "--log-format".into(),
            "json".into(),
            format!("--instance=job-{job}-{group}"),
        ],
        env,
        constraints: vec![Constraint {
            attribute: "rack".into(),
            op: ConstraintOp::NotEqual,
            value: "r13".into(),
        }],
        spec_version: 0,
        user: "svc".into(),
        migrate_max_parallel: 1,
        disconnect: Default::default(),
        affinities: Vec::new(),
        spreads: Vec::new(),
    }
}

/// Job `n`: three task groups (about 6 KiB in all).
fn job(rng: &mut fastrand::Rng, n: usize) -> Job {
    Job {
        name: format!("job-{n}"),
        priority: 50,
        scheduler: SchedulerType::Service,
        named_scheduler: None,
        groups: (0..3).map(|g| task_group(rng, n, g)).collect(),
        stopped: false,
        version: 0,
    }
}

/// A raft entry at `index` of the leader `leader` in `term` carrying `ops`.
fn entry(term: u64, leader: NodeId, index: u64, ops: Vec<Op>) -> Entry<TypeConfig> {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(term, leader), index),
        payload: EntryPayload::Normal(Batch { ops }),
    }
}

/// An AppendEntries of `entries`, as the leader of `term` sends it.
fn append_entries(term: u64, entries: Vec<Entry<TypeConfig>>) -> AppendEntriesRequest<TypeConfig> {
    let first = entries.first().map_or(1, |e| e.log_id.index);
    AppendEntriesRequest {
        vote: Vote::new_committed(term, 1),
        prev_log_id: Some(LogId::new(CommittedLeaderId::new(term, 1), first - 1)),
        leader_commit: Some(LogId::new(CommittedLeaderId::new(term, 1), first - 1)),
        entries,
    }
}

/// The AppendEntries of `registry_codec`: [`ENTRIES_PER_APPEND`] entries, each a job
/// submission and its evaluations (one, or two for every fourth job: an evaluation it
/// replaces, cancelled).
fn job_submissions() -> AppendEntriesRequest<TypeConfig> {
    let mut rng = fastrand::Rng::with_seed(7);
    let entries = (0..ENTRIES_PER_APPEND)
        .map(|n| {
            let job = job(&mut rng, n);
            let index = 1_000 + n as u64;
            let mut evals = vec![Evaluation::new(&job, Trigger::JobRegister)];
            if n % 4 == 0 {
                let mut old = Evaluation::new(&job, Trigger::Reconcile);
                old.status = EvalStatus::Canceled;
                old.status_description = "superseded by a newer evaluation of the job".into();
                old.create_index = index - 100;
                evals.push(old);
            }
            for eval in &mut evals {
                eval.modify_index = index;
                eval.create_index = eval.create_index.max(index);
            }
            entry(
                3,
                1,
                index,
                vec![Op::UpsertJob(job), Op::UpsertEvals(evals)],
            )
        })
        .collect();
    append_entries(3, entries)
}

/// Agent `n`, as an agent registers.
fn agent(n: usize) -> AgentInfo {
    AgentInfo {
        dynamic_ports: Default::default(),
        hostname: format!("agent-host-{n}.dc1.internal"),
        address: format!("agent@10.0.{}.{}:5051", (n / 250) % 250, n % 250),
        resources: Resources {
            cpus: 16.0,
            mem_mb: 65_536,
        },
        attributes: BTreeMap::from([
            ("rack".to_owned(), format!("r{}", n % 40)),
            ("zone".to_owned(), format!("zone-{}", n % 3)),
            ("kernel".to_owned(), "6.8.0".to_owned()),
        ]),
        identity: format!("agent-{n}"),
    }
}

/// The batch of one `registry_write` write.
fn admit(n: usize) -> Batch {
    Batch {
        ops: vec![Op::AdmitAgent(agent(n))],
    }
}

// ---------------------------------------------------------------------------------------------
// A group of three members, as crates/muster-registry/tests/it/cluster.rs runs it.

/// One member: its raft and the tonic server that carries its raft traffic.
struct Member {
    registry: RegistryNode,
    server: Node,
}

impl Member {
    async fn stop(self) {
        self.registry.shutdown().await;
        self.server.shutdown();
    }
}

/// When members snapshot and purge their log.
#[derive(Clone, Copy, Debug)]
enum Snapshots {
    /// tests/it/cluster.rs's: every 50 entries, none kept behind the snapshot.
    After50,
    /// The master's (`MasterServer`) and `RegistryConfig::single`'s: every 5,000 entries,
    /// 1,000 kept.
    After5000,
}

impl Snapshots {
    fn name(self) -> &'static str {
        match self {
            Snapshots::After50 => "snapshot_after_50",
            Snapshots::After5000 => "snapshot_after_5000",
        }
    }
}

/// Member `id`'s config: `RegistryConfig::single` adjusted as tests/it/cluster.rs does (its
/// heartbeat and election timeouts; its snapshot policy, or the master's).
fn config(
    id: NodeId,
    members: &BTreeMap<NodeId, String>,
    dir: &Path,
    snapshots: Snapshots,
) -> RegistryConfig {
    let security = TestPki::shared().security(Role::Master, &format!("master-{id}"));
    let mut config = RegistryConfig::single(id, "unused", dir.join(format!("m{id}")), security);
    config.members = members.clone();
    config.heartbeat_interval = Duration::from_millis(50);
    config.election_timeout = (Duration::from_millis(200), Duration::from_millis(400));
    if let Snapshots::After50 = snapshots {
        config.snapshot_after_entries = 50;
        config.entries_kept_after_snapshot = 0;
    }
    config
}

/// Starts member `id`, binding its address (again, after a stop, once the old server and
/// store have let go).
async fn start(system: &System, config: RegistryConfig) -> Member {
    let address = config.members[&config.id].clone();
    let node_config = NodeConfig::new(config.security.clone());
    let deadline = Instant::now() + DEADLINE;
    let registry = loop {
        match RegistryNode::start(config.clone()).await {
            Ok(registry) => break registry,
            // The stopped member's store closes once its last handle is dropped.
            Err(RegistryError::Store(_)) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(e) => panic!("member {} did not start: {e}", config.id),
        }
    };
    let listener = loop {
        match Node::listen(&address).await {
            Ok(listener) => break listener,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(e) => panic!("member {} could not bind {address}: {e}", config.id),
        }
    };
    let routes = Routes::new(registry.raft_service());
    let server = Node::serve(system, listener, node_config, routes).expect("serves");
    Member { registry, server }
}

/// Three members on free loopback ports, data under `dir`.
async fn three_members(
    system: &System,
    dir: &Path,
    snapshots: Snapshots,
) -> (BTreeMap<NodeId, String>, BTreeMap<NodeId, Member>) {
    three_members_writing(system, dir, snapshots, Encoding::MessagePack).await
}

/// As [`three_members`], each member writing its store and raft requests in `encoding`.
async fn three_members_writing(
    system: &System,
    dir: &Path,
    snapshots: Snapshots,
    encoding: Encoding,
) -> (BTreeMap<NodeId, String>, BTreeMap<NodeId, Member>) {
    let mut addresses = BTreeMap::new();
    for id in 1..=3 {
        let listener = Node::listen("127.0.0.1:0").await.expect("a free port");
        addresses.insert(id, listener.local_addr().to_string());
    }
    let mut members = BTreeMap::new();
    for &id in addresses.keys() {
        let mut config = config(id, &addresses, dir, snapshots);
        config.encoding = encoding;
        members.insert(id, start(system, config).await);
    }
    (addresses, members)
}

/// Waits until a member leads and the others agree on it.
async fn leader(members: &BTreeMap<NodeId, Member>) -> NodeId {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let views: Vec<_> = members
            .values()
            .map(|m| m.registry.leadership().borrow().clone())
            .collect();
        let leader_of = |v: &muster::registry::Leadership| v.leader.as_ref().map(|(id, _)| *id);
        let claimed = views.iter().find(|v| v.is_self).and_then(leader_of);
        if let Some(id) = claimed
            && views.iter().all(|v| leader_of(v) == Some(id))
        {
            return id;
        }
        assert!(
            Instant::now() < deadline,
            "no leader agreed on within {DEADLINE:?}: {views:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn term_of(registry: &RegistryNode) -> u64 {
    registry.raft().metrics().borrow().current_term
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Whether criterion's command line selects any of the benchmarks `names`: no filter, or a
/// filter that is part of a name (criterion's filter is a regex; a plain substring is what
/// this recognises), and not `--list`. For the work done outside criterion's benchmarks
/// (setup, printed sizes, the catch-up runs).
fn selected(names: &[&str]) -> bool {
    // criterion's options that take a value.
    const WITH_VALUE: &[&str] = &[
        "-s",
        "--save-baseline",
        "-b",
        "--baseline",
        "--baseline-lenient",
        "--load-baseline",
        "-c",
        "--color",
        "--sample-size",
        "--warm-up-time",
        "--measurement-time",
        "--nresamples",
        "--noise-threshold",
        "--confidence-level",
        "--significance-level",
        "--profile-time",
        "--plotting-backend",
        "--output-format",
        "--format",
    ];
    let mut filters = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--list" {
            return false;
        }
        if WITH_VALUE.contains(&arg.as_str()) {
            args.next();
        } else if !arg.starts_with('-') {
            filters.push(arg);
        }
    }
    filters.is_empty()
        || filters
            .iter()
            .any(|f| names.iter().any(|name| name.contains(f.as_str())))
}

criterion_group!(
    benches,
    registry_codec::registry_codec,
    registry_write::registry_write,
    follower_catch_up::follower_catch_up
);
criterion_main!(benches);
