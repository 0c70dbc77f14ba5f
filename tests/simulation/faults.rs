//! The nemesis: a seeded schedule of faults, applied between simulation steps, and the heal
//! that ends them.
//!
//! Links are cut and held by count: a link stays cut while any fault in force cuts it (held
//! while any holds it and none cuts it), so that undoing one fault does not heal another's
//! cut early. Every fault is recorded with when it started and ended, for the checks that
//! look at what happened around a heal.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::cluster::{AgentHost, HEARTBEAT_DEADLINE, MasterHost};
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
    /// The agent process restarts (as [`RestartAgent`](Fault::RestartAgent)) while launches
    /// are on their way to it or just started: `after` the next `on` once the fault starts
    /// (0.2 to 1.5 s after a client's submission, which makes launches; up to 0.5 s after
    /// the agent starts a task, whose status is then on its way). It waits for that for as
    /// long as the fault lasts.
    RestartAgentInFlight {
        /// Which agent.
        agent: usize,
        /// What it waits for.
        on: InFlight,
        /// How long after it the agent restarts.
        after: Duration,
    },
    /// Cut the links between the current leader and these agents, for longer than the
    /// leader's heartbeat deadline: it marks them unreachable (their tasks replaced or kept
    /// by their groups' disconnect policies), while they still reach the other masters
    /// (which point them to the leader); healed, they come back.
    CutLeaderFromAgents(Vec<usize>),
    /// Cut a follower (the first or second master, in id order, of those that do not lead
    /// when the fault starts) off from every other host for several election timeouts. The
    /// schedule leaves no other fault in force from a while before it to a while after its
    /// heal, so that what happens at the heal is the rejoin's doing.
    IsolateFollower(usize),
    /// For a while, half the clients' submissions carry a large payload (arguments or
    /// environment of hundreds of KiB, up to near the 1 MiB job limit): large registry
    /// entries, launches and reads.
    LargeEntries,
}

/// What a [`Fault::RestartAgentInFlight`] waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum InFlight {
    /// A client's submission (whose launches are then on their way).
    Submission,
    /// The agent starting a task (a launch just arrived: its status is on its way back).
    Launch,
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

/// How long before an [`IsolateFollower`](Fault::IsolateFollower) no other fault is in force.
pub(crate) const QUIET_BEFORE: Duration = Duration::from_secs(1);
/// How long after an [`IsolateFollower`](Fault::IsolateFollower) is healed no other fault
/// starts.
pub(crate) const QUIET_AFTER: Duration = Duration::from_secs(4);

/// The shortest a fault lasts (one cut short to leave room for a follower's isolation
/// alone, too).
const MIN_LASTS: Duration = Duration::from_millis(500);

/// How many kinds of fault [`schedule`] draws from.
const KINDS: u32 = 13;

/// The faults of a run: one every 1 to 5 s from `start` until `end`, each lasting 0.5 to 8 s
/// (a leader–agent cut 1 to 4 s longer than the heartbeat deadline; a follower's isolation 3
/// to 8 s, several election timeouts, with no other fault in force from [`QUIET_BEFORE`]
/// before it starts, the faults before it cut short or dropped, to [`QUIET_AFTER`] after it
/// ends), every kind equally likely.
pub(crate) fn schedule(
    rng: &mut fastrand::Rng,
    masters: usize,
    agents: usize,
    start: Duration,
    end: Duration,
) -> Vec<Scheduled> {
    let mut faults: Vec<Scheduled> = Vec::new();
    let mut at = start;
    while at < end {
        let fault = match rng.u32(..KINDS) {
            0 => Fault::IsolateLeader,
            1 => Fault::IsolateMaster(rng.usize(..masters)),
            2 => Fault::IsolateAgent(rng.usize(..agents)),
            3 => Fault::Minority(rng.usize(..masters), rng.usize(..agents)),
            4 => Fault::PauseLeader,
            5 => Fault::CrashMaster(rng.usize(..masters)),
            6 => Fault::RestartAgent(rng.usize(..agents)),
            7 => Fault::CrashAgentMachine(rng.usize(..agents)),
            8 => Fault::SlowNetwork(Duration::from_millis(rng.u64(20..400))),
            9 => {
                let agent = rng.usize(..agents);
                // After a submission, while its launches are on their way (placement and
                // launch take a few tens of milliseconds, more under faults); after a
                // launch, while the task's status is on its way back.
                let (on, after) = if rng.bool() {
                    (InFlight::Submission, rng.u64(200..1_500))
                } else {
                    (InFlight::Launch, rng.u64(0..500))
                };
                Fault::RestartAgentInFlight {
                    agent,
                    on,
                    after: Duration::from_millis(after),
                }
            }
            10 => {
                // One agent, or two, or all.
                let mut chosen: Vec<usize> = (0..agents).collect();
                rng.shuffle(&mut chosen);
                chosen.truncate(rng.usize(1..=agents));
                chosen.sort_unstable();
                Fault::CutLeaderFromAgents(chosen)
            }
            11 => Fault::IsolateFollower(rng.usize(..2)),
            _ => Fault::LargeEntries,
        };
        let lasts = match fault {
            Fault::CutLeaderFromAgents(_) => {
                HEARTBEAT_DEADLINE + Duration::from_millis(rng.u64(1_000..4_000))
            }
            Fault::IsolateFollower(_) => Duration::from_millis(rng.u64(3_000..8_000)),
            _ => Duration::from_millis(rng.u64(500..8_000)),
        };
        if let Fault::IsolateFollower(_) = fault {
            // Alone: the faults before it end (cut short if need be, dropped if they would
            // start too close to it) by QUIET_BEFORE it starts, the next starts QUIET_AFTER
            // its heal.
            let quiet_from = at.saturating_sub(QUIET_BEFORE);
            faults.retain_mut(|f| {
                let until = f.at + f.lasts + lingers(&f.fault);
                if until <= quiet_from {
                    return true;
                }
                let room = quiet_from
                    .saturating_sub(f.at)
                    .saturating_sub(lingers(&f.fault));
                f.lasts = room;
                room >= MIN_LASTS
            });
            faults.push(Scheduled { at, lasts, fault });
            at += lasts + QUIET_AFTER;
            continue;
        }
        faults.push(Scheduled { at, lasts, fault });
        at += Duration::from_millis(rng.u64(1_000..5_000));
    }
    faults
}

/// How long a fault may act past its `lasts`: an agent restart waiting for a launch restarts
/// the agent up to its delay after the wait ends.
fn lingers(fault: &Fault) -> Duration {
    match fault {
        Fault::RestartAgentInFlight { after, .. } => *after,
        _ => Duration::ZERO,
    }
}

/// The state a link is left in by the faults in force.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LinkState {
    /// Messages flow.
    Healthy,
    /// Messages wait, to arrive all at once when released.
    Held,
    /// Messages are lost.
    Cut,
}

/// The links the faults in force cut or hold, counted (see the module).
#[derive(Debug, Default)]
struct Links {
    /// How many faults in force cut each link (named by its two hosts, in order).
    cut: BTreeMap<(String, String), u32>,
    /// How many hold it.
    held: BTreeMap<(String, String), u32>,
}

impl Links {
    /// The link between `a` and `b`, either way round.
    fn key(a: &str, b: &str) -> (String, String) {
        if a <= b {
            (a.to_owned(), b.to_owned())
        } else {
            (b.to_owned(), a.to_owned())
        }
    }

    /// What the faults in force leave the link `key` in.
    fn state(&self, key: &(String, String)) -> LinkState {
        if self.cut.get(key).is_some_and(|&n| n > 0) {
            LinkState::Cut
        } else if self.held.get(key).is_some_and(|&n| n > 0) {
            LinkState::Held
        } else {
            LinkState::Healthy
        }
    }

    /// Counts one more (`delta` 1) or one fewer (-1) cut (`cut`) or hold of the link between
    /// `a` and `b`, and sets the link as the count leaves it.
    fn change(&mut self, sim: &mut turmoil::Sim<'_>, a: &str, b: &str, cut: bool, delta: i32) {
        let key = Self::key(a, b);
        let before = self.state(&key);
        let counts = if cut { &mut self.cut } else { &mut self.held };
        let count = counts.entry(key.clone()).or_default();
        *count = count.saturating_add_signed(delta);
        if *count == 0 {
            counts.remove(&key);
        }
        let after = self.state(&key);
        match (before, after) {
            (x, y) if x == y => {}
            (_, LinkState::Cut) => sim.partition(a, b),
            (_, LinkState::Held) => sim.hold(a, b),
            (LinkState::Cut, LinkState::Healthy) => sim.repair(a, b),
            (_, LinkState::Healthy) => sim.release(a, b),
        }
    }
}

/// The hosts a fault needs, and what is undone when.
pub(crate) struct Nemesis {
    masters: Vec<MasterHost>,
    agents: Vec<AgentHost>,
    /// The faults not started yet, the next last.
    pending: Vec<Scheduled>,
    /// What is undone when, with the number of its fault in the record.
    undo: Vec<(Duration, Undo, usize)>,
    /// Agent restarts waiting for their cue.
    armed: Vec<Armed>,
    /// The links the faults in force cut or hold.
    links: Links,
    record: Record,
}

/// A [`Fault::RestartAgentInFlight`] waiting for its cue.
#[derive(Debug)]
struct Armed {
    /// The agent it restarts.
    agent: usize,
    /// What it waits for.
    on: InFlight,
    /// How many of those there were when it started waiting.
    seen: u64,
    /// How long after its cue the agent restarts.
    after: Duration,
    /// Until when it waits.
    until: Duration,
    /// Its fault's number in the record.
    span: usize,
}

/// What ends a fault.
#[derive(Debug)]
enum Undo {
    /// Every link between the two sides is cut one fault fewer.
    Repair(Vec<String>, Vec<String>),
    /// Every link between the two sides is held one fault fewer.
    Release(Vec<String>, Vec<String>),
    /// The host, crashed, starts again.
    Restart(String),
    /// An agent process restarts now (a [`Fault::RestartAgentInFlight`] whose cue came).
    RestartAgent(String),
    /// Messages take no longer than usual again.
    Latency,
    /// Submissions are small again (one stretch of large ones fewer).
    SmallEntries,
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
            armed: Vec::new(),
            links: Links::default(),
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
        self.cue(now);
        let mut i = 0;
        while i < self.undo.len() {
            if self.undo[i].0 <= now {
                let (_, undo, span) = self.undo.remove(i);
                self.undo_one(sim, now, undo, span);
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

    /// Undoes every fault still in force, and drops those not started or still waiting.
    pub(crate) fn heal(&mut self, sim: &mut turmoil::Sim<'_>, now: Duration) {
        self.pending.clear();
        for armed in std::mem::take(&mut self.armed) {
            self.record.fault_ended(armed.span, now);
        }
        for (_, undo, span) in std::mem::take(&mut self.undo) {
            if let Undo::RestartAgent(name) = &undo {
                // Not due yet: a restart after the heal would be a fault after it.
                self.record.fault_ended(span, now);
                self.record
                    .log_at(now, format!("{name} is not restarted: the heal came first"));
                continue;
            }
            self.undo_one(sim, now, undo, span);
        }
        self.record
            .log_at(now, "healed: every link repaired, every host up");
    }

    /// Arms the agent restarts whose cue came: each restarts its agent after its delay.
    fn cue(&mut self, now: Duration) {
        let mut i = 0;
        while i < self.armed.len() {
            let armed = &self.armed[i];
            let count = self.count(armed.agent, armed.on);
            if count > armed.seen {
                let armed = self.armed.remove(i);
                let name = self.agents[armed.agent].name.clone();
                self.record.log_at(
                    now,
                    format!(
                        "{} came: {name} restarts in {:.2}s",
                        match armed.on {
                            InFlight::Submission => "a submission",
                            InFlight::Launch => "a launch",
                        },
                        armed.after.as_secs_f64()
                    ),
                );
                self.undo
                    .push((now + armed.after, Undo::RestartAgent(name), armed.span));
            } else if now >= armed.until {
                let armed = self.armed.remove(i);
                self.record.log_at(
                    now,
                    format!(
                        "no {:?} came for {}: not restarted",
                        armed.on, self.agents[armed.agent].name
                    ),
                );
                self.record.fault_ended(armed.span, now);
            } else {
                i += 1;
            }
        }
    }

    /// How many of `on` there have been so far (for agent `agent`'s launches).
    fn count(&self, agent: usize, on: InFlight) -> u64 {
        match on {
            InFlight::Submission => self.record.submissions(),
            InFlight::Launch => self.agents[agent].tasks.launches().len() as u64,
        }
    }

    /// Cuts (`cut`) or holds every link between `a` and `b`, counted.
    fn sever(&mut self, sim: &mut turmoil::Sim<'_>, a: &[String], b: &[String], cut: bool) {
        for x in a {
            for y in b {
                self.links.change(sim, x, y, cut, 1);
            }
        }
    }

    /// Cuts `side` off from every other host until `lasts` from now; answers what undoes it.
    fn cut(&mut self, sim: &mut turmoil::Sim<'_>, side: Vec<String>) -> Undo {
        let rest: Vec<String> = self
            .names()
            .into_iter()
            .filter(|n| !side.contains(n))
            .collect();
        self.sever(sim, &side, &rest, true);
        Undo::Repair(side, rest)
    }

    fn inflict(&mut self, sim: &mut turmoil::Sim<'_>, now: Duration, scheduled: Scheduled) {
        let Scheduled { lasts, fault, .. } = scheduled;
        let mut line = format!("fault for {:.1}s: {fault:?}", lasts.as_secs_f64());
        let mut isolated_follower = None;
        let undo = match &fault {
            Fault::IsolateLeader | Fault::PauseLeader => {
                let Some(leader) = self.leader() else {
                    return;
                };
                let name = self.masters[leader].name.clone();
                line.push_str(&format!(" ({name})"));
                if matches!(fault, Fault::IsolateLeader) {
                    Some(self.cut(sim, vec![name]))
                } else {
                    let rest: Vec<String> =
                        self.names().into_iter().filter(|n| *n != name).collect();
                    let side = vec![name];
                    self.sever(sim, &side, &rest, false);
                    Some(Undo::Release(side, rest))
                }
            }
            Fault::IsolateMaster(i) => {
                let name = self.masters[*i].name.clone();
                Some(self.cut(sim, vec![name]))
            }
            Fault::IsolateFollower(k) => {
                let leader = self.leader();
                let followers: Vec<usize> = (0..self.masters.len())
                    .filter(|&i| Some(i) != leader)
                    .collect();
                let Some(&i) = followers.get(k % followers.len().max(1)) else {
                    return;
                };
                let name = self.masters[i].name.clone();
                line.push_str(&format!(" ({name})"));
                isolated_follower = Some(self.masters[i].id);
                Some(self.cut(sim, vec![name]))
            }
            Fault::IsolateAgent(i) => {
                let agent = vec![self.agents[*i].name.clone()];
                let masters = self.master_names();
                self.sever(sim, &agent, &masters, true);
                Some(Undo::Repair(agent, masters))
            }
            Fault::CutLeaderFromAgents(chosen) => {
                let Some(leader) = self.leader() else {
                    return;
                };
                let leader = vec![self.masters[leader].name.clone()];
                line.push_str(&format!(" ({})", leader[0]));
                let agents: Vec<String> = chosen
                    .iter()
                    .map(|&i| self.agents[i].name.clone())
                    .collect();
                self.sever(sim, &leader, &agents, true);
                Some(Undo::Repair(leader, agents))
            }
            Fault::Minority(m, a) => {
                let side = vec![self.masters[*m].name.clone(), self.agents[*a].name.clone()];
                Some(self.cut(sim, side))
            }
            Fault::CrashMaster(i) => {
                let name = self.masters[*i].name.clone();
                if !sim.is_host_running(name.as_str()) {
                    return;
                }
                sim.crash(name.as_str());
                Some(Undo::Restart(name))
            }
            Fault::RestartAgent(i) => {
                let name = self.agents[*i].name.clone();
                if !sim.is_host_running(name.as_str()) {
                    return;
                }
                sim.bounce(name.as_str());
                None
            }
            Fault::RestartAgentInFlight { agent, on, after } => {
                let span = self.record.fault_started(now, line.clone(), None);
                self.armed.push(Armed {
                    agent: *agent,
                    on: *on,
                    seen: self.count(*agent, *on),
                    after: *after,
                    until: now + lasts,
                    span,
                });
                self.record.log_at(now, line);
                return;
            }
            Fault::CrashAgentMachine(i) => {
                let name = self.agents[*i].name.clone();
                if !sim.is_host_running(name.as_str()) {
                    return;
                }
                sim.crash(name.as_str());
                self.agents[*i].tasks.reboot();
                Some(Undo::Restart(name))
            }
            Fault::SlowNetwork(max) => {
                sim.set_max_message_latency(*max);
                Some(Undo::Latency)
            }
            Fault::LargeEntries => {
                self.record.set_large_entries(true);
                Some(Undo::SmallEntries)
            }
        };
        let span = self
            .record
            .fault_started(now, line.clone(), isolated_follower);
        match undo {
            Some(undo) => self.undo.push((now + lasts, undo, span)),
            None => self.record.fault_ended(span, now),
        }
        self.record.log_at(now, line);
    }

    fn undo_one(&mut self, sim: &mut turmoil::Sim<'_>, now: Duration, undo: Undo, span: usize) {
        match &undo {
            Undo::Repair(a, b) | Undo::Release(a, b) => {
                let cut = matches!(undo, Undo::Repair(..));
                for x in a {
                    for y in b {
                        self.links.change(sim, x, y, cut, -1);
                    }
                }
            }
            Undo::Restart(name) => {
                if !sim.is_host_running(name.as_str()) {
                    sim.bounce(name.as_str());
                }
            }
            Undo::RestartAgent(name) => {
                if sim.is_host_running(name.as_str()) {
                    sim.bounce(name.as_str());
                }
            }
            Undo::Latency => sim.set_max_message_latency(crate::MAX_LATENCY),
            Undo::SmallEntries => self.record.set_large_entries(false),
        }
        self.record.fault_ended(span, now);
        self.record.log_at(now, format!("undone: {undo:?}"));
    }
}
