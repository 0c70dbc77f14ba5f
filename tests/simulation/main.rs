//! The deterministic simulation: a whole Muster cluster in one process, under a simulated
//! network and clock (turmoil), with faults, checked against invariants.
//!
//! Each seed builds three masters (the real master: registry on openraft, broker, workers,
//! plan applier; its store on an in-memory disk that keeps only what was flushed when the
//! host dies), three agents (the real agent, with simulated tasks), three clients submitting,
//! scaling, updating, stopping and reading service and batch jobs (see `workload`), and a
//! nemesis (see `faults`) that, all from the seed:
//! - partitions the leader, a master, an agent or a minority, and pauses the leader;
//! - cuts a follower off from everything for several election timeouts, alone (no other
//!   fault around it);
//! - cuts the leader from some agents for longer than its heartbeat deadline (they are marked
//!   unreachable and come back);
//! - crashes and restarts masters, agents' machines and agent processes, the latter also
//!   right after a submission or a launch (launches in flight);
//! - slows the network, and makes clients submit large jobs (hundreds of KiB, up to near the
//!   1 MiB job limit) for a while;
//! - in a third of the seeds, grows the group to five masters (two join) and shrinks it back
//!   to three through the operator API (see `membership`).
//!
//! Then it heals everything and checks:
//! - reads linearizable and no acknowledged write lost (stateright's checker);
//! - at most one leader per term;
//! - no agent obeys a command of a lower term after one of a higher term;
//! - once healed, every job converges to its count (a batch job: every slot finished, none
//!   running) within a bound, no slot runs twice, and every evaluation ends (complete, failed
//!   or canceled);
//! - never two evaluations of one job in flight at once;
//! - each batch slot ran once: it starts again only if every earlier run of it ended without
//!   finishing (counted on the agents' machines), whatever the clients did meanwhile;
//! - nothing acknowledged and never run: every batch job the clients left submitted has run
//!   every slot to completion;
//! - no task killed unless replaced: a task a master kills either was changed by a client
//!   (stopped, scaled away, redefined) or has another copy of its slot running (or starting
//!   right after);
//! - no leader deposed by a member that rejoins: a follower cut off alone never rises above the
//!   cluster's raft term, and the leader at its heal keeps leading.
//!
//! Same seed, same run: the network, the clock, every `HashMap`'s order and every random
//! choice come from the seed. A failing seed prints its event trace and the command that
//! replays it.
//!
//! ```text
//! cargo test --test simulation                                   # 10 seeds (debug build)
//! cargo test --profile bench --test simulation -- --seeds 200    # what CI runs
//! cargo test --profile bench --test simulation -- --seeds 10000  # a long run
//! cargo test --test simulation -- --seed 42 --trace              # one seed, with its trace
//! ```

mod check;
mod cluster;
mod faults;
mod membership;
mod net;
mod random;
mod record;
mod workload;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, UNIX_EPOCH};

use muster_agent::simulated::SimulatedTasks;
use muster_proto::model as model_pb;
use muster_registry::MemoryDisk;

use crate::cluster::{AgentHost, MasterHost};
use crate::record::Record;
use crate::workload::Client;

/// How far a message may be delayed when the network is not slowed.
pub(crate) const MAX_LATENCY: Duration = Duration::from_millis(10);
/// One step of simulated time.
const TICK: Duration = Duration::from_millis(5);
/// Faults from here...
const FAULTS_FROM: Duration = Duration::from_secs(3);
/// ... until here, when every fault is undone.
const HEAL_AT: Duration = Duration::from_secs(20);
/// Clients stop starting operations here.
const CLIENTS_UNTIL: Duration = Duration::from_secs(19);
/// Once healed, the cluster has this long to converge.
const CONVERGE_WITHIN: Duration = Duration::from_secs(60);
/// The simulation gives up here.
const SIM_LIMIT: Duration = Duration::from_secs(120);
const MASTERS: usize = 3;
const AGENTS: usize = 3;
const CLIENTS: u64 = 3;
const JOBS: usize = 8;

struct Options {
    seeds: Vec<u64>,
    threads: usize,
    trace: bool,
    /// Internal: run this one seed in this process and print its outcome for the parent.
    child: Option<u64>,
}

fn options() -> Result<Options, String> {
    // A debug build runs about five times slower: `cargo test --workspace` runs a few seeds,
    // CI runs 200 optimised (`.ci/run`).
    let mut count = if cfg!(debug_assertions) { 10 } else { 200 };
    let mut first = 1;
    let mut one = None;
    let mut child = None;
    let mut threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut trace = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut number = |name: &str| -> Result<u64, String> {
            let value = args.next().ok_or(format!("{name} needs a number"))?;
            value
                .parse()
                .map_err(|_| format!("{name} needs a number, not {value:?}"))
        };
        match arg.as_str() {
            "--seeds" => count = number("--seeds")?,
            "--first-seed" => first = number("--first-seed")?,
            "--seed" => one = Some(number("--seed")?),
            "--threads" => threads = usize::try_from(number("--threads")?.max(1)).unwrap_or(1),
            "--trace" => trace = true,
            "--child-seed" => child = Some(number("--child-seed")?),
            // Whatever else `cargo test` passes every test binary (filters, --nocapture).
            _ => {}
        }
    }
    let seeds = match one {
        Some(seed) => vec![seed],
        None => (first..first + count).collect(),
    };
    Ok(Options {
        seeds,
        threads,
        trace,
        child,
    })
}

/// The simulated wall clock: the simulation's epoch plus its elapsed time, inside the
/// simulation; the system's elsewhere.
fn simulated_unix_ms() -> u64 {
    turmoil::since_epoch().map_or_else(muster_model::clock::system_unix_ms, |d| {
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
    })
}

/// What one seed's run found.
#[derive(Debug, Default)]
struct Outcome {
    seed: u64,
    problems: Vec<String>,
    inconclusive: Vec<String>,
    trace: Vec<String>,
    operations: usize,
    faults: usize,
}

impl Outcome {
    /// The lines a child prints for its parent.
    fn print(&self) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "STATS\t{}\t{}", self.operations, self.faults);
        for (kind, lines) in [
            ("PROBLEM", &self.problems),
            ("INCONCLUSIVE", &self.inconclusive),
            ("TRACE", &self.trace),
        ] {
            for line in lines {
                let _ = writeln!(out, "{kind}\t{line}");
            }
        }
    }

    /// Reads what a child printed.
    fn parse(seed: u64, printed: &str) -> Outcome {
        let mut outcome = Outcome {
            seed,
            ..Outcome::default()
        };
        for line in printed.lines() {
            let Some((kind, rest)) = line.split_once('\t') else {
                continue;
            };
            match kind {
                "STATS" => {
                    let mut numbers = rest.split('\t').map(|n| n.parse().unwrap_or(0));
                    outcome.operations = numbers.next().unwrap_or(0);
                    outcome.faults = numbers.next().unwrap_or(0);
                }
                "PROBLEM" => outcome.problems.push(rest.to_owned()),
                "INCONCLUSIVE" => outcome.inconclusive.push(rest.to_owned()),
                "TRACE" => outcome.trace.push(rest.to_owned()),
                _ => {}
            }
        }
        outcome
    }
}

/// Runs `seed` in a child process of this binary: each run starts from the same process
/// state (tokio seeds its schedulers from a process-wide counter, among others), so the same
/// seed runs the same way every time.
fn run_in_child(seed: u64) -> Outcome {
    let output = std::env::current_exe().and_then(|exe| {
        std::process::Command::new(exe)
            .args(["--child-seed", &seed.to_string()])
            .stderr(std::process::Stdio::null())
            .output()
    });
    match output {
        Ok(output) if output.status.success() => {
            Outcome::parse(seed, &String::from_utf8_lossy(&output.stdout))
        }
        Ok(output) => {
            let mut outcome = Outcome::parse(seed, &String::from_utf8_lossy(&output.stdout));
            outcome
                .problems
                .push(format!("the run's process failed: {}", output.status));
            outcome
        }
        Err(e) => Outcome {
            seed,
            problems: vec![format!("cannot start the run's process: {e}")],
            ..Outcome::default()
        },
    }
}

fn main() -> ExitCode {
    let options = match options() {
        Ok(options) => options,
        Err(e) => {
            eprintln!("simulation: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(seed) = options.child {
        return run_child(seed);
    }

    let started = Instant::now();
    let seeds = Arc::new(options.seeds.clone());
    let next = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..options.threads.min(seeds.len()).max(1))
        .map(|_| {
            let seeds = Arc::clone(&seeds);
            let next = Arc::clone(&next);
            std::thread::spawn(move || {
                let mut outcomes = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst) as usize;
                    let Some(&seed) = seeds.get(i) else {
                        return outcomes;
                    };
                    let started = Instant::now();
                    let outcome = run_in_child(seed);
                    eprintln!(
                        "seed {seed}: {} in {:.1}s",
                        if outcome.problems.is_empty() {
                            "ok"
                        } else {
                            "FAILED"
                        },
                        started.elapsed().as_secs_f64()
                    );
                    outcomes.push(outcome);
                }
            })
        })
        .collect();
    let mut outcomes: Vec<Outcome> = workers
        .into_iter()
        .flat_map(|w| w.join().unwrap_or_default())
        .collect();
    outcomes.sort_by_key(|o| o.seed);

    // Same seed, same run: the first seed again, compared line by line.
    let mut failed = 0;
    if let Some(first) = outcomes.first() {
        let again = run_in_child(first.seed);
        if again.trace != first.trace {
            failed += 1;
            let at = first
                .trace
                .iter()
                .zip(&again.trace)
                .position(|(a, b)| a != b)
                .unwrap_or(first.trace.len().min(again.trace.len()));
            eprintln!(
                "seed {}: a second run of the same seed diverged at trace line {at}:\n  first:  {}\n  second: {}",
                first.seed,
                first.trace.get(at).map_or("(end)", String::as_str),
                again.trace.get(at).map_or("(end)", String::as_str),
            );
        }
    }
    for outcome in &outcomes {
        if options.trace || !outcome.problems.is_empty() {
            eprintln!("---- seed {} trace ----", outcome.seed);
            for line in &outcome.trace {
                eprintln!("{line}");
            }
        }
        for note in &outcome.inconclusive {
            eprintln!("seed {}: {note}", outcome.seed);
        }
        if !outcome.problems.is_empty() {
            failed += 1;
            eprintln!("seed {} FAILED:", outcome.seed);
            for problem in &outcome.problems {
                eprintln!("  - {problem}");
            }
            eprintln!(
                "  replay: cargo test --test simulation -- --seed {} --trace",
                outcome.seed
            );
        }
    }
    let operations: usize = outcomes.iter().map(|o| o.operations).sum();
    let faults: usize = outcomes.iter().map(|o| o.faults).sum();
    let inconclusive = outcomes
        .iter()
        .filter(|o| !o.inconclusive.is_empty())
        .count();
    println!(
        "simulation: {} seeds, {failed} failed, {inconclusive} with a linearizability check left inconclusive; {operations} client operations checked, {faults} faults injected; {:.1}s",
        outcomes.len(),
        started.elapsed().as_secs_f64()
    );
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The child's side: one seed, its outcome printed.
fn run_child(seed: u64) -> ExitCode {
    random::seed_thread(seed);
    // `MUSTER_SIM_LOG=muster_master=debug simulation --child-seed 5`: one run's logs, to
    // stderr, for diagnosis (the parent discards its children's stderr).
    // A `Targets` filter, not an `EnvFilter`: the latter builds hash maps as spans come and
    // go, which shifts the keys of the run's own maps and so its path; this one does not, and
    // a run with logs is the run without.
    if let Ok(filter) = std::env::var("MUSTER_SIM_LOG") {
        let targets: tracing_subscriber::filter::Targets = match filter.parse() {
            Ok(targets) => targets,
            Err(error) => {
                eprintln!("simulation: MUSTER_SIM_LOG={filter:?}: {error}");
                return ExitCode::FAILURE;
            }
        };
        use tracing_subscriber::layer::SubscriberExt as _;
        use tracing_subscriber::util::SubscriberInitExt as _;
        tracing_subscriber::registry()
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    .without_time(),
            )
            .with(targets)
            .init();
    }
    if muster_security::net::install(Arc::new(net::Simulated)).is_err()
        || muster_model::clock::install(simulated_unix_ms).is_err()
    {
        eprintln!("simulation: the network or clock was chosen before the simulation started");
        return ExitCode::FAILURE;
    }
    let outcome = run(seed);
    outcome.print();
    // Checker threads given up on may still run: end the process, not just main.
    std::process::exit(0);
}

/// One seed's run.
fn run(seed: u64) -> Outcome {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut sim = turmoil::Builder::new()
        .rng_seed(seed)
        .epoch(UNIX_EPOCH + Duration::from_secs(1_800_000_000))
        .simulation_duration(SIM_LIMIT)
        .tick_duration(TICK)
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(MAX_LATENCY)
        .build();
    let record = Record::default();
    // Each master's election timeout is fixed for the run (see `MasterHost`), so they must
    // differ by more than an election's round trip, or two could split the vote forever: a
    // seeded order, 300 ms apart, with some jitter.
    let mut order: Vec<u64> = (0..MASTERS as u64).collect();
    rng.shuffle(&mut order);
    let masters: Vec<MasterHost> = (1..=MASTERS as u64)
        .zip(order)
        .map(|(id, rank)| MasterHost {
            name: format!("m{id}"),
            id,
            disk: MemoryDisk::default(),
            election_timeout: Duration::from_millis(400 + 300 * rank + rng.u64(0..100)),
            joins_at: None,
        })
        .collect();

    let dirs = match (0..AGENTS)
        .map(|_| tempfile::tempdir())
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(dirs) => dirs,
        Err(e) => {
            return Outcome {
                seed,
                problems: vec![format!("no temporary directory: {e}")],
                ..Outcome::default()
            };
        }
    };
    let agents: Vec<AgentHost> = dirs
        .into_iter()
        .enumerate()
        .map(|(i, dir)| AgentHost {
            name: format!("a{}", i + 1),
            tasks: SimulatedTasks::new(record::now),
            dir: Arc::new(dir),
        })
        .collect();

    for master in &masters {
        let (host, all, record) = (master.clone(), masters.clone(), record.clone());
        sim.host(master.name.as_str(), move || {
            cluster::run_master(host.clone(), all.clone(), record.clone())
        });
    }
    if membership::changes_group(seed) {
        membership::join_and_leave(&mut sim, &masters, &record);
    }
    for agent in &agents {
        let (host, all, record) = (agent.clone(), masters.clone(), record.clone());
        sim.host(agent.name.as_str(), move || {
            cluster::run_agent(host.clone(), all.clone(), record.clone())
        });
    }
    {
        let (all, record) = (masters.clone(), record.clone());
        sim.client("setup", async move {
            let addresses = cluster::master_addresses(&all);
            let token = muster_master::testing::bootstrap(&addresses[0])
                .await
                .map_err(|e| e.to_string())?;
            record.set_token(token);
            record.log("ACLs bootstrapped");
            Ok(())
        });
    }
    for c in 0..CLIENTS {
        let (all, record) = (masters.clone(), record.clone());
        let client_seed = rng.u64(..);
        sim.client(format!("c{c}").as_str(), async move {
            let client = Client::new(cluster::master_addresses(&all), record);
            workload::run(client, client_seed, JOBS, c * 1_000, CLIENTS_UNTIL).await
        });
    }
    {
        let (all, agents, record) = (masters.clone(), agents.clone(), record.clone());
        sim.client("checker", async move {
            converge(all, agents, record).await;
            Ok(())
        });
    }

    let schedule = faults::schedule(&mut rng, MASTERS, AGENTS, FAULTS_FROM, HEAL_AT);
    let faults = schedule.len();
    let mut nemesis =
        faults::Nemesis::new(masters.clone(), agents.clone(), schedule, record.clone());
    let mut healed = false;
    let mut problems = Vec::new();
    loop {
        match sim.step() {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => {
                problems.push(format!("the simulation stopped: {e}"));
                break;
            }
        }
        let now = sim.elapsed();
        record::stepped(now);
        if now < HEAL_AT {
            nemesis.step(&mut sim, now);
        } else if !healed {
            nemesis.heal(&mut sim, now);
            healed = true;
        }
    }

    let terms: BTreeMap<String, Vec<u64>> = agents
        .iter()
        .map(|a| (a.name.clone(), a.tasks.obeyed_terms()))
        .collect();
    let machines: Vec<_> = agents
        .iter()
        .map(|a| (a.name.clone(), a.tasks.launches(), a.tasks.ends()))
        .collect();
    let kills: Vec<_> = agents
        .iter()
        .map(|a| (a.name.clone(), a.tasks.kills()))
        .collect();
    let runs = check::runs(&machines);
    let writes = record.writes();
    problems.extend(record.problems());
    problems.extend(check::one_leader_per_term(&record));
    problems.extend(check::terms_never_go_back(&terms));
    problems.extend(check::batch_slots_ran_once(&runs));
    problems.extend(check::batch_jobs_ran(&runs, &record.finals(), &writes));
    problems.extend(check::kills_replaced(&kills, &runs, &writes));
    problems.extend(check::rolls_replace_a_few_at_a_time(
        &kills,
        &runs,
        &writes,
        &record.faults(),
    ));
    problems.extend(check::rejoin_deposes_no_leader(
        &record.standings(),
        &record.faults(),
    ));
    let (not_linearizable, inconclusive) = check::linearizable(&record);
    problems.extend(not_linearizable);
    Outcome {
        seed,
        problems,
        inconclusive,
        trace: record.trace(),
        operations: record.ops().len(),
        faults,
    }
}

/// What the cluster asks for: per job, its count (0 if stopped or unknown), read
/// linearizably; and the evaluations that have not ended.
async fn desired(client: &mut Client) -> Option<(BTreeMap<String, u32>, Vec<String>)> {
    let mut wanted = BTreeMap::new();
    let mut unended = Vec::new();
    for j in 0..JOBS {
        let job = format!("job-{j}");
        let status = client.status(&job).await?;
        let count = match &status {
            None => 0,
            Some(reply) if reply.stopped => 0,
            Some(reply) => reply
                .job
                .as_ref()
                .and_then(|j| j.groups.first())
                .map_or(0, |g| g.count),
        };
        // A roll under way is work not done yet.
        if workload::is_rolled(&job) && client.deploying(&job).await? {
            unended.push(format!("the deployment of {job}"));
        }
        if let Some(reply) = &status {
            unended.extend(
                reply
                    .evals
                    .iter()
                    .filter(|e| {
                        !matches!(
                            model_pb::EvalStatus::try_from(e.status),
                            Ok(model_pb::EvalStatus::Complete
                                | model_pb::EvalStatus::Failed
                                | model_pb::EvalStatus::Canceled)
                        )
                    })
                    .map(|e| {
                        format!(
                            "{} of {} ({}: {})",
                            e.id, e.job, e.status, e.status_description
                        )
                    }),
            );
        }
        wanted.insert(job, count);
    }
    Some((wanted, unended))
}

/// How long the cluster has, after the watch, to be converged again (extra copies placed by
/// a leader that had not heard from every agent yet are stopped by its next reconciliation).
const RECONVERGE_WITHIN: Duration = Duration::from_secs(20);
/// How long a converged cluster is watched.
const STAYS_CONVERGED: Duration = Duration::from_secs(10);
/// How long a slot may run twice once the cluster has converged: one heartbeat deadline
/// (`heartbeat_min_ttl` plus `heartbeat_grace`). An agent cut off long enough to be marked
/// unreachable still runs the tasks that were replaced meanwhile until it hears so: its
/// heartbeat, waited for no longer than the TTL, fails, and its re-registration is answered
/// with the tasks to kill.
const TWICE_AT_MOST: Duration = Duration::from_secs(4);

/// The task definitions the final roll gives the rolled job: ones the workload never submits.
const FINAL_DEFINITIONS: [u64; 2] = [6, 7];

/// How many tasks the rolled job runs for the final roll.
const FINAL_COUNT: u32 = 3;

/// Rolls the first rolled service job (`wanted` gives each job's count) to a new task
/// definition, as a client thread of its own, with no fault in force, for
/// [`check::rolls_replace_a_few_at_a_time`]: first, if it runs fewer than [`FINAL_COUNT`]
/// tasks, to that count (`step` 0, not watched: new slots are not replacements); then at the
/// same count. Whether a submission was made (the caller then waits for the cluster to
/// converge again, and calls again with the next step).
async fn roll_once(client: &mut Client, wanted: &BTreeMap<String, u32>, step: &mut usize) -> bool {
    let Some(job) = wanted.keys().find(|job| workload::is_rolled(job)).cloned() else {
        return false;
    };
    let count = wanted.get(&job).copied().unwrap_or(0);
    if *step == 0 && count >= FINAL_COUNT {
        *step = 1;
    }
    let Some(&definition) = FINAL_DEFINITIONS.get(*step) else {
        return false;
    };
    *step += 1;
    let op = workload::JobOp::Submit(count.max(FINAL_COUNT), definition);
    client
        .perform(2_000_000, &job, op, workload::Shape::default())
        .await
}

/// Once converged, with no fault and no client left: watches for [`STAYS_CONVERGED`] that no
/// slot runs twice for longer than [`TWICE_AT_MOST`], and records a problem if one does. Tasks
/// may still be replaced meanwhile (a new leader that placed tasks before every agent
/// re-registered stops the extra copies it then sees): the caller checks that the cluster has
/// converged again after the watch. What changed goes into the trace.
async fn stays_converged(agents: &[AgentHost], record: &Record) {
    let running = || -> BTreeSet<(String, String)> {
        agents.iter().flat_map(|a| a.tasks.running()).collect()
    };
    let settled = running();
    for agent in agents {
        record.log(format!("{} runs {:?}", agent.name, agent.tasks.running()));
    }
    let until = record::now() + STAYS_CONVERGED;
    // Slot -> when it was first seen running twice, in the current stretch.
    let mut twice_since: BTreeMap<String, Duration> = BTreeMap::new();
    while record::now() < until {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = record::now();
        let names: Vec<String> = running().into_iter().map(|(_, name)| name).collect();
        let twice = check::duplicates(names.iter().map(String::as_str));
        twice_since.retain(|slot, _| twice.contains(slot));
        for slot in twice {
            let since = *twice_since.entry(slot.clone()).or_insert(now);
            if now.saturating_sub(since) > TWICE_AT_MOST {
                record.problem(format!(
                    "after converging, slot {slot} ran twice for over {TWICE_AT_MOST:?}"
                ));
                return;
            }
        }
    }
    let at_end = running();
    if at_end != settled {
        let gone: Vec<_> = settled.difference(&at_end).collect();
        let new: Vec<_> = at_end.difference(&settled).collect();
        record.log(format!(
            "after converging, tasks were replaced: gone {gone:?}, new {new:?}"
        ));
    }
}

/// After the heal: polls until every service job runs its count and every batch job has run
/// each slot of its count to completion (on the agents' machines) and runs nothing, with no
/// slot twice and every evaluation ended (then watches that it stays so), or records why not;
/// then reads every job once more into the checked history, and keeps what it read for the
/// checks of what ran.
async fn converge(masters: Vec<MasterHost>, agents: Vec<AgentHost>, record: Record) {
    tokio::time::sleep(HEAL_AT.saturating_sub(record::now())).await;
    let mut client = Client::new(cluster::master_addresses(&masters), record.clone());
    let mut deadline = HEAL_AT + CONVERGE_WITHIN;
    let mut last;
    let mut watched = false;
    let mut roll_step = 0;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        // What the agents run is sampled after the reads, which take simulated time: a
        // sample from before them could miss a copy started meanwhile.
        let desired = desired(&mut client).await;
        let running: Vec<String> = agents
            .iter()
            .flat_map(|a| a.tasks.running_names())
            .collect();
        let machines: Vec<_> = agents
            .iter()
            .map(|a| (a.name.clone(), a.tasks.launches(), a.tasks.ends()))
            .collect();
        let runs = check::runs(&machines);
        let now = record::now();
        let twice = check::duplicates(running.iter().map(String::as_str));
        let mut by_job: BTreeMap<String, u32> = BTreeMap::new();
        for name in &running {
            let job = name.split('.').next().unwrap_or_default().to_owned();
            *by_job.entry(job).or_default() += 1;
        }
        match desired {
            Some((wanted, unended)) => {
                let evals_done = unended.is_empty();
                let mismatched: Vec<String> = wanted
                    .iter()
                    .filter_map(|(job, &count)| {
                        let running = by_job.get(job).copied().unwrap_or(0);
                        if !workload::is_batch(job) {
                            return (running != count)
                                .then(|| format!("{job} runs {running} of {count}"));
                        }
                        // A batch job is done when each slot ran to completion and none runs.
                        let unfinished: Vec<String> = (0..count)
                            .map(|i| workload::slot(job, i))
                            .filter(|slot| {
                                !runs
                                    .get(slot)
                                    .is_some_and(|r| r.iter().any(check::Run::finished))
                            })
                            .collect();
                        (running != 0 || !unfinished.is_empty()).then(|| {
                            format!(
                                "batch {job} runs {running}, slots not finished: {unfinished:?}"
                            )
                        })
                    })
                    .collect();
                if mismatched.is_empty() && twice.is_empty() && evals_done {
                    record.log(format!(
                        "converged {:.1}s after the heal",
                        now.saturating_sub(HEAL_AT).as_secs_f64()
                    ));
                    // Once, with no fault left: a new definition of the rolled job, whose
                    // roll the deployment invariant then watches; then converged again.
                    if !watched && roll_once(&mut client, &wanted, &mut roll_step).await {
                        deadline = deadline.max(record::now() + RECONVERGE_WITHIN);
                        continue;
                    }
                    if watched {
                        break;
                    }
                    // Watched for a while, then converged again.
                    stays_converged(&agents, &record).await;
                    watched = true;
                    deadline = deadline.max(record::now() + RECONVERGE_WITHIN);
                    continue;
                }
                last = format!(
                    "not converged: {mismatched:?}; slots running twice: {twice:?}; evaluations not ended: {unended:?}"
                );
            }
            None => {
                last = format!(
                    "no master answered a linearizable read (last: {})",
                    client.last_error
                );
            }
        }
        if now >= deadline {
            for agent in &agents {
                record.log(format!("{} runs {:?}", agent.name, agent.tasks.running()));
            }
            let problem = format!(
                "{}s after the heal the cluster has not converged: {last}",
                CONVERGE_WITHIN.as_secs()
            );
            record.problem(problem);
            break;
        }
    }
    for j in 0..JOBS {
        let job = format!("job-{j}");
        let thread = 1_000_000 + j as u64;
        for _ in 0..10 {
            if let Some(ret) = client.perform_read(thread, &job).await {
                record.set_final(&job, ret);
                break;
            }
        }
    }
}
