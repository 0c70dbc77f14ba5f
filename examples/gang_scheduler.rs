//! A gang scheduler of your own: every missing task of a job goes onto agents with a given
//! attribute (`--attribute gpu=a100`), all of them in one plan or none, for jobs that name
//! it (`scheduler = "gang"`). Where `examples/custom_scheduler.rs` writes a *placer* (one
//! slot at a time, `PlacingScheduler` doing the rest), this writes a whole [`Scheduler`]:
//! what a training run or an MPI job needs, which gains nothing from some of its tasks.
//!
//! Run a dev cluster, this program, and a job that names `gang`:
//!
//! ```text
//! cargo run -- dev                                                  # paste its export lines
//! cargo run --example gang_scheduler -- --attribute os=linux       # in another terminal
//! cargo run -- job run examples/jobs/training.toml                  # in a third
//! ```
//!
//! Until every task fits, the job's evaluation waits (blocked), saying how many found room;
//! the master's blocked-queue releases it when the room seen since adds up to the whole job.
//! Only the facade crate `muster` is used, as a program outside this repository would.
//!
//! Kept short, it handles what a training job asks: one shape of task (its demand is the
//! first slot's), no ports, no `distinct_hosts`, no system jobs. The built-in schedulers do
//! all of that, gangs included (`gang = true`), when a job needs no placement of its own.

use std::time::Duration;

use clap::Parser;
use muster::model::{Demand, Evaluation, Resources};
use muster::scheduler::{
    AgentView, ClusterSnapshot, Plan, Scheduler, Worker, WorkerConfig, reconcile,
};
use tokio::sync::watch;

/// Places a job's missing tasks on agents whose attribute `key` is `value`, packing each agent
/// in id order, all of them or none; the plan is atomic, so the master commits it whole or not
/// at all.
struct Gang {
    key: String,
    value: String,
}

impl Scheduler for Gang {
    fn name(&self) -> &str {
        "gang"
    }

    fn schedule(&mut self, eval: &Evaluation, snapshot: &ClusterSnapshot) -> Plan {
        // Which slots are missing and which tasks must stop: shared by every scheduler.
        let reconciled = reconcile(eval, snapshot);
        let mut plan = Plan::empty(eval.id.clone(), &reconciled.job, snapshot.index);
        plan.job_version = reconciled.job_version;
        plan.stop = reconciled.stop;
        plan.atomic = true;
        // Each matching agent's free room, taken as slots are placed.
        let mut room: Vec<(&AgentView, Resources)> = snapshot
            .agents
            .iter()
            .filter(|agent| agent.eligible)
            .filter(|agent| agent.attributes.get(&self.key) == Some(&self.value))
            .map(|agent| (&**agent, agent.free()))
            .collect();
        for slot in &reconciled.missing {
            let need = slot.resources();
            let at = room
                .iter()
                .position(|(agent, free)| need.fits_in(free) && agent.admits(slot.constraints()));
            let Some(at) = at else { continue };
            let (agent, free) = &mut room[at];
            *free = free.saturating_sub(need);
            plan.place.push(slot.placement(agent.id.clone()));
        }
        let (wanted, fitting) = (reconciled.missing.len(), plan.place.len());
        if fitting < wanted {
            // Not all of it: none of it, and a demand the blocked-queue waits on.
            plan.place.clear();
            if let Some(slot) = reconciled.missing.first() {
                plan.unplaced.push(Demand {
                    resources: slot.resources().clone(),
                    constraints: slot.constraints().to_vec(),
                    over_quota: None,
                    gang: u32::try_from(wanted).unwrap_or(u32::MAX),
                    gang_fitting: u32::try_from(fitting).unwrap_or(u32::MAX),
                });
            }
        }
        plan
    }
}

/// Schedules the jobs that name a gang scheduler, all of each job's tasks at once.
#[derive(Debug, Parser)]
#[command(name = "gang_scheduler", long_about = None)]
struct Cli {
    /// A master's address; repeat for each master.
    #[arg(
        long = "master",
        value_name = "HOST:PORT",
        default_value = "127.0.0.1:5050"
    )]
    masters: Vec<String>,
    /// The attribute the agents must have, as KEY=VALUE.
    #[arg(long, value_name = "KEY=VALUE", value_parser = key_value)]
    attribute: (String, String),
    /// The scheduler name jobs give (`scheduler = "gang"`).
    #[arg(long, value_name = "NAME", default_value = "gang")]
    scheduler: String,
    /// TLS and token (MUSTER_CACERT, MUSTER_CLIENT_CERT, MUSTER_CLIENT_KEY, MUSTER_TOKEN).
    #[command(flatten)]
    client: muster::launch::security::ClientFlags,
}

fn key_value(text: &str) -> Result<(String, String), String> {
    let (key, value) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not KEY=VALUE"))?;
    Ok((key.to_owned(), value.to_owned()))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    muster::launch::init_logging_with("error");
    let backend = muster::scheduler::RemoteBackend::connect(
        cli.masters.clone(),
        cli.client.security()?,
        cli.client.token(),
    )?;
    let (key, value) = cli.attribute;
    println!(
        "gang scheduler {:?} placing on agents with {key}={value}",
        cli.scheduler
    );
    let config = WorkerConfig::serving([cli.scheduler]);
    let worker = Worker::new(backend, Gang { key, value }, config);
    let (stop, stopped) = watch::channel(false);
    let running = tokio::spawn(worker.run(stopped));
    tokio::signal::ctrl_c().await?;
    let _ = stop.send(true);
    let stats = tokio::time::timeout(Duration::from_secs(5), running).await??;
    println!(
        "{} evaluations, {} placements committed",
        stats.dequeued, stats.placements_committed
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use muster::model::{AgentId, Job, SchedulerType, TaskGroup, Trigger};

    use super::*;

    fn agent(id: &str, gpu: &str, cpus: f64) -> Arc<AgentView> {
        let attributes = BTreeMap::from([("gpu".to_owned(), gpu.to_owned())]);
        let total = Resources { cpus, mem_mb: 4096 };
        Arc::new(AgentView::new(
            AgentId(id.into()),
            attributes,
            total,
            Vec::<muster::scheduler::TaskView>::new(),
        ))
    }

    fn training(count: u32) -> Job {
        Job {
            name: "train".into(),
            priority: 50,
            scheduler: SchedulerType::Batch,
            named_scheduler: Some("gang".into()),
            groups: vec![TaskGroup {
                name: "workers".into(),
                count,
                resources: Resources {
                    cpus: 1.0,
                    mem_mb: 256,
                },
                command: "train".into(),
                ..TaskGroup::default()
            }],
            stopped: false,
            version: 1,
        }
    }

    fn plan(count: u32) -> Plan {
        let job = training(count);
        let snapshot = ClusterSnapshot {
            index: 1,
            agents: vec![
                agent("a", "a100", 2.0),
                agent("b", "none", 8.0),
                agent("c", "a100", 2.0),
            ],
            jobs: BTreeMap::from([(job.name.clone(), job.clone())]),
            ..ClusterSnapshot::default()
        };
        let mut gang = Gang {
            key: "gpu".into(),
            value: "a100".into(),
        };
        gang.schedule(&Evaluation::new(&job, Trigger::JobRegister), &snapshot)
    }

    #[test]
    fn all_of_a_job_goes_on_the_matching_agents_or_none_of_it() {
        let fits = plan(4);
        assert!(fits.atomic);
        let agents: Vec<&str> = fits.place.iter().map(|p| p.agent.0.as_str()).collect();
        assert_eq!(agents, ["a", "a", "c", "c"]);
        // Five do not fit on the two a100 agents (agent b has room, but no a100).
        let short = plan(5);
        assert!(short.place.is_empty());
        assert_eq!(
            (short.unplaced[0].gang, short.unplaced[0].gang_fitting),
            (5, 4)
        );
    }

    #[test]
    fn the_attribute_is_key_equals_value() {
        assert!(Cli::try_parse_from(["gang_scheduler", "--attribute", "gpu"]).is_err());
        let cli = Cli::try_parse_from(["gang_scheduler", "--attribute", "gpu=a100"]);
        assert_eq!(
            cli.map(|c| c.attribute).ok(),
            Some(("gpu".into(), "a100".into()))
        );
    }
}
