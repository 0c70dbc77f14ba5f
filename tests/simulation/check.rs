//! The invariants every run is held to, checked over what the run recorded.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use muster_agent::simulated::{End, Ending, Kill, Launch};
use stateright::semantics::{ConsistencyTester, LinearizabilityTester};

use crate::faults::{QUIET_AFTER, QUIET_BEFORE};
use crate::record::{FaultSpan, OpEvent, Record, Standing, Write};
use crate::workload::{JobOp, JobRegister, JobRet, ROLLED_MAX_PARALLEL, is_batch, is_rolled, slot};

/// Reads linearizable and no acknowledged write lost: every job's history of operations, as
/// the clients invoked them and the cluster answered, must be explainable by one order of the
/// operations on a single register, each taking effect between its invocation and its answer
/// (stateright's `LinearizabilityTester`). Jobs are independent objects, checked one by one
/// (linearizability is local). Operations whose effect is unknown stay in flight forever: the
/// checker may place them anywhere after their invocation, or nowhere.
///
/// The checker searches orders exhaustively, which can take exponential time: each job's
/// check runs on its own thread and is given [`CHECK_BUDGET`]; one that has not finished by
/// then is reported as inconclusive (the second list), not as passed.
pub(crate) fn linearizable(record: &Record) -> (Vec<String>, Vec<String>) {
    let mut testers: BTreeMap<String, LinearizabilityTester<u64, JobRegister>> = BTreeMap::new();
    let mut problems = Vec::new();
    for event in record.ops() {
        let (job, result) = match event {
            OpEvent::Invoke { thread, job, op } => {
                let tester = testers.entry(job.clone()).or_default();
                (job, tester.on_invoke(thread, op).map(drop))
            }
            OpEvent::Return { thread, job, ret } => {
                let tester = testers.entry(job.clone()).or_default();
                (job, tester.on_return(thread, ret).map(drop))
            }
        };
        if let Err(e) = result {
            problems.push(format!("{job}: the history is malformed: {e}"));
        }
    }
    let (answers, verdicts) = std::sync::mpsc::channel();
    let jobs = testers.len();
    for (job, tester) in testers {
        let answers = answers.clone();
        std::thread::spawn(move || {
            let _ = answers.send((job, tester.len(), tester.is_consistent()));
        });
    }
    let deadline = std::time::Instant::now() + CHECK_BUDGET;
    let mut checked = BTreeSet::new();
    for _ in 0..jobs {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let Ok((job, operations, consistent)) = verdicts.recv_timeout(left) else {
            break;
        };
        if !consistent {
            problems.push(format!(
                "{job}: the operations on it are not linearizable ({operations} operations)"
            ));
        }
        checked.insert(job);
    }
    let inconclusive = record
        .ops()
        .iter()
        .map(|e| match e {
            OpEvent::Invoke { job, .. } | OpEvent::Return { job, .. } => job.clone(),
        })
        .collect::<BTreeSet<_>>()
        .into_iter()
        .filter(|job| !checked.contains(job))
        .map(|job| {
            format!(
                "{job}: the linearizability check did not finish within {}s",
                CHECK_BUDGET.as_secs()
            )
        })
        .collect();
    (problems, inconclusive)
}

/// How long the linearizability checks of one run may take.
const CHECK_BUDGET: std::time::Duration = std::time::Duration::from_secs(20);

/// At most one leader per term.
pub(crate) fn one_leader_per_term(record: &Record) -> Vec<String> {
    record
        .leaders()
        .into_iter()
        .filter(|(_, leaders)| leaders.len() > 1)
        .map(|(term, leaders)| format!("term {term} had {} leaders: {leaders:?}", leaders.len()))
        .collect()
}

/// No agent obeys a command of a lower term after one of a higher term: `terms` lists, per
/// agent, the term of every command it carried out, in order.
pub(crate) fn terms_never_go_back(terms: &BTreeMap<String, Vec<u64>>) -> Vec<String> {
    let mut problems = Vec::new();
    for (agent, terms) in terms {
        let mut highest = 0;
        for &term in terms {
            if term < highest {
                problems.push(format!(
                    "{agent} obeyed a command of term {term} after one of term {highest}"
                ));
            }
            highest = highest.max(term);
        }
    }
    problems
}

/// Slot names running more than once.
pub(crate) fn duplicates<'a>(running: impl IntoIterator<Item = &'a str>) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut twice = BTreeSet::new();
    for name in running {
        if !seen.insert(name) {
            twice.insert(name.to_owned());
        }
    }
    twice
}

/// One run of a task on an agent's machine: from its start to its end, if it ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Run {
    /// The agent whose machine ran it.
    pub(crate) agent: String,
    /// The task's id.
    pub(crate) task_id: String,
    /// The slot it filled (`job.group[index]`).
    pub(crate) slot: String,
    /// The job version it was placed at.
    pub(crate) job_version: u64,
    /// When it started.
    pub(crate) start: Duration,
    /// When and how it ended; `None` if it still ran when the simulation ended.
    pub(crate) end: Option<(Duration, Ending)>,
}

impl Run {
    /// Whether it ran to completion: ended by itself with exit code 0.
    pub(crate) fn finished(&self) -> bool {
        matches!(self.end, Some((_, Ending::Exited(0))))
    }

    /// Whether it ran at `at`.
    fn runs_at(&self, at: Duration) -> bool {
        self.start <= at && self.end.is_none_or(|(end, _)| end > at)
    }

    /// The run, for a message.
    fn describe(&self) -> String {
        let end = match self.end {
            None => "still running at the end".to_owned(),
            Some((at, how)) => format!("{} at {:.3}s", ending(how), at.as_secs_f64()),
        };
        format!(
            "task {} on {} (version {}, started at {:.3}s, {end})",
            self.task_id,
            self.agent,
            self.job_version,
            self.start.as_secs_f64()
        )
    }
}

/// How a run ended, in words.
fn ending(how: Ending) -> String {
    match how {
        Ending::Exited(0) => "finished".to_owned(),
        Ending::Exited(code) => format!("exited with {code}"),
        Ending::Stopped(signal) => format!("stopped (signal {signal})"),
        Ending::Lost => "lost with its machine".to_owned(),
    }
}

/// Every run on the machines, by slot, in the order they started (then by agent and task
/// id): each machine's launches paired with its ends (the k-th end of a task id with its k-th
/// launch: an id starts again only once it ended). `machines` lists each agent with its
/// launches and ends.
pub(crate) fn runs(machines: &[(String, Vec<Launch>, Vec<End>)]) -> BTreeMap<String, Vec<Run>> {
    let mut by_slot: BTreeMap<String, Vec<Run>> = BTreeMap::new();
    for (agent, launches, ends) in machines {
        let mut ends_of: BTreeMap<&str, std::collections::VecDeque<&End>> = BTreeMap::new();
        for end in ends {
            ends_of
                .entry(end.task_id.as_str())
                .or_default()
                .push_back(end);
        }
        for launch in launches {
            let end = ends_of
                .get_mut(launch.task_id.as_str())
                .and_then(|ends| ends.pop_front());
            by_slot.entry(launch.name.clone()).or_default().push(Run {
                agent: agent.clone(),
                task_id: launch.task_id.clone(),
                slot: launch.name.clone(),
                job_version: launch.job_version,
                start: launch.at,
                end: end.map(|e| (e.at, e.how)),
            });
        }
    }
    for runs in by_slot.values_mut() {
        runs.sort_by(|a, b| (a.start, &a.agent, &a.task_id).cmp(&(b.start, &b.agent, &b.task_id)));
    }
    by_slot
}

/// The job a slot belongs to (`job.group[index]` → `job`).
fn job_of(slot: &str) -> &str {
    slot.split('.').next().unwrap_or_default()
}

/// The task definition `job` had at `version`, as (its number, its payload's size), if a
/// submission was acknowledged as that version.
fn definition_at(writes: &[Write], job: &str, version: u64) -> Option<(u64, usize)> {
    writes
        .iter()
        .find(|w| w.job == job && w.ret == Some(JobRet::Written(version)))
        .and_then(|w| match w.op {
            JobOp::Submit(_, definition) => Some((definition, w.payload)),
            _ => None,
        })
}

/// Each batch slot ran once: a slot of a batch job (see [`is_batch`]) starts again only if
/// every earlier run of it ended without finishing (stopped, lost with its machine, or
/// failed), counting the runs on the agents' machines over the whole run, whatever the
/// clients did to the job meanwhile. A run that finished, before or after the next one
/// started, or one that never ended, makes any later start of the slot a second run.
pub(crate) fn batch_slots_ran_once(runs: &BTreeMap<String, Vec<Run>>) -> Vec<String> {
    let mut problems = Vec::new();
    for (slot, runs) in runs.iter().filter(|(slot, _)| is_batch(job_of(slot))) {
        'slot: for (k, later) in runs.iter().enumerate().skip(1) {
            for earlier in &runs[..k] {
                if earlier.finished() || earlier.end.is_none() {
                    problems.push(format!(
                        "batch slot {slot} ran twice: {} started though an earlier run, {}, {}",
                        later.describe(),
                        earlier.describe(),
                        if earlier.finished() {
                            "ran to completion"
                        } else {
                            "never ended"
                        }
                    ));
                    break 'slot;
                }
            }
        }
    }
    problems
}

/// Nothing acknowledged and never run: every batch job as the clients left it (its state as
/// read at the end, after convergence; with no such read, its last acknowledged write) that
/// is not stopped has every slot of its count run to completion at least once (a slot that
/// finished under an earlier version counts: a finished slot is not run again).
pub(crate) fn batch_jobs_ran(
    runs: &BTreeMap<String, Vec<Run>>,
    finals: &BTreeMap<String, JobRet>,
    writes: &[Write],
) -> Vec<String> {
    let mut problems = Vec::new();
    let jobs: BTreeSet<&str> = writes
        .iter()
        .map(|w| w.job.as_str())
        .chain(finals.keys().map(String::as_str))
        .filter(|job| is_batch(job))
        .collect();
    for job in jobs {
        // (count, how it is known)
        let wanted: Option<(u32, String)> = match finals.get(job) {
            Some(JobRet::Job {
                stopped: false,
                count,
                version,
                ..
            }) => {
                let acknowledged = writes.iter().find(|w| {
                    w.job == job && w.ret == Some(JobRet::Written(*version))
                });
                let how = match acknowledged {
                    Some(w) => format!(
                        "submitted at {:.3}s and acknowledged as version {version}",
                        w.at.as_secs_f64()
                    ),
                    None => format!("version {version} as read at the end"),
                };
                Some((*count, how))
            }
            Some(_) => None,
            None => writes
                .iter()
                .filter(|w| w.job == job)
                .filter_map(|w| match (&w.ret, &w.op) {
                    (Some(JobRet::Written(version)), op) => Some((*version, op, w.at)),
                    _ => None,
                })
                .max_by_key(|(version, ..)| *version)
                .and_then(|(version, op, at)| match op {
                    JobOp::Submit(count, _) => Some((
                        *count,
                        format!(
                            "submitted at {:.3}s and acknowledged as version {version} (no read at the end)",
                            at.as_secs_f64()
                        ),
                    )),
                    _ => None,
                }),
        };
        let Some((count, how)) = wanted else {
            continue;
        };
        let never: Vec<String> = (0..count)
            .map(|i| slot(job, i))
            .filter(|slot| !runs.get(slot).is_some_and(|r| r.iter().any(Run::finished)))
            .collect();
        if !never.is_empty() {
            let tried: Vec<String> = never
                .iter()
                .flat_map(|slot| runs.get(slot).into_iter().flatten())
                .map(Run::describe)
                .collect();
            problems.push(format!(
                "batch job {job} ({count} tasks, {how}): slots {never:?} never ran to completion by the end of the run; their runs: {tried:?}"
            ));
        }
    }
    problems
}

/// How long after a kill a copy of the slot may start and still count as the replacement the
/// master had placed before it killed (a launch on its way): a copy that the kill itself made
/// necessary comes later, once the master notices the slot is empty (at its next evaluation or
/// reconciliation of the job).
pub(crate) const REPLACED_WITHIN: Duration = Duration::from_secs(1);

/// The index of slot `slot` (`job.group[index]`).
fn index_of(slot: &str) -> Option<u32> {
    slot.rsplit_once('[')?.1.strip_suffix(']')?.parse().ok()
}

/// Whether a client changed `job` in a way that stops a task of slot `index` placed at job
/// version `version`, by `at`: a write invoked by then, applied after that version (answered
/// with a later one, or whose outcome is unknown), that stops the job, lowers its count to
/// the slot's index or below, or changes its task definition (its definition number or
/// payload differ from those of the submission that made `version`; when that one is unknown,
/// any submission counts).
fn changed_since(
    writes: &[Write],
    job: &str,
    index: Option<u32>,
    version: u64,
    at: Duration,
) -> bool {
    let own = definition_at(writes, job, version);
    writes.iter().any(|w| {
        let later = match &w.ret {
            None => true,
            Some(JobRet::Written(v)) => *v > version,
            Some(_) => false,
        };
        let stops_it = match (&w.op, own) {
            (JobOp::Submit(count, definition), Some(own)) => {
                index.is_none_or(|i| *count <= i) || (*definition, w.payload) != own
            }
            _ => true,
        };
        w.job == job && w.at <= at && later && stops_it
    })
}

/// No task killed unless replaced: every task a master had killed (a kill with a term; the
/// agent's own stops are not the master's) was killed because a client changed its job since
/// it was placed (see [`changed_since`]: a stop, a count that leaves its slot out, a new
/// task definition), or while another copy of its slot ran (on any machine), or with one
/// started within [`REPLACED_WITHIN`] after it. `kills` lists each agent with its machine's
/// kills.
pub(crate) fn kills_replaced(
    kills: &[(String, Vec<Kill>)],
    runs: &BTreeMap<String, Vec<Run>>,
    writes: &[Write],
) -> Vec<String> {
    let mut problems = Vec::new();
    for (agent, kills) in kills {
        for kill in kills {
            let Some(term) = kill.term else {
                continue;
            };
            let copies = runs.get(&kill.name).map(Vec::as_slice).unwrap_or_default();
            let is_it = |r: &Run| {
                r.agent == *agent
                    && r.task_id == kill.task_id
                    && r.end.is_some_and(|(at, _)| at == kill.at)
            };
            let version = copies
                .iter()
                .find(|r| is_it(r))
                .map_or(0, |r| r.job_version);
            let job = job_of(&kill.name);
            let changed = changed_since(writes, job, index_of(&kill.name), version, kill.at);
            let replaced = copies.iter().any(|r| {
                !is_it(r)
                    && (r.runs_at(kill.at)
                        || (r.start > kill.at && r.start <= kill.at + REPLACED_WITHIN))
            });
            if !changed && !replaced {
                let others: Vec<String> = copies
                    .iter()
                    .filter(|r| !is_it(r))
                    .map(Run::describe)
                    .collect();
                problems.push(format!(
                    "{agent} killed task {} of slot {} (placed at version {version}) at {:.3}s on the command of term {term}, though no client had changed {job} since and no other copy ran then or started within {REPLACED_WITHIN:?}; the slot's other runs: {others:?}",
                    kill.task_id,
                    kill.name,
                    kill.at.as_secs_f64()
                ));
            }
        }
    }
    problems
}

/// How long around a fault a roll is not held to [`rolls_replace_a_few_at_a_time`]: a lost
/// agent or leader makes slots empty that no roll emptied.
const ROLL_FAULT_MARGIN: Duration = Duration::from_secs(1);

/// How long a rolled job's new task must run before it counts as healthy (its
/// `min_healthy_time`).
const ROLLED_HEALTHY_AFTER: Duration = Duration::from_millis(200);

/// How long after a write that raised a rolled job's count its kills are not watched.
const RAISED_WITHIN: Duration = Duration::from_secs(1);

/// The count of `job` as the writes acknowledged by `at` leave it (0 once stopped): that of
/// the one answered with the highest version; `None` if a write of unknown effect was
/// invoked after that one (it may have changed the count since).
fn count_at(writes: &[Write], job: &str, at: Duration) -> Option<u32> {
    let of_job = || writes.iter().filter(|w| w.job == job && w.at <= at);
    let latest = of_job()
        .filter_map(|w| match (&w.op, &w.ret) {
            (JobOp::Submit(n, _), Some(JobRet::Written(v))) => Some((*v, w.at, *n)),
            (JobOp::Stop, Some(JobRet::Written(v))) => Some((*v, w.at, 0)),
            _ => None,
        })
        .max_by_key(|(version, ..)| *version);
    let (_, since, count) = latest.unwrap_or((0, Duration::ZERO, 0));
    let unknown_since = of_job().any(|w| w.ret.is_none() && w.at >= since);
    (!unknown_since).then_some(count)
}

/// Whether write `w` raised its job's count: a submission answered with version `v` whose
/// count is above that of the write answered with `v - 1` (or that one is not known).
fn raises_count(writes: &[Write], w: &Write) -> bool {
    let (JobOp::Submit(count, _), Some(JobRet::Written(version))) = (&w.op, &w.ret) else {
        return matches!(w.op, JobOp::Submit(..));
    };
    let before = writes.iter().find_map(|b| match (&b.op, &b.ret) {
        (op, Some(JobRet::Written(v))) if b.job == w.job && *v + 1 == *version => match op {
            JobOp::Submit(n, _) => Some(*n),
            _ => Some(0),
        },
        _ => None,
    });
    before.is_none_or(|before| before < *count)
}

/// The deployment invariant: a rolled job (see [`is_rolled`]) never has more than
/// [`ROLLED_MAX_PARALLEL`] of its wanted slots being replaced at once, with no fault in force,
/// so that at least `count - max_parallel` of its tasks are healthy. At every master's kill of
/// one of its tasks (a kill with a term) at least [`ROLL_FAULT_MARGIN`] away from every fault,
/// the slots of the job still wanted (below its count) that run no task, or one started less
/// than [`ROLLED_HEALTHY_AFTER`] before (not healthy yet), are counted; more than
/// `max_parallel` is a roll that replaced too many at once.
pub(crate) fn rolls_replace_a_few_at_a_time(
    kills: &[(String, Vec<Kill>)],
    runs: &BTreeMap<String, Vec<Run>>,
    writes: &[Write],
    faults: &[FaultSpan],
) -> Vec<String> {
    let quiet = |at: Duration| {
        faults.iter().all(|f| {
            let until = f.until.unwrap_or(Duration::MAX);
            at + ROLL_FAULT_MARGIN < f.from || at > until.saturating_add(ROLL_FAULT_MARGIN)
        })
    };
    let mut problems = Vec::new();
    for kill in kills.iter().flat_map(|(_, kills)| kills) {
        let job = job_of(&kill.name);
        if kill.term.is_none() || !is_rolled(job) || !quiet(kill.at) {
            continue;
        }
        let Some(count) = count_at(writes, job, kill.at) else {
            continue;
        };
        let at = kill.at;
        // New slots of a count just raised are placements, not replacements.
        let raised = writes.iter().any(|w| {
            w.job == job
                && w.at <= at
                && at.saturating_sub(w.at) <= RAISED_WITHIN
                && raises_count(writes, w)
        });
        if raised {
            continue;
        }
        let replacing: Vec<String> = (0..count)
            .map(|i| slot(job, i))
            .filter(|name| {
                let healthy = |run: &Run| {
                    run.runs_at(at) && at.saturating_sub(run.start) >= ROLLED_HEALTHY_AFTER
                };
                !runs.get(name).is_some_and(|r| r.iter().any(healthy))
            })
            .collect();
        if replacing.len() > ROLLED_MAX_PARALLEL {
            problems.push(format!(
                "{job}: at {:.3}s (a kill of {}), with no fault near, {} of its {count} slots were being replaced at once (max_parallel {ROLLED_MAX_PARALLEL}): {replacing:?}",
                at.as_secs_f64(),
                kill.task_id,
                replacing.len()
            ));
        }
    }
    problems
}

/// How long after a follower's heal its leader is watched: less than the [`QUIET_AFTER`] the
/// schedule leaves, as a heal comes at the first step at or after its time.
pub(crate) const REJOIN_WATCH: Duration = QUIET_AFTER.saturating_sub(Duration::from_secs(1));

/// No leader deposed by a member that rejoins: for every follower cut off from everything
/// ([`Fault::IsolateFollower`]) with no other fault in force from half [`QUIET_BEFORE`] before
/// its cut to [`REJOIN_WATCH`] after its heal, (1) its raft term never rose above the highest
/// term of the other masters while it was cut off (with pre-vote it cannot win a round alone,
/// so it never stands), and (2) the master leading at the heal still leads, in the same term,
/// for [`REJOIN_WATCH`] after it, and no other master leads meanwhile. `standings` is every
/// master's leadership and term as they changed.
///
/// [`Fault::IsolateFollower`]: crate::faults::Fault::IsolateFollower
pub(crate) fn rejoin_deposes_no_leader(
    standings: &[Standing],
    faults: &[FaultSpan],
) -> Vec<String> {
    let mut problems = Vec::new();
    // Each master's standing at `at` (its last change at or before it).
    let at_time = |at: Duration| -> BTreeMap<u64, &Standing> {
        let mut now = BTreeMap::new();
        for s in standings.iter().take_while(|s| s.at <= at) {
            now.insert(s.master, s);
        }
        now
    };
    for (n, cut) in faults.iter().enumerate() {
        let (Some(follower), Some(heal)) = (cut.isolated_follower, cut.until) else {
            continue;
        };
        let from = cut.from.saturating_sub(QUIET_BEFORE / 2);
        let to = heal + REJOIN_WATCH;
        let quiet = faults.iter().enumerate().all(|(m, other)| {
            m == n || other.from > to || other.until.is_some_and(|until| until < from)
        });
        if !quiet {
            continue;
        }
        // (1) Its term when it was cut off, whenever a standing changed meanwhile, and at the
        // heal.
        let moments = std::iter::once(cut.from)
            .chain(
                standings
                    .iter()
                    .filter(|s| s.at >= cut.from && s.at <= heal)
                    .map(|s| s.at),
            )
            .chain(std::iter::once(heal));
        for moment in moments {
            let now = at_time(moment);
            let Some(mine) = now.get(&follower).map(|s| s.term) else {
                continue;
            };
            let cluster = now
                .values()
                .filter(|s| s.master != follower)
                .map(|s| s.term)
                .max()
                .unwrap_or(0);
            if mine > cluster {
                problems.push(format!(
                    "m{follower}, cut off from every host from {:.3}s to {:.3}s, was in term {mine} at {:.3}s while the other masters were at most in term {cluster}",
                    cut.from.as_secs_f64(),
                    heal.as_secs_f64(),
                    moment.as_secs_f64()
                ));
                break;
            }
        }
        // (2) The leader at the heal.
        let at_heal = at_time(heal);
        let Some(leader) = at_heal
            .values()
            .filter(|s| s.leads && s.master != follower)
            .max_by_key(|s| s.term)
        else {
            continue;
        };
        let deposed = standings
            .iter()
            .filter(|s| s.at > heal && s.at <= to)
            .find(|s| {
                if s.master == leader.master {
                    !s.leads || s.term != leader.term
                } else {
                    s.leads
                }
            });
        if let Some(change) = deposed {
            problems.push(format!(
                "m{follower} rejoined at {:.3}s (cut off since {:.3}s, no other fault around) and m{}, leading in term {} at the heal, was deposed: at {:.3}s m{} {} in term {}",
                heal.as_secs_f64(),
                cut.from.as_secs_f64(),
                leader.master,
                leader.term,
                change.at.as_secs_f64(),
                change.master,
                if change.leads { "leads" } else { "does not lead" },
                change.term
            ));
        }
    }
    problems
}
