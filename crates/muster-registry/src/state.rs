//! The registry's contents in memory and the rules that change them.
//!
//! Pure logic: the state machine applies committed entries with [`RegistryState::apply`] and
//! snapshots the result; readers see it through a [`RegistryReader`](crate::RegistryReader).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

use muster_model::{
    AgentId, AgentInfo, AgentScheduling, Deployment, EvalId, EvalStatus, Evaluation, Job,
    Namespace, UnreachableAgent,
};
use muster_security::{AclToken, TokenTable};

use crate::types::{Op, OpError, Outcome, StoredPolicy};

mod access;
mod deployments;

pub use deployments::DEPLOYMENTS_KEPT;

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
    /// The batch slots that ran to completion, by job: slot name (`etl.load[3]`) to the job
    /// version its task was placed at. A finished slot is not run again, whatever later
    /// versions of the job change (as schedulers treat a finished task in an agent's
    /// history); entries of a group the job no longer has are dropped when it is stored.
    #[serde(default)]
    pub batch_finished: BTreeMap<String, BTreeMap<String, u64>>,
    /// Evaluations by id: every pending and blocked one, and the newest
    /// [`ENDED_EVALS_KEPT_PER_JOB`] ended ones of each job.
    pub evals: BTreeMap<EvalId, Evaluation>,
    /// Ended evaluations by job, oldest first: what evaluation GC removes. Derived from
    /// `evals`, never stored.
    #[serde(skip)]
    ended: BTreeMap<String, BTreeSet<EndedKey>>,
    /// Whether the first management token was stored (`muster acl bootstrap`, once).
    pub acl_bootstrapped: bool,
    /// The registry index of the last bootstrap (or reset) of the ACL system; a reset must
    /// name it. 0 for a registry bootstrapped before it was kept.
    #[serde(default)]
    pub acl_bootstrap_index: u64,
    /// ACL tokens by accessor; only their secrets' hashes.
    pub tokens: BTreeMap<String, AclToken>,
    /// The tokens by secret hash, for authenticating calls. Derived from `tokens`.
    #[serde(skip)]
    token_table: TokenTable,
    /// Policies operators stored, by name (the built-in ones are not stored).
    #[serde(default)]
    pub policies: BTreeMap<String, StoredPolicy>,
    /// Namespaces by name; `default` exists without being stored.
    #[serde(default)]
    pub namespaces: BTreeMap<String, Namespace>,
    /// Each job's newest deployments, oldest first, at most
    /// [`DEPLOYMENTS_KEPT`].
    #[serde(default)]
    pub deployments: BTreeMap<String, VecDeque<Deployment>>,
    /// Admitted and unreachable agents by the address they registered with, for finding an
    /// agent that registers again without a scan. Derived from `agents` and `unreachable`.
    #[serde(skip)]
    by_address: BTreeMap<String, Vec<AgentId>>,
    /// Admitted and unreachable agents by the certificate name they are bound to (one, but
    /// for a master that allows more per certificate). Derived from `agents` and
    /// `unreachable`.
    #[serde(skip)]
    by_identity: BTreeMap<String, Vec<AgentId>>,
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

/// The most bytes of a job's earlier versions the registry keeps ([`Job::approximate_size`]),
/// the newest always: four versions of a job at the default size cap of 1 MiB.
pub const JOB_VERSION_BYTES_KEPT: usize = 4 * 1024 * 1024;

impl RegistryState {
    /// The batch slots of `job`'s groups that ran to completion, each with its group's name.
    pub fn finished_slots<'a>(
        &'a self,
        job: &'a Job,
    ) -> impl Iterator<Item = (&'a str, &'a str)> + 'a {
        self.batch_finished
            .get(&job.name)
            .into_iter()
            .flatten()
            .filter_map(|(slot, _)| {
                let group = group_of(&job.name, slot)?;
                job.groups
                    .iter()
                    .any(|g| g.name == group)
                    .then_some((group, slot.as_str()))
            })
    }

    /// Forgets the finished slots of `job`'s groups that went.
    fn drop_outdated_finished(&mut self, job: &str) {
        let Some(stored) = self.jobs.get(job) else {
            return;
        };
        let Some(finished) = self.batch_finished.get_mut(job) else {
            return;
        };
        finished.retain(|slot, _| {
            group_of(job, slot).is_some_and(|group| stored.groups.iter().any(|g| g.name == group))
        });
        if finished.is_empty() {
            self.batch_finished.remove(job);
        }
    }

    /// Keeps `old`, a version just replaced, dropping the oldest past [`JOB_VERSIONS_KEPT`]
    /// versions or [`JOB_VERSION_BYTES_KEPT`] bytes.
    fn keep_version(&mut self, old: Job) {
        let versions = self.job_versions.entry(old.name.clone()).or_default();
        versions.push_back(old);
        let mut bytes: usize = versions.iter().map(Job::approximate_size).sum();
        while versions.len() > JOB_VERSIONS_KEPT
            || (versions.len() > 1 && bytes > JOB_VERSION_BYTES_KEPT)
        {
            if let Some(dropped) = versions.pop_front() {
                bytes = bytes.saturating_sub(dropped.approximate_size());
            }
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
    batch_finished: BTreeMap<String, BTreeMap<String, u64>>,
    #[serde(default)]
    evals: BTreeMap<EvalId, Evaluation>,
    #[serde(default)]
    acl_bootstrapped: bool,
    #[serde(default)]
    acl_bootstrap_index: u64,
    #[serde(default)]
    tokens: BTreeMap<String, AclToken>,
    #[serde(default)]
    policies: BTreeMap<String, StoredPolicy>,
    #[serde(default)]
    namespaces: BTreeMap<String, Namespace>,
    #[serde(default)]
    deployments: BTreeMap<String, VecDeque<Deployment>>,
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
            batch_finished: contents.batch_finished,
            evals: contents.evals,
            ended: BTreeMap::new(),
            token_table: TokenTable::new(contents.tokens.values().cloned()),
            acl_bootstrapped: contents.acl_bootstrapped,
            acl_bootstrap_index: contents.acl_bootstrap_index,
            tokens: contents.tokens,
            policies: contents.policies,
            namespaces: contents.namespaces,
            deployments: contents.deployments,
            by_address: BTreeMap::new(),
            by_identity: BTreeMap::new(),
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

    /// The admitted and unreachable agents bound to the certificate named `identity`, by id.
    pub fn agents_of_certificate(&self, identity: &str) -> &[AgentId] {
        self.by_identity.get(identity).map_or(&[], Vec::as_slice)
    }

    /// Rebuilds the indexes of agents by address and by certificate from `agents` and
    /// `unreachable`.
    fn index_addresses(&mut self) {
        self.by_address = BTreeMap::new();
        self.by_identity = BTreeMap::new();
        let infos: Vec<(AgentId, AgentInfo)> = self
            .agents
            .iter()
            .chain(self.unreachable.iter().map(|(id, u)| (id, &u.info)))
            .map(|(id, info)| (id.clone(), info.clone()))
            .collect();
        for (id, info) in infos {
            self.add_address(&id, &info);
        }
    }

    /// Records that `id` registered from `info`'s address with its certificate (the ids of one
    /// address, or one certificate, stay in order: there is rarely more than one).
    fn add_address(&mut self, id: &AgentId, info: &AgentInfo) {
        for (index, key) in [
            (&mut self.by_address, &info.address),
            (&mut self.by_identity, &info.identity),
        ] {
            let ids = index.entry(key.clone()).or_default();
            if let Err(at) = ids.binary_search(id) {
                ids.insert(at, id.clone());
            }
        }
    }

    /// Forgets that `id` registered from `info`'s address with its certificate.
    fn remove_address(&mut self, id: &AgentId, info: &AgentInfo) {
        for (index, key) in [
            (&mut self.by_address, &info.address),
            (&mut self.by_identity, &info.identity),
        ] {
            if let Some(ids) = index.get_mut(key) {
                ids.retain(|known| known != id);
                if ids.is_empty() {
                    index.remove(key);
                }
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
        let mut ended = Vec::with_capacity(evals.len());
        for eval in evals {
            if has_ended(eval.status) {
                ended.push(eval);
            } else {
                self.insert_eval(eval);
            }
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
                self.add_address(&id, &info);
                self.agents.insert(id.clone(), info);
                Ok(Outcome::Admitted(id))
            }
            Op::UpdateAgent { id, info } => {
                let old = match self.unreachable.remove(&id) {
                    Some(unreachable) => Some(unreachable.info),
                    None => None,
                };
                let old = self.agents.insert(id.clone(), info.clone()).or(old);
                if let Some(old) = old {
                    self.remove_address(&id, &old);
                }
                self.add_address(&id, &info);
                Ok(Outcome::Updated)
            }
            Op::MarkUnreachable { id, at_ms, tasks } => {
                let info = self
                    .agents
                    .remove(&id)
                    .ok_or_else(|| OpError::UnknownAgent(id.clone()))?;
                self.unreachable.insert(
                    id.clone(),
                    UnreachableAgent {
                        info,
                        marked_at_ms: at_ms,
                        tasks,
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
                    self.remove_address(&id, info);
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
            Op::UpsertJob(job) => self
                .upsert_job(job)
                .map(|version| Outcome::JobStored { version }),
            Op::BatchSlotsFinished { job, slots } => {
                if !self.jobs.contains_key(&job) {
                    return Err(OpError::UnknownJob(job));
                }
                let count = slots.len();
                self.batch_finished.entry(job).or_default().extend(slots);
                Ok(Outcome::SlotsRecorded(count))
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
                mut ids,
                status,
                description,
            } => {
                // In key order, each removal walks the nodes the one before it just walked
                // (a storm's cancellations take thousands at once from tens of thousands).
                ids.sort_unstable();
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
                self.cancel_deployments(&name, "the job was stopped", index);
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
                    return Err(OpError::AclAlreadyBootstrapped {
                        reset_index: self.acl_bootstrap_index,
                    });
                }
                self.acl_bootstrapped = true;
                self.acl_bootstrap_index = index;
                self.put_token(token);
                Ok(Outcome::TokenStored)
            }
            Op::BootstrapAclAgain { token, reset_index } => {
                if self.acl_bootstrapped && reset_index != self.acl_bootstrap_index {
                    return Err(OpError::AclAlreadyBootstrapped {
                        reset_index: self.acl_bootstrap_index,
                    });
                }
                self.acl_bootstrapped = true;
                self.acl_bootstrap_index = index;
                self.put_token(token);
                Ok(Outcome::TokenStored)
            }
            Op::CreateToken(token) => {
                self.put_token(token);
                Ok(Outcome::TokenStored)
            }
            Op::DeleteToken { accessor } => self.delete_token(accessor),
            Op::ApplyPolicy(policy) => Ok(self.apply_policy(policy)),
            Op::DeletePolicy(name) => self.delete_policy(name),
            Op::ApplyNamespace(namespace) => Ok(self.apply_namespace(namespace)),
            Op::DeleteNamespace(name) => self.delete_namespace(name),
            Op::StartDeployment { job, at_ms, revert } => {
                self.start_deployment(&job, at_ms, revert, index)
            }
            Op::ChangeDeployment { id, change } => self.change_deployment(&id, change, index),
            Op::FailDeployment {
                id,
                description,
                revert,
                at_ms,
            } => self.fail_deployment(&id, description, revert, at_ms, index),
        }
    }
}

impl RegistryState {
    /// Stores `job`, new or changed, at its next version (kept earlier versions, finished
    /// batch slots of groups it no longer has dropped); its version.
    pub(crate) fn upsert_job(&mut self, job: Job) -> Result<u64, OpError> {
        self.check_job_namespace(&job.name)?;
        let job = next_version(self.jobs.get(&job.name), job);
        let version = job.version;
        let name = job.name.clone();
        if let Some(old) = self.jobs.insert(job.name.clone(), job) {
            self.keep_version(old);
        }
        self.drop_outdated_finished(&name);
        Ok(version)
    }
}

/// The group a slot of `job` belongs to: `web` in `job.web[3]`.
fn group_of<'a>(job: &str, slot: &'a str) -> Option<&'a str> {
    let rest = slot.strip_prefix(job)?.strip_prefix('.')?;
    let end = rest.rfind('[')?;
    Some(&rest[..end])
}

#[cfg(test)]
mod tests;
