//! The registry's contents in memory and the rules that change them.
//!
//! Pure logic: the state machine applies committed entries with [`RegistryState::apply`] and
//! snapshots the result; readers see it through a [`RegistryReader`](crate::RegistryReader).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

use muster_model::{
    AgentId, AgentInfo, AgentScheduling, EvalId, EvalStatus, Evaluation, Job, UnreachableAgent,
};
use muster_security::{AclToken, TokenTable};

use crate::types::{Op, OpError, Outcome};

/// How many ended (complete, failed, canceled) evaluations the registry keeps per job, newest
/// first; older ones are collected as soon as a newer one ends. Pending and blocked
/// evaluations are always kept.
pub const ENDED_EVALS_KEPT_PER_JOB: usize = 20;

/// Admitted and unreachable agents, the counter that names new agents, jobs and evaluations.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(from = "Contents")]
pub struct RegistryState {
    /// Agents the master admitted and has not marked unreachable.
    pub agents: BTreeMap<AgentId, AgentInfo>,
    /// Agents marked unreachable, with when.
    pub unreachable: BTreeMap<AgentId, UnreachableAgent>,
    /// The number in the last id handed out.
    pub last_agent_number: u64,
    /// How schedulers may use each agent (eligibility, drain), for the agents whose
    /// scheduling is not the default (eligible, never drained); admitted or unreachable.
    pub scheduling: BTreeMap<AgentId, AgentScheduling>,
    /// Jobs by name.
    pub jobs: BTreeMap<String, Job>,
    /// Each job's earlier versions, oldest first, at most [`JOB_VERSIONS_KEPT`] (Nomad's job
    /// history: `muster job history NAME`).
    pub job_versions: BTreeMap<String, VecDeque<Job>>,
    /// Evaluations by id: every pending and blocked one, and the newest
    /// [`ENDED_EVALS_KEPT_PER_JOB`] ended ones of each job.
    pub evals: BTreeMap<EvalId, Evaluation>,
    /// Ended evaluations by job, oldest first: what evaluation GC removes. Derived from
    /// `evals`, never stored.
    #[serde(skip)]
    ended: BTreeMap<String, BTreeSet<EndedKey>>,
    /// Whether the first management token was stored (`muster acl bootstrap`, once).
    pub acl_bootstrapped: bool,
    /// ACL tokens by accessor; only their secrets' hashes.
    pub tokens: BTreeMap<String, AclToken>,
    /// The tokens by secret hash, for authenticating calls. Derived from `tokens`.
    #[serde(skip)]
    token_table: TokenTable,
    /// Admitted and unreachable agents by the address they registered with, for finding an
    /// agent that registers again without a scan. Derived from `agents` and `unreachable`.
    #[serde(skip)]
    by_address: BTreeMap<String, Vec<AgentId>>,
}

/// `job` as the registry stores it over `old`: the next version number, and each group's spec
/// version. A group whose tasks are defined as before keeps its spec version (a count or
/// `stopped` change restarts nothing); a new or changed one gets this version, so that its
/// tasks placed earlier are replaced. (Also what a dry run, `muster job plan`, plans with.)
pub fn next_version(old: Option<&Job>, mut job: Job) -> Job {
    let version = old.map_or(1, |old| old.version + 1);
    job.version = version;
    for group in &mut job.groups {
        group.spec_version = old
            .and_then(|old| old.groups.iter().find(|g| g.name == group.name))
            .filter(|previous| previous.same_task_definition(group))
            .map_or(version, |previous| previous.spec_version);
    }
    job
}

/// Earlier versions of a job the registry keeps.
pub const JOB_VERSIONS_KEPT: usize = 10;

impl RegistryState {
    /// Keeps `old`, a version just replaced, dropping the oldest past [`JOB_VERSIONS_KEPT`].
    fn keep_version(&mut self, old: Job) {
        let versions = self.job_versions.entry(old.name.clone()).or_default();
        versions.push_back(old);
        while versions.len() > JOB_VERSIONS_KEPT {
            versions.pop_front();
        }
    }
}

/// Orders a job's ended evaluations: by the entry that ended them, then by age.
type EndedKey = (u64, u64, EvalId);

fn ended_key(eval: &Evaluation) -> EndedKey {
    (eval.modify_index, eval.create_index, eval.id.clone())
}

fn has_ended(status: EvalStatus) -> bool {
    matches!(
        status,
        EvalStatus::Complete | EvalStatus::Failed | EvalStatus::Canceled
    )
}

/// The stored form of [`RegistryState`]: everything but the derived index. Jobs and
/// evaluations may be missing (state stored before they existed).
#[derive(Deserialize)]
struct Contents {
    agents: BTreeMap<AgentId, AgentInfo>,
    unreachable: BTreeMap<AgentId, UnreachableAgent>,
    last_agent_number: u64,
    #[serde(default)]
    scheduling: BTreeMap<AgentId, AgentScheduling>,
    #[serde(default)]
    jobs: BTreeMap<String, Job>,
    #[serde(default)]
    job_versions: BTreeMap<String, VecDeque<Job>>,
    #[serde(default)]
    evals: BTreeMap<EvalId, Evaluation>,
    #[serde(default)]
    acl_bootstrapped: bool,
    #[serde(default)]
    tokens: BTreeMap<String, AclToken>,
}

impl From<Contents> for RegistryState {
    fn from(contents: Contents) -> Self {
        let mut state = RegistryState {
            agents: contents.agents,
            unreachable: contents.unreachable,
            last_agent_number: contents.last_agent_number,
            scheduling: contents.scheduling,
            jobs: contents.jobs,
            job_versions: contents.job_versions,
            evals: contents.evals,
            ended: BTreeMap::new(),
            token_table: TokenTable::new(contents.tokens.values().cloned()),
            acl_bootstrapped: contents.acl_bootstrapped,
            tokens: contents.tokens,
            by_address: BTreeMap::new(),
        };
        state.index_ended();
        state.index_addresses();
        state
    }
}

impl RegistryState {
    /// The tokens by secret hash, as applied: what API calls are authenticated against.
    pub fn token_table(&self) -> &TokenTable {
        &self.token_table
    }

    /// The agent, admitted (first) or unreachable, that registered from `address` as
    /// `hostname` with a certificate named `identity`: the same agent registering again.
    /// Among several, the one with the lowest id.
    pub fn registered_as(&self, identity: &str, address: &str, hostname: &str) -> Option<&AgentId> {
        let ids = self.by_address.get(address)?;
        let same = |info: &AgentInfo| info.identity == identity && info.hostname == hostname;
        ids.iter()
            .find(|id| self.agents.get(*id).is_some_and(same))
            .or_else(|| {
                ids.iter()
                    .find(|id| self.unreachable.get(*id).is_some_and(|u| same(&u.info)))
            })
    }

    /// Rebuilds the index of agents by address from `agents` and `unreachable`.
    fn index_addresses(&mut self) {
        self.by_address = BTreeMap::new();
        let infos: Vec<(AgentId, String)> = self
            .agents
            .iter()
            .chain(self.unreachable.iter().map(|(id, u)| (id, &u.info)))
            .map(|(id, info)| (id.clone(), info.address.clone()))
            .collect();
        for (id, address) in infos {
            self.add_address(&id, &address);
        }
    }

    /// Records that `id` registered from `address` (the ids of one address stay in order: one
    /// address rarely has more than one).
    fn add_address(&mut self, id: &AgentId, address: &str) {
        let ids = self.by_address.entry(address.to_owned()).or_default();
        if let Err(at) = ids.binary_search(id) {
            ids.insert(at, id.clone());
        }
    }

    /// Forgets that `id` registered from `address`.
    fn remove_address(&mut self, id: &AgentId, address: &str) {
        if let Some(ids) = self.by_address.get_mut(address) {
            ids.retain(|known| known != id);
            if ids.is_empty() {
                self.by_address.remove(address);
            }
        }
    }

    /// Rebuilds the index of ended evaluations from `evals`, after loading them.
    pub(crate) fn index_ended(&mut self) {
        self.ended.clear();
        for eval in self.evals.values().filter(|e| has_ended(e.status)) {
            self.ended
                .entry(eval.job.clone())
                .or_default()
                .insert(ended_key(eval));
        }
    }

    /// Removes an evaluation, and its place in the ended-evaluation index.
    fn take_eval(&mut self, id: &EvalId) -> Option<Evaluation> {
        let eval = self.evals.remove(id)?;
        if has_ended(eval.status)
            && let Some(ended) = self.ended.get_mut(&eval.job)
        {
            ended.remove(&ended_key(&eval));
            if ended.is_empty() {
                // As a freshly decoded state has it: no entry for a job with none.
                self.ended.remove(&eval.job);
            }
        }
        Some(eval)
    }

    /// Stores `eval` (already stamped with its indexes), keeping the ended-evaluation index
    /// right and collecting the job's oldest ended evaluations past the limit.
    fn put_eval(&mut self, eval: Evaluation) {
        self.take_eval(&eval.id);
        self.insert_eval(eval);
    }

    /// Stores `evals`, none of which is stored now. Of one job's evaluations ending in the
    /// batch, only the newest [`ENDED_EVALS_KEPT_PER_JOB`] can be kept: the others are not
    /// stored only to be collected at once (a storm's cancellations end thousands of one job's
    /// evaluations in one entry).
    fn insert_evals(&mut self, evals: Vec<Evaluation>) {
        let (mut ended, live): (Vec<_>, Vec<_>) =
            evals.into_iter().partition(|eval| has_ended(eval.status));
        for eval in live {
            self.insert_eval(eval);
        }
        // Each job's ended evaluations together, oldest first (the ended index's order).
        ended.sort_unstable_by(|a, b| {
            a.job.cmp(&b.job).then_with(|| {
                (a.modify_index, a.create_index, &a.id).cmp(&(
                    b.modify_index,
                    b.create_index,
                    &b.id,
                ))
            })
        });
        let mut kept = vec![false; ended.len()];
        let mut start = 0;
        while start < ended.len() {
            let job = &ended[start].job;
            let end = start + ended[start..].iter().take_while(|e| e.job == *job).count();
            let newest = end.saturating_sub(ENDED_EVALS_KEPT_PER_JOB).max(start);
            kept[newest..end].fill(true);
            start = end;
        }
        for (eval, kept) in ended.into_iter().zip(kept) {
            if kept {
                self.insert_eval(eval);
            }
        }
    }

    /// Stores `eval`, which is not stored now.
    fn insert_eval(&mut self, eval: Evaluation) {
        if !has_ended(eval.status) {
            self.evals.insert(eval.id.clone(), eval);
            return;
        }
        let ended = match self.ended.get_mut(&eval.job) {
            Some(ended) => ended,
            None => self.ended.entry(eval.job.clone()).or_default(),
        };
        ended.insert(ended_key(&eval));
        self.evals.insert(eval.id.clone(), eval);
        while ended.len() > ENDED_EVALS_KEPT_PER_JOB {
            let Some((_, _, oldest)) = ended.pop_first() else {
                break;
            };
            self.evals.remove(&oldest);
        }
    }

    fn put_token(&mut self, token: AclToken) {
        if let Some(old) = self.tokens.insert(token.accessor.clone(), token.clone()) {
            self.token_table.remove(&old.secret_hash);
        }
        self.token_table.insert(token);
    }

    #[cfg(test)]
    fn apply_at(&mut self, op: Op) -> Result<Outcome, OpError> {
        self.apply(op, 1)
    }

    /// Applies one operation of the raft entry at `index`.
    pub(crate) fn apply(&mut self, op: Op, index: u64) -> Result<Outcome, OpError> {
        match op {
            Op::AdmitAgent(info) => {
                self.last_agent_number += 1;
                let id = AgentId(format!("agent-{}", self.last_agent_number));
                self.add_address(&id, &info.address);
                self.agents.insert(id.clone(), info);
                Ok(Outcome::Admitted(id))
            }
            Op::UpdateAgent { id, info } => {
                let new_address = info.address.clone();
                let old = match self.unreachable.remove(&id) {
                    Some(unreachable) => Some(unreachable.info),
                    None => None,
                };
                let old = self.agents.insert(id.clone(), info).or(old);
                if let Some(old) = old {
                    self.remove_address(&id, &old.address);
                }
                self.add_address(&id, &new_address);
                Ok(Outcome::Updated)
            }
            Op::MarkUnreachable { id, at_ms } => {
                let info = self
                    .agents
                    .remove(&id)
                    .ok_or_else(|| OpError::UnknownAgent(id.clone()))?;
                self.unreachable.insert(
                    id.clone(),
                    UnreachableAgent {
                        info,
                        marked_at_ms: at_ms,
                    },
                );
                Ok(Outcome::MarkedUnreachable)
            }
            Op::RemoveAgent(id) => {
                let admitted = self.agents.remove(&id);
                let unreachable = self.unreachable.remove(&id).map(|u| u.info);
                let removed: Vec<AgentInfo> = admitted.into_iter().chain(unreachable).collect();
                if removed.is_empty() {
                    return Err(OpError::UnknownAgent(id));
                }
                for info in &removed {
                    self.remove_address(&id, &info.address);
                }
                self.scheduling.remove(&id);
                Ok(Outcome::Removed)
            }
            Op::SetScheduling { id, scheduling } => {
                if !self.agents.contains_key(&id) && !self.unreachable.contains_key(&id) {
                    return Err(OpError::UnknownAgent(id));
                }
                if scheduling.is_default() {
                    self.scheduling.remove(&id);
                } else {
                    self.scheduling.insert(id, scheduling);
                }
                Ok(Outcome::Updated)
            }
            Op::UpsertJob(job) => {
                let job = next_version(self.jobs.get(&job.name), job);
                let version = job.version;
                if let Some(old) = self.jobs.insert(job.name.clone(), job) {
                    self.keep_version(old);
                }
                Ok(Outcome::JobStored { version })
            }
            Op::UpsertEvals(evals) => {
                let count = evals.len();
                for mut eval in evals {
                    eval.create_index = self
                        .evals
                        .get(&eval.id)
                        .map_or(index, |old| old.create_index);
                    eval.modify_index = index;
                    self.put_eval(eval);
                }
                Ok(Outcome::EvalsStored(count))
            }
            Op::SetEvalStatus {
                ids,
                status,
                description,
            } => {
                let mut changed = Vec::with_capacity(ids.len());
                for id in ids {
                    if let Some(mut eval) = self.take_eval(&id) {
                        eval.status = status;
                        eval.status_description.clone_from(&description);
                        eval.modify_index = index;
                        changed.push(eval);
                    }
                }
                let count = changed.len();
                self.insert_evals(changed);
                Ok(Outcome::EvalsStored(count))
            }
            Op::Together(ops) => Ok(Outcome::Together(
                ops.into_iter().map(|op| self.apply(op, index)).collect(),
            )),
            Op::StopJob(name) => {
                let Some(job) = self.jobs.get_mut(&name) else {
                    return Err(OpError::UnknownJob(name));
                };
                let old = job.clone();
                job.version += 1;
                job.stopped = true;
                let version = job.version;
                self.keep_version(old);
                Ok(Outcome::JobStored { version })
            }
            Op::Restore(restored) => {
                let last_agent_number = self.last_agent_number.max(restored.last_agent_number);
                *self = *restored;
                self.last_agent_number = last_agent_number;
                Ok(Outcome::Restored)
            }
            Op::BootstrapAcl(token) => {
                if self.acl_bootstrapped {
                    return Err(OpError::AclAlreadyBootstrapped);
                }
                self.acl_bootstrapped = true;
                self.put_token(token);
                Ok(Outcome::TokenStored)
            }
            Op::CreateToken(token) => {
                self.put_token(token);
                Ok(Outcome::TokenStored)
            }
            Op::DeleteToken { accessor } => {
                let token = self
                    .tokens
                    .remove(&accessor)
                    .ok_or(OpError::UnknownToken(accessor))?;
                self.token_table.remove(&token.secret_hash);
                Ok(Outcome::TokenDeleted)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_registering_again_is_found_by_its_address() {
        let mut state = RegistryState::default();
        let at = |address: &str, hostname: &str| AgentInfo {
            hostname: hostname.into(),
            address: address.into(),
            identity: "agent-cert".into(),
            ..AgentInfo::default()
        };
        let Ok(Outcome::Admitted(a)) = state.apply_at(Op::AdmitAgent(at("a@h1:1", "h1"))) else {
            panic!("admitted");
        };
        let Ok(Outcome::Admitted(b)) = state.apply_at(Op::AdmitAgent(at("b@h2:1", "h2"))) else {
            panic!("admitted");
        };
        assert_eq!(state.registered_as("agent-cert", "a@h1:1", "h1"), Some(&a));
        assert_eq!(state.registered_as("other-cert", "a@h1:1", "h1"), None);
        assert_eq!(state.registered_as("agent-cert", "a@h1:1", "h2"), None);
        state
            .apply_at(Op::MarkUnreachable {
                id: b.clone(),
                at_ms: 1,
            })
            .expect("marked");
        assert_eq!(state.registered_as("agent-cert", "b@h2:1", "h2"), Some(&b));
        // Back at another address: found there, not at the old one.
        state
            .apply_at(Op::UpdateAgent {
                id: b.clone(),
                info: at("b@h3:1", "h2"),
            })
            .expect("updated");
        assert_eq!(state.registered_as("agent-cert", "b@h2:1", "h2"), None);
        assert_eq!(state.registered_as("agent-cert", "b@h3:1", "h2"), Some(&b));
        // A stored state rebuilds the index when it is read back.
        let stored = serde_json::to_string(&state).expect("serialized");
        let loaded: RegistryState = serde_json::from_str(&stored).expect("read back");
        assert_eq!(loaded.registered_as("agent-cert", "b@h3:1", "h2"), Some(&b));
        assert_eq!(loaded, state);
        state.apply_at(Op::RemoveAgent(a)).expect("removed");
        assert_eq!(state.registered_as("agent-cert", "a@h1:1", "h1"), None);
    }

    fn info(host: &str) -> AgentInfo {
        AgentInfo {
            hostname: host.into(),
            ..AgentInfo::default()
        }
    }

    #[test]
    fn admitted_agents_get_fresh_ids_that_are_never_reused() {
        let mut state = RegistryState::default();
        let a = state.apply_at(Op::AdmitAgent(info("a")));
        let b = state.apply_at(Op::AdmitAgent(info("b")));
        assert_eq!(a, Ok(Outcome::Admitted(AgentId("agent-1".into()))));
        assert_eq!(b, Ok(Outcome::Admitted(AgentId("agent-2".into()))));
        let removed = state.apply_at(Op::RemoveAgent(AgentId("agent-2".into())));
        assert_eq!(removed, Ok(Outcome::Removed));
        let c = state.apply_at(Op::AdmitAgent(info("c")));
        assert_eq!(c, Ok(Outcome::Admitted(AgentId("agent-3".into()))));
    }

    #[test]
    fn unreachable_agents_move_out_and_back() {
        let mut state = RegistryState::default();
        let id = AgentId("agent-1".into());
        state.apply_at(Op::AdmitAgent(info("a"))).expect("admit");
        let marked = state.apply_at(Op::MarkUnreachable {
            id: id.clone(),
            at_ms: 42,
        });
        assert_eq!(marked, Ok(Outcome::MarkedUnreachable));
        assert!(state.agents.is_empty());
        assert_eq!(state.unreachable[&id].marked_at_ms, 42);

        let again = state.apply_at(Op::MarkUnreachable {
            id: id.clone(),
            at_ms: 43,
        });
        assert_eq!(again, Err(OpError::UnknownAgent(id.clone())));

        let back = state.apply_at(Op::UpdateAgent {
            id: id.clone(),
            info: info("a2"),
        });
        assert_eq!(back, Ok(Outcome::Updated));
        assert!(state.unreachable.is_empty());
        assert_eq!(state.agents[&id].hostname, "a2");
    }

    #[test]
    fn scheduling_is_kept_apart_from_what_agents_report_and_goes_with_the_agent() {
        let mut state = RegistryState::default();
        let id = AgentId("agent-1".into());
        let ineligible = AgentScheduling {
            eligible: false,
            ..AgentScheduling::default()
        };
        let unknown = state.apply_at(Op::SetScheduling {
            id: id.clone(),
            scheduling: ineligible.clone(),
        });
        assert_eq!(unknown, Err(OpError::UnknownAgent(id.clone())));
        state.apply_at(Op::AdmitAgent(info("a"))).expect("admit");
        state
            .apply_at(Op::SetScheduling {
                id: id.clone(),
                scheduling: ineligible.clone(),
            })
            .expect("set");
        // A re-registration stores the agent's info again: its scheduling stays.
        state
            .apply_at(Op::UpdateAgent {
                id: id.clone(),
                info: info("a"),
            })
            .expect("update");
        assert_eq!(state.scheduling.get(&id), Some(&ineligible));
        // Back to the default: nothing kept.
        state
            .apply_at(Op::SetScheduling {
                id: id.clone(),
                scheduling: AgentScheduling::default(),
            })
            .expect("set");
        assert!(state.scheduling.is_empty());
        state
            .apply_at(Op::SetScheduling {
                id: id.clone(),
                scheduling: ineligible,
            })
            .expect("set");
        state.apply_at(Op::RemoveAgent(id)).expect("remove");
        assert!(state.scheduling.is_empty());
    }

    #[test]
    fn jobs_get_versions_and_evals_get_indexes_and_statuses() {
        use muster_model::{EvalStatus, Evaluation, Job, SchedulerType, Trigger};
        let mut state = RegistryState::default();
        let job = Job {
            name: "web".into(),
            priority: 50,
            scheduler: SchedulerType::Service,
            groups: Vec::new(),
            stopped: false,
            version: 0,
        };
        let eval = Evaluation::new(&job, Trigger::JobRegister);
        let together = state.apply(
            Op::Together(vec![
                Op::UpsertJob(job.clone()),
                Op::UpsertEvals(vec![eval.clone()]),
            ]),
            7,
        );
        assert_eq!(
            together,
            Ok(Outcome::Together(vec![
                Ok(Outcome::JobStored { version: 1 }),
                Ok(Outcome::EvalsStored(1)),
            ]))
        );
        assert_eq!(state.evals[&eval.id].create_index, 7);
        let again = state.apply(Op::UpsertJob(job), 9);
        assert_eq!(again, Ok(Outcome::JobStored { version: 2 }));

        let canceled = state.apply(
            Op::SetEvalStatus {
                ids: vec![eval.id.clone(), muster_model::EvalId("unknown".into())],
                status: EvalStatus::Canceled,
                description: "newer".into(),
            },
            11,
        );
        assert_eq!(canceled, Ok(Outcome::EvalsStored(1)));
        let stored = &state.evals[&eval.id];
        assert_eq!(stored.status, EvalStatus::Canceled);
        assert_eq!((stored.create_index, stored.modify_index), (7, 11));
    }

    /// A system job named `name`, with no groups.
    fn system_job(name: &str) -> muster_model::Job {
        muster_model::Job {
            name: name.into(),
            priority: 50,
            scheduler: muster_model::SchedulerType::System,
            groups: Vec::new(),
            stopped: false,
            version: 0,
        }
    }

    #[test]
    fn ended_evaluations_past_the_limit_are_collected_oldest_first() {
        use muster_model::{Evaluation, Trigger};
        let mut state = RegistryState::default();
        let storm: Vec<Evaluation> = (0..100)
            .map(|_| Evaluation::new(&system_job("web"), Trigger::JobRegister))
            .collect();
        let other = Evaluation::new(&system_job("db"), Trigger::JobRegister);
        let mut all = storm.clone();
        all.push(other.clone());
        state.apply(Op::UpsertEvals(all), 1).expect("stored");
        // The first 10 complete, one by one; then 80 of the others are canceled at once.
        for (n, eval) in storm.iter().take(10).enumerate() {
            let mut done = eval.clone();
            done.status = EvalStatus::Complete;
            state
                .apply(Op::UpsertEvals(vec![done]), 2 + n as u64)
                .expect("stored");
        }
        let canceled = state.apply(
            Op::SetEvalStatus {
                ids: storm[10..90].iter().map(|e| e.id.clone()).collect(),
                status: EvalStatus::Canceled,
                description: "newer".into(),
            },
            20,
        );
        assert_eq!(canceled, Ok(Outcome::EvalsStored(80)));

        let web: Vec<&Evaluation> = state.evals.values().filter(|e| e.job == "web").collect();
        let ended = web.iter().filter(|e| has_ended(e.status)).count();
        let pending = web
            .iter()
            .filter(|e| e.status == EvalStatus::Pending)
            .count();
        assert_eq!(ended, ENDED_EVALS_KEPT_PER_JOB);
        assert_eq!(pending, 10, "pending evaluations are never collected");
        assert!(
            web.iter().all(|e| e.status != EvalStatus::Complete),
            "the completes ended before the cancellations: they went first"
        );
        assert!(
            state.evals.contains_key(&other.id),
            "another job's are kept"
        );
        assert_eq!(state.evals.len(), ENDED_EVALS_KEPT_PER_JOB + 10 + 1);

        // The index is derived: a state read back from its stored form collects the same way.
        let mut reloaded: RegistryState =
            serde_json::from_slice(&serde_json::to_vec(&state).expect("encodes")).expect("decodes");
        assert_eq!(reloaded, state);
        for state in [&mut state, &mut reloaded] {
            let mut done = storm[95].clone();
            done.status = EvalStatus::Complete;
            state
                .apply(Op::UpsertEvals(vec![done]), 30)
                .expect("stored");
        }
        assert_eq!(reloaded, state);
        assert_eq!(
            state.evals.values().filter(|e| e.job == "web").count(),
            ENDED_EVALS_KEPT_PER_JOB + 9
        );
    }

    #[test]
    fn a_batch_of_status_changes_stores_what_changing_them_one_by_one_would() {
        use muster_model::{Evaluation, Trigger};
        let mut rng = fastrand::Rng::with_seed(3);
        let statuses = [
            EvalStatus::Pending,
            EvalStatus::Blocked,
            EvalStatus::Complete,
            EvalStatus::Canceled,
        ];
        let mut batched = RegistryState::default();
        for round in 0..40u64 {
            let evals: Vec<Evaluation> = (0..rng.usize(0..60))
                .map(|_| {
                    Evaluation::new(
                        &system_job(["a", "b", "c"][rng.usize(..3)]),
                        Trigger::JobRegister,
                    )
                })
                .collect();
            batched
                .apply(Op::UpsertEvals(evals), 1 + 2 * round)
                .expect("stored");
            let ids: Vec<_> = batched
                .evals
                .keys()
                .filter(|_| rng.u8(..3) == 0)
                .cloned()
                .collect();
            let status = statuses[rng.usize(..statuses.len())];
            let index = 2 + 2 * round;
            // The same change on a copy: every evaluation taken out, then stored again one at
            // a time, each collecting what it pushes past the limit.
            let mut one_by_one = batched.clone();
            let taken: Vec<Evaluation> = ids
                .iter()
                .filter_map(|id| one_by_one.take_eval(id))
                .collect();
            for mut eval in taken {
                eval.status = status;
                eval.status_description = "why".into();
                eval.modify_index = index;
                one_by_one.put_eval(eval);
            }
            batched
                .apply(
                    Op::SetEvalStatus {
                        ids,
                        status,
                        description: "why".into(),
                    },
                    index,
                )
                .expect("stored");
            assert_eq!(batched, one_by_one, "round {round}");
            assert_eq!(batched.ended, one_by_one.ended, "round {round}");
        }
    }

    /// A job of `groups`, each given as (name, count, command).
    fn job_of(groups: &[(&str, u32, &str)]) -> muster_model::Job {
        use muster_model::{Job, SchedulerType, TaskGroup};
        Job {
            name: "web".into(),
            priority: 50,
            scheduler: SchedulerType::Service,
            groups: groups
                .iter()
                .map(|&(name, count, command)| TaskGroup {
                    name: name.into(),
                    count,
                    command: command.into(),
                    ..TaskGroup::default()
                })
                .collect(),
            stopped: false,
            version: 0,
        }
    }

    /// Stores `job` and returns each of its groups' spec versions, by name.
    fn spec_versions(state: &mut RegistryState, job: muster_model::Job) -> Vec<(String, u64)> {
        let name = job.name.clone();
        state.apply_at(Op::UpsertJob(job)).expect("stored");
        state.jobs[&name]
            .groups
            .iter()
            .map(|g| (g.name.clone(), g.spec_version))
            .collect()
    }

    fn pairs(expected: &[(&str, u64)]) -> Vec<(String, u64)> {
        expected.iter().map(|&(n, v)| (n.to_owned(), v)).collect()
    }

    #[test]
    fn a_new_job_gets_its_version_as_every_groups_spec_version() {
        let mut state = RegistryState::default();
        let mut job = job_of(&[("a", 1, "sleep"), ("b", 2, "sleep")]);
        // Whatever the submitter sent is overwritten.
        job.groups[0].spec_version = 42;
        assert_eq!(spec_versions(&mut state, job), pairs(&[("a", 1), ("b", 1)]));
    }

    #[test]
    fn a_count_change_keeps_the_spec_version() {
        let mut state = RegistryState::default();
        spec_versions(&mut state, job_of(&[("a", 1, "sleep")]));
        let scaled = spec_versions(&mut state, job_of(&[("a", 5, "sleep")]));
        assert_eq!(scaled, pairs(&[("a", 1)]));
        assert_eq!(state.jobs["web"].version, 2);
    }

    #[test]
    fn a_changed_definition_bumps_only_that_group() {
        let mut state = RegistryState::default();
        spec_versions(&mut state, job_of(&[("a", 1, "sleep"), ("b", 1, "sleep")]));
        spec_versions(&mut state, job_of(&[("a", 1, "sleep"), ("b", 1, "sleep")]));
        let changed = spec_versions(&mut state, job_of(&[("a", 1, "sleep"), ("b", 1, "true")]));
        assert_eq!(changed, pairs(&[("a", 1), ("b", 3)]));

        // Any part of the definition counts: args, env, resources, constraints.
        let mut job = job_of(&[("a", 1, "sleep"), ("b", 1, "true")]);
        job.groups[0].args = vec!["31".into()];
        assert_eq!(
            spec_versions(&mut state, job.clone()),
            pairs(&[("a", 4), ("b", 3)])
        );
        job.groups[1].env.insert("K".into(), "v".into());
        assert_eq!(
            spec_versions(&mut state, job.clone()),
            pairs(&[("a", 4), ("b", 5)])
        );
        job.groups[0].resources.mem_mb = 64;
        assert_eq!(
            spec_versions(&mut state, job.clone()),
            pairs(&[("a", 6), ("b", 5)])
        );
        job.groups[1].constraints.push(muster_model::Constraint {
            attribute: "rack".into(),
            op: muster_model::ConstraintOp::Equal,
            value: "r1".into(),
        });
        assert_eq!(spec_versions(&mut state, job), pairs(&[("a", 6), ("b", 7)]));
    }

    #[test]
    fn a_new_group_gets_the_new_version_and_a_renamed_one_counts_as_new() {
        let mut state = RegistryState::default();
        spec_versions(&mut state, job_of(&[("a", 1, "sleep")]));
        let added = spec_versions(&mut state, job_of(&[("a", 1, "sleep"), ("b", 1, "sleep")]));
        assert_eq!(added, pairs(&[("a", 1), ("b", 2)]));
        let renamed = spec_versions(&mut state, job_of(&[("c", 1, "sleep"), ("b", 1, "sleep")]));
        assert_eq!(renamed, pairs(&[("c", 3), ("b", 2)]));
    }

    #[test]
    fn resubmitting_or_stopping_an_identical_job_keeps_every_spec_version() {
        let mut state = RegistryState::default();
        let job = job_of(&[("a", 1, "sleep"), ("b", 2, "sleep")]);
        spec_versions(&mut state, job.clone());
        let again = spec_versions(&mut state, job.clone());
        assert_eq!(again, pairs(&[("a", 1), ("b", 1)]));
        assert_eq!(state.jobs["web"].version, 2);

        // Stopping stores the job as it is with `stopped` set; starting it again likewise.
        let mut stopped = state.jobs["web"].clone();
        stopped.stopped = true;
        assert_eq!(
            spec_versions(&mut state, stopped),
            pairs(&[("a", 1), ("b", 1)])
        );
        assert_eq!(spec_versions(&mut state, job), pairs(&[("a", 1), ("b", 1)]));
        assert_eq!(state.jobs["web"].version, 4);
    }

    fn token(name: &str, secret: &muster_security::TokenSecret) -> AclToken {
        AclToken {
            accessor: format!("acc-{name}"),
            name: name.into(),
            policy: muster_security::Policy::Submit,
            secret_hash: secret.hash(),
            created_ms: 1,
        }
    }

    #[test]
    fn acl_bootstraps_once_and_tokens_authenticate_until_deleted() {
        use muster_security::TokenSecret;
        let mut state = RegistryState::default();
        let root = TokenSecret::new("root-secret");
        let ci = TokenSecret::new("ci-secret");
        assert_eq!(
            state.apply_at(Op::BootstrapAcl(token("root", &root))),
            Ok(Outcome::TokenStored)
        );
        assert_eq!(
            state.apply_at(Op::BootstrapAcl(token("again", &ci))),
            Err(OpError::AclAlreadyBootstrapped)
        );
        assert!(state.token_table().authenticate(&ci).is_none());
        state
            .apply_at(Op::CreateToken(token("ci", &ci)))
            .expect("created");
        assert_eq!(
            state
                .token_table()
                .authenticate(&ci)
                .map(|t| t.name.as_str()),
            Some("ci")
        );

        // Tokens and the bootstrap survive a snapshot; the secrets never were in it.
        let json = serde_json::to_string(&state).expect("encode");
        assert!(!json.contains("ci-secret"), "{json}");
        let mut back: RegistryState = serde_json::from_str(&json).expect("decode");
        assert_eq!(back, state);
        assert!(back.token_table().authenticate(&root).is_some());

        assert_eq!(
            back.apply_at(Op::DeleteToken {
                accessor: "acc-ci".into()
            }),
            Ok(Outcome::TokenDeleted)
        );
        assert!(back.token_table().authenticate(&ci).is_none());
        assert_eq!(
            back.apply_at(Op::DeleteToken {
                accessor: "acc-ci".into()
            }),
            Err(OpError::UnknownToken("acc-ci".into()))
        );
    }

    #[test]
    fn a_state_stored_before_acls_loads_without_tokens() {
        let json = r#"{"agents":{},"unreachable":{},"last_agent_number":3}"#;
        let state: RegistryState = serde_json::from_str(json).expect("decode");
        assert!(!state.acl_bootstrapped);
        assert!(state.tokens.is_empty());
    }

    #[test]
    fn a_restore_replaces_everything_but_never_reuses_an_agent_number() {
        let info = |host: &str| AgentInfo {
            hostname: host.into(),
            address: format!("agent@{host}:5051"),
            ..AgentInfo::default()
        };
        let mut saved = RegistryState::default();
        saved
            .apply_at(Op::AdmitAgent(info("h1")))
            .expect("admitted");
        let mut state = saved.clone();
        let Ok(Outcome::Admitted(later)) = state.apply_at(Op::AdmitAgent(info("h2"))) else {
            panic!("h2 is admitted");
        };
        assert_eq!(
            state.apply_at(Op::Restore(Box::new(saved.clone()))),
            Ok(Outcome::Restored)
        );
        assert_eq!(
            state.agents, saved.agents,
            "the copy's agents, and only them"
        );
        let Ok(Outcome::Admitted(next)) = state.apply_at(Op::AdmitAgent(info("h3"))) else {
            panic!("h3 is admitted");
        };
        assert_ne!(
            next, later,
            "an id handed out after the save is not handed out again"
        );
    }

    #[test]
    fn earlier_versions_of_a_job_are_kept_oldest_first_up_to_the_cap() {
        let mut state = RegistryState::default();
        let job = |count| job_of(&[("g", count, "serve")]);
        for count in 1..=(JOB_VERSIONS_KEPT as u32 + 3) {
            state.apply_at(Op::UpsertJob(job(count))).expect("stored");
        }
        state.apply_at(Op::StopJob("web".into())).expect("stopped");
        let kept = &state.job_versions["web"];
        assert_eq!(kept.len(), JOB_VERSIONS_KEPT);
        let versions: Vec<u64> = kept.iter().map(|j| j.version).collect();
        let last = JOB_VERSIONS_KEPT as u64 + 3;
        assert_eq!(versions, ((last - 9)..=last).collect::<Vec<_>>());
        assert!(
            kept.iter().all(|j| !j.stopped),
            "the stop is the current version"
        );
        assert_eq!(state.jobs["web"].version, last + 1);
        // Stored and read back with the rest of the state.
        let json = serde_json::to_string(&state).expect("serialised");
        let back: RegistryState = serde_json::from_str(&json).expect("read back");
        assert_eq!(back.job_versions, state.job_versions);
    }

    #[test]
    fn a_stop_keeps_a_submission_committed_after_the_stopper_read_the_job() {
        let mut state = RegistryState::default();
        let job = |count| job_of(&[("g", count, "serve")]);
        state.apply_at(Op::UpsertJob(job(1))).expect("stored");
        // A stopper read version 1; a submission of count 2 commits first.
        state.apply_at(Op::UpsertJob(job(2))).expect("stored");
        assert_eq!(
            state.apply_at(Op::StopJob("web".into())),
            Ok(Outcome::JobStored { version: 3 })
        );
        let stopped = &state.jobs["web"];
        assert!(stopped.stopped);
        assert_eq!(stopped.groups[0].count, 2, "the later submission is kept");
        assert_eq!(
            state.apply_at(Op::StopJob("nope".into())),
            Err(OpError::UnknownJob("nope".into()))
        );
    }
}
