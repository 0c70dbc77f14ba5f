//! Your own scheduler, in your own program: it places each task on the agent that runs the
//! fewest tasks, and talks to the leading master over gRPC.
//!
//! A job says which scheduler plans it: `scheduler = "fewest-tasks"` in its file, or none for
//! its type's built-in one (`service`, `batch`, `system`), which the master's own workers
//! serve. This program serves the names given with `--scheduler` (by default
//! `fewest-tasks`), so it runs beside the built-in workers, each planning only its own jobs.
//! In one terminal:
//!
//! ```text
//! cargo run -- dev
//! ```
//!
//! In another (as many `--master` as you have masters; a standby sends the workers on to the
//! leader):
//!
//! ```text
//! cargo run --example custom_scheduler -- --master 127.0.0.1:5050 --workers 2
//! ```
//!
//! (`cargo run --example custom_scheduler -- --help` lists the flags.) In a third, submit a job
//! that names this scheduler, and watch it:
//!
//! ```text
//! cargo run -- job run examples/jobs/fewest-tasks.toml
//! cargo run -- job status fewest-tasks
//! ```
//!
//! This program
//! prints each choice its placer makes and how each evaluation ended. Stop it with Ctrl-C: a
//! job that names it then stays pending, and `muster eval list` says that no scheduler of that
//! name is connected, until it runs again. To take over the built-in schedulers' jobs too, run
//! the master with `--workers 0` and this program with `--scheduler service --scheduler batch
//! --scheduler system`.
//!
//! How it fits together: for every change to a job the master makes an *evaluation* and queues
//! it in its broker. A [`Worker`] takes one (`dequeue`), gets a snapshot of the cluster, and asks
//! its scheduler for a plan. [`PlacingScheduler`] does the bookkeeping (which of the job's task
//! slots are missing, which tasks must stop, which agents have room and meet the constraints)
//! and asks the placer below to choose an agent for each missing slot. The worker sends the plan
//! to the leading master, whose plan applier commits what still fits (another scheduler may
//! have taken the room meanwhile: then the worker plans again), and settles the evaluation.
//! [`RemoteBackend`] is the worker's way to the master: gRPC on the master's port.

use std::time::Duration;

use clap::Parser;
use muster::launch::security::ClientFlags;
use muster::model::AgentId;
use muster::scheduler::{
    Candidate, Outcome, PlacingScheduler, RemoteBackend, Scheduler, SlotRequest, Worker,
    WorkerConfig, WorkerStats,
};
use tokio::sync::watch;

/// The one decision this scheduler makes: of the agents the task fits on (`candidates`, never
/// empty, ordered by id), take the one with the fewest live tasks, counting those this plan
/// already put there. Returning `None` would leave the slot unplaced.
fn fewest_tasks(slot: &SlotRequest, candidates: &[Candidate<'_>]) -> Option<AgentId> {
    let chosen = candidates.iter().min_by_key(|candidate| candidate.tasks)?;
    let others: Vec<String> = candidates
        .iter()
        .map(|c| format!("{} has {}", c.id(), c.tasks))
        .collect();
    println!(
        "placing {} on {} ({})",
        slot.name,
        chosen.id(),
        others.join(", ")
    );
    Some(chosen.id().clone())
}

/// One worker: take an evaluation, settle it, print how it ended; until told to stop.
async fn work<S: Scheduler>(
    number: usize,
    mut worker: Worker<RemoteBackend, S>,
    mut stop: watch::Receiver<bool>,
) -> WorkerStats {
    while !*stop.borrow_and_update() {
        // Waits up to the dequeue timeout (1 s) for an evaluation; stopping takes effect
        // between evaluations, never in the middle of one.
        match worker.run_once().await {
            Ok(None) => {}
            Ok(Some(Outcome::Completed {
                eval,
                placed,
                stopped,
                ..
            })) => println!(
                "worker {number}: evaluation {eval} complete: {placed} placed, {stopped} stopped"
            ),
            Ok(Some(Outcome::Blocked {
                eval,
                placed,
                unplaced,
                ..
            })) => println!(
                "worker {number}: evaluation {eval} blocked: {placed} placed, {} group(s) wait for room",
                unplaced.len()
            ),
            Ok(Some(Outcome::Nacked { eval, error })) => {
                println!("worker {number}: evaluation {eval} handed back: {error}");
            }
            Err(error) => {
                // No master reachable, or no leader yet: try again shortly.
                eprintln!("worker {number}: {error}");
                tokio::select! {
                    _ = stop.changed() => {}
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        }
    }
    worker.stats().clone()
}

/// Schedules a Muster cluster's jobs from its own program: each task goes to the agent that
/// runs the fewest tasks.
#[derive(Debug, Parser)]
#[command(name = "custom_scheduler", long_about = None)]
struct Cli {
    /// A master's address; repeat for each master (a standby sends the workers on to the
    /// leader).
    #[arg(
        long = "master",
        value_name = "HOST:PORT",
        default_value = "127.0.0.1:5050"
    )]
    masters: Vec<String>,
    /// How many workers to run.
    #[arg(long, value_name = "N", default_value_t = 2)]
    workers: usize,
    /// A scheduler name to serve (jobs name it with `scheduler = "…"`); repeat for more. The
    /// token's policy must allow each (`[scheduler] names`).
    #[arg(
        long = "scheduler",
        value_name = "NAME",
        default_value = "fewest-tasks"
    )]
    schedulers: Vec<String>,
    /// TLS and token (MUSTER_CACERT, MUSTER_CLIENT_CERT, MUSTER_CLIENT_KEY, MUSTER_TOKEN with
    /// policy `schedule`).
    #[command(flatten)]
    client: ClientFlags,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let Cli {
        masters,
        workers: count,
        schedulers,
        client,
    } = Cli::parse();
    muster::launch::init_logging_with("error");

    // Connects lazily: the masters need not be up yet. The workers share its connections.
    let backend = RemoteBackend::connect(masters.clone(), client.security()?, client.token())?;
    let (stop, stopped) = watch::channel(false);
    let mut running = Vec::new();
    for number in 1..=count {
        let scheduler = PlacingScheduler::from_fn("fewest-tasks", fewest_tasks);
        // Only the named schedulers' evaluations; up to 3 plans per evaluation when
        // placements are rejected.
        let config = WorkerConfig::serving(schedulers.iter().cloned());
        let worker = Worker::new(backend.clone(), scheduler, config);
        running.push(tokio::spawn(work(number, worker, stopped.clone())));
    }
    println!(
        "{count} fewest-tasks worker(s) serving {} for {}; Ctrl-C stops",
        schedulers.join(", "),
        masters.join(", ")
    );

    tokio::signal::ctrl_c().await?;
    println!("stopping after the evaluations in progress");
    let _ = stop.send(true);
    for (number, worker) in (1..).zip(running) {
        let stats = worker.await?;
        println!(
            "worker {number}: {} evaluations, {} placements committed, {} rejected",
            stats.dequeued, stats.placements_committed, stats.placements_rejected
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::error::ErrorKind;
    use clap::{CommandFactory as _, Parser as _};

    use super::Cli;

    #[test]
    fn help_is_the_usage() {
        Cli::command().debug_assert();
        let help =
            Cli::try_parse_from(["custom_scheduler", "--help"]).expect_err("--help is not a run");
        assert_eq!(help.kind(), ErrorKind::DisplayHelp);
        let text = help.to_string();
        assert!(text.contains("fewest tasks"), "{text}");
        assert!(text.contains("--master <HOST:PORT>"), "{text}");
        assert!(text.contains("--workers <N>"), "{text}");
    }

    #[test]
    fn masters_and_workers_have_defaults_and_repeat() -> Result<(), clap::Error> {
        let cli = Cli::try_parse_from(["custom_scheduler"])?;
        assert_eq!(cli.masters, ["127.0.0.1:5050"]);
        assert_eq!(cli.workers, 2);
        assert_eq!(cli.schedulers, ["fewest-tasks"]);
        let cli = Cli::try_parse_from([
            "custom_scheduler",
            "--master",
            "10.0.0.1:5050",
            "--master",
            "10.0.0.2:5050",
            "--workers",
            "4",
            "--scheduler",
            "gang",
            "--scheduler",
            "service",
        ])?;
        assert_eq!(cli.masters, ["10.0.0.1:5050", "10.0.0.2:5050"]);
        assert_eq!(cli.workers, 4);
        assert_eq!(cli.schedulers, ["gang", "service"]);
        let bad = Cli::try_parse_from(["custom_scheduler", "--workers", "many"])
            .expect_err("not a number");
        assert_eq!(bad.kind(), ErrorKind::ValueValidation);
        Ok(())
    }
}
