//! The nemesis: a seeded schedule of faults, applied between simulation steps, and the heal
//! that ends them.

use std::time::Duration;

use crate::cluster::{AgentHost, MasterHost};
use crate::record::Record;

/// One fault.
#[derive(Clone, Debug)]
pub(crate) enum Fault {
    /// Cut the current leader off from every other host.
    IsolateLeader,
    /// Cut one master off from every other host.
    IsolateMaster(usize),
    /// Cut one agent off from the masters.
    IsolateAgent(usize),
    /// Cut a minority (one master and one agent) off from the rest.
    Minority(usize, usize),
    /// Hold every message to and from the current leader: a paused process, whose peers'
    /// messages wait in its socket buffers and arrive all at once when it resumes.
    PauseLeader,
    /// The master's machine loses power; it restarts after a while with what its store had
    /// flushed.
    CrashMaster(usize),
    /// The agent process dies and restarts; its tasks keep running.
    RestartAgent(usize),
    /// The agent's machine crashes: its tasks die with it.
    CrashAgentMachine(usize),
    /// Messages between every pair of hosts take up to this long for a while.
    SlowNetwork(Duration),
}

/// A fault, when it starts and how long it lasts.
#[derive(Clone, Debug)]
pub(crate) struct Scheduled {
    /// When it starts.
    pub(crate) at: Duration,
    /// How long until it is undone.
    pub(crate) lasts: Duration,
    /// What it is.
    pub(crate) fault: Fault,
}

/// The faults of a run: one every 1 to 5 s from `start` until `end`, each lasting 0.5 to 8 s.
pub(crate) fn schedule(
    rng: &mut fastrand::Rng,
    masters: usize,
    agents: usize,
    start: Duration,
    end: Duration,
) -> Vec<Scheduled> {
    let mut faults = Vec::new();
    let mut at = start;
    while at < end {
        let fault = match rng.u32(..9) {
            0 => Fault::IsolateLeader,
            1 => Fault::IsolateMaster(rng.usize(..masters)),
            2 => Fault::IsolateAgent(rng.usize(..agents)),
            3 => Fault::Minority(rng.usize(..masters), rng.usize(..agents)),
            4 => Fault::PauseLeader,
            5 => Fault::CrashMaster(rng.usize(..masters)),
            6 => Fault::RestartAgent(rng.usize(..agents)),
            7 => Fault::CrashAgentMachine(rng.usize(..agents)),
            _ => Fault::SlowNetwork(Duration::from_millis(rng.u64(20..400))),
        };
        let lasts = Duration::from_millis(rng.u64(500..8_000));
        faults.push(Scheduled { at, lasts, fault });
        at += Duration::from_millis(rng.u64(1_000..5_000));
    }
    faults
}

/// The hosts a fault needs, and what is undone when.
pub(crate) struct Nemesis {
    masters: Vec<MasterHost>,
    agents: Vec<AgentHost>,
    pending: Vec<Scheduled>,
    undo: Vec<(Duration, Undo)>,
    record: Record,
}

#[derive(Debug)]
enum Undo {
    Repair(Vec<String>, Vec<String>),
    Release(Vec<String>, Vec<String>),
    Restart(String),
    Latency,
}

impl Nemesis {
    /// A nemesis that will inflict `schedule`.
    pub(crate) fn new(
        masters: Vec<MasterHost>,
        agents: Vec<AgentHost>,
        mut schedule: Vec<Scheduled>,
        record: Record,
    ) -> Self {
        schedule.reverse();
        Nemesis {
            masters,
            agents,
            pending: schedule,
            undo: Vec::new(),
            record,
        }
    }

    fn names(&self) -> Vec<String> {
        self.masters
            .iter()
            .map(|m| m.name.clone())
            .chain(self.agents.iter().map(|a| a.name.clone()))
            .collect()
    }

    fn master_names(&self) -> Vec<String> {
        self.masters.iter().map(|m| m.name.clone()).collect()
    }

    fn leader(&self) -> Option<usize> {
        let id = self.record.latest_leader()?;
        self.masters.iter().position(|m| m.id == id)
    }

    /// Starts and undoes what is due at `now`.
    pub(crate) fn step(&mut self, sim: &mut turmoil::Sim<'_>, now: Duration) {
        let mut i = 0;
        while i < self.undo.len() {
            if self.undo[i].0 <= now {
                let (_, undo) = self.undo.remove(i);
                self.undo_one(sim, now, undo);
            } else {
                i += 1;
            }
        }
        while self.pending.last().is_some_and(|f| f.at <= now) {
            let Some(next) = self.pending.pop() else {
                break;
            };
            self.inflict(sim, now, next);
        }
    }

    /// Undoes every fault still in force, and drops those not started.
    pub(crate) fn heal(&mut self, sim: &mut turmoil::Sim<'_>, now: Duration) {
        self.pending.clear();
        for (_, undo) in std::mem::take(&mut self.undo) {
            self.undo_one(sim, now, undo);
        }
        self.record
            .log_at(now, "healed: every link repaired, every host up");
    }

    fn cut(
        &mut self,
        sim: &mut turmoil::Sim<'_>,
        now: Duration,
        side: Vec<String>,
        lasts: Duration,
    ) {
        let rest: Vec<String> = self
            .names()
            .into_iter()
            .filter(|n| !side.contains(n))
            .collect();
        for a in &side {
            for b in &rest {
                sim.partition(a.as_str(), b.as_str());
            }
        }
        self.undo.push((now + lasts, Undo::Repair(side, rest)));
    }

    fn inflict(&mut self, sim: &mut turmoil::Sim<'_>, now: Duration, scheduled: Scheduled) {
        let Scheduled { lasts, fault, .. } = scheduled;
        let mut line = format!("fault for {:.1}s: {fault:?}", lasts.as_secs_f64());
        match fault {
            Fault::IsolateLeader | Fault::PauseLeader => {
                let Some(leader) = self.leader() else {
                    return;
                };
                let name = self.masters[leader].name.clone();
                line.push_str(&format!(" ({name})"));
                if matches!(fault, Fault::IsolateLeader) {
                    self.cut(sim, now, vec![name], lasts);
                } else {
                    let rest: Vec<String> =
                        self.names().into_iter().filter(|n| *n != name).collect();
                    for other in &rest {
                        sim.hold(name.as_str(), other.as_str());
                    }
                    self.undo
                        .push((now + lasts, Undo::Release(vec![name], rest)));
                }
            }
            Fault::IsolateMaster(i) => {
                let name = self.masters[i].name.clone();
                self.cut(sim, now, vec![name], lasts);
            }
            Fault::IsolateAgent(i) => {
                let agent = self.agents[i].name.clone();
                let masters = self.master_names();
                for m in &masters {
                    sim.partition(agent.as_str(), m.as_str());
                }
                self.undo
                    .push((now + lasts, Undo::Repair(vec![agent], masters)));
            }
            Fault::Minority(m, a) => {
                let side = vec![self.masters[m].name.clone(), self.agents[a].name.clone()];
                self.cut(sim, now, side, lasts);
            }
            Fault::CrashMaster(i) => {
                let name = self.masters[i].name.clone();
                if !sim.is_host_running(name.as_str()) {
                    return;
                }
                sim.crash(name.as_str());
                self.undo.push((now + lasts, Undo::Restart(name)));
            }
            Fault::RestartAgent(i) => {
                let name = self.agents[i].name.clone();
                if !sim.is_host_running(name.as_str()) {
                    return;
                }
                sim.bounce(name.as_str());
            }
            Fault::CrashAgentMachine(i) => {
                let name = self.agents[i].name.clone();
                if !sim.is_host_running(name.as_str()) {
                    return;
                }
                sim.crash(name.as_str());
                self.agents[i].tasks.reboot();
                self.undo.push((now + lasts, Undo::Restart(name)));
            }
            Fault::SlowNetwork(max) => {
                sim.set_max_message_latency(max);
                self.undo.push((now + lasts, Undo::Latency));
            }
        }
        self.record.log_at(now, line);
    }

    fn undo_one(&mut self, sim: &mut turmoil::Sim<'_>, now: Duration, undo: Undo) {
        match &undo {
            Undo::Repair(a, b) => {
                for x in a {
                    for y in b {
                        sim.repair(x.as_str(), y.as_str());
                    }
                }
            }
            Undo::Release(a, b) => {
                for x in a {
                    for y in b {
                        sim.release(x.as_str(), y.as_str());
                    }
                }
            }
            Undo::Restart(name) => {
                if !sim.is_host_running(name.as_str()) {
                    sim.bounce(name.as_str());
                }
            }
            Undo::Latency => sim.set_max_message_latency(crate::MAX_LATENCY),
        }
        self.record.log_at(now, format!("undone: {undo:?}"));
    }
}
