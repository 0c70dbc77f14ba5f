//! What each caller may see and touch, namespace by namespace: the one place the operator API
//! (and so the HTTP API, which calls it) checks a call's namespace against the caller's
//! policies, keeps out of an answer what the caller may not read, and redacts environment
//! values where it may not read secrets.
//!
//! The guard has already checked that the caller may make the call at all (see
//! [`authorization`](crate::authorization)); here each job, task, evaluation and event is
//! checked against its own namespace.

use muster_api::REDACTED;
use muster_model::namespace::{DEFAULT_NAMESPACE, namespace_of};
use muster_proto::cluster as pb;
use muster_proto::model as model_pb;
use muster_security::{Access, Caller, Capability};
use tonic::{Request, Status};

/// Who made the call: the caller the guard found, or, for a call that did not pass a guard
/// (in-process, or an insecure cluster's), anyone allowed everything.
pub(crate) fn caller_of<T>(request: &Request<T>) -> Caller {
    request
        .extensions()
        .get::<Caller>()
        .cloned()
        .unwrap_or_else(Caller::insecure)
}

/// A namespace as a request names it: empty is `default`.
pub(crate) fn namespace_or_default(namespace: &str) -> &str {
    if namespace.is_empty() {
        DEFAULT_NAMESPACE
    } else {
        namespace
    }
}

/// Refuses the call unless `caller` may do `capability` in `namespace`.
///
/// # Errors
/// `PERMISSION_DENIED` naming the token, the capability and the namespace.
pub(crate) fn require(
    caller: &Caller,
    capability: Capability,
    namespace: &str,
) -> Result<(), Status> {
    if caller.allows(capability, namespace) {
        Ok(())
    } else {
        Err(caller.refusal(capability, namespace))
    }
}

/// The namespaces a list or stream shows.
#[derive(Clone, Debug)]
pub enum NamespaceFilter {
    /// Every namespace (an in-process call).
    All,
    /// One namespace, which the caller may read.
    One(String),
    /// Every namespace the caller may read jobs in (`?namespace=*`).
    Readable(Caller),
}

impl NamespaceFilter {
    /// The filter for a request naming `namespace` (empty: `default`, `*`: every namespace
    /// the caller may read).
    ///
    /// # Errors
    /// `PERMISSION_DENIED` if it names one the caller may not read.
    pub(crate) fn for_request(caller: &Caller, namespace: &str) -> Result<NamespaceFilter, Status> {
        if namespace == "*" {
            return Ok(NamespaceFilter::Readable(caller.clone()));
        }
        let namespace = namespace_or_default(namespace);
        require(caller, Capability::ReadJob, namespace)?;
        Ok(NamespaceFilter::One(namespace.to_owned()))
    }

    /// Whether it shows what belongs to `namespace`.
    pub fn admits(&self, namespace: &str) -> bool {
        match self {
            NamespaceFilter::All => true,
            NamespaceFilter::One(one) => one == namespace,
            NamespaceFilter::Readable(caller) => caller.allows(Capability::ReadJob, namespace),
        }
    }

    /// Whether it shows the job (or evaluation, or task) whose id or name begins with `id`.
    pub fn admits_job(&self, id: &str) -> bool {
        self.admits(namespace_of(id))
    }
}

/// The id of job `name` (or of a deployment of it, `name.vN`) in `namespace`: refused if
/// the name carries a namespace of its own (`team-a:web`), which would reach past the one the
/// caller's rights were checked in.
pub(crate) fn job_in(namespace: &str, name: &str) -> Result<String, Status> {
    if name.contains(muster_model::namespace::SEPARATOR) {
        return Err(Status::invalid_argument(format!(
            "{name:?}: name the namespace with `namespace` (--namespace), not in the name"
        )));
    }
    Ok(muster_model::namespace::job_id(namespace, name))
}

/// A task's namespace: its job's (named apart, or carried by the job's id), or, for a task
/// launched by hand without a job, its id's (`LaunchTask` sees that it is its framework's).
pub(crate) fn task_namespace(task: &model_pb::Task) -> &str {
    if task.namespace.is_empty() {
        muster_model::task_namespace(&task.job, &task.id)
    } else {
        &task.namespace
    }
}

/// Every environment value of `task` read as [`REDACTED`].
pub(crate) fn redact_task(task: &mut model_pb::Task) {
    for value in task.env.values_mut() {
        REDACTED.clone_into(value);
    }
}

/// Every environment value of `job`'s groups read as [`REDACTED`].
pub(crate) fn redact_job(job: &mut model_pb::Job) {
    for group in &mut job.groups {
        for value in group.env.values_mut() {
            REDACTED.clone_into(value);
        }
    }
}

/// Keeps `tasks` the caller may read, redacting those whose secrets it may not read.
fn show_tasks(caller: &Caller, tasks: &mut Vec<model_pb::Task>) {
    tasks.retain(|task| caller.allows(Capability::ReadJob, task_namespace(task)));
    for task in tasks {
        if !caller.allows(Capability::ReadSecrets, task_namespace(task)) {
            redact_task(task);
        }
    }
}

/// The cluster's state as `caller` may see it: agents if it may read agents or some
/// namespace's jobs (to see where they run), their tasks and frameworks of the namespaces it
/// may read, environments redacted where it may not read secrets.
pub(crate) fn show_state(caller: &Caller, state: &mut pb::ClusterState) {
    let sees_agents =
        caller.acl.agent() >= Access::Read || caller.acl.allows_somewhere(Capability::ReadJob);
    if !sees_agents {
        state.agents.clear();
        state.unreachable.clear();
    }
    for agent in &mut state.agents {
        show_tasks(caller, &mut agent.tasks);
        show_tasks(caller, &mut agent.completed_tasks);
    }
    for agent in &mut state.unreachable {
        show_tasks(caller, &mut agent.tasks);
    }
    state
        .frameworks
        .retain(|framework| caller.allows(Capability::ReadJob, namespace_of(&framework.id)));
}

/// A job's status as `caller` may see it, in `namespace` (which it may read): environments
/// redacted unless it may read secrets there.
pub(crate) fn show_job_status(caller: &Caller, namespace: &str, status: &mut pb::JobStatusReply) {
    if !caller.allows(Capability::ReadSecrets, namespace) {
        status.job.iter_mut().for_each(redact_job);
        status
            .tasks
            .iter_mut()
            .filter_map(|t| t.task.as_mut())
            .for_each(redact_task);
    }
}

/// A job's versions as `caller` may see them, in `namespace` (which it may read).
pub(crate) fn show_job_versions(
    caller: &Caller,
    namespace: &str,
    versions: &mut pb::JobVersionList,
) {
    if !caller.allows(Capability::ReadSecrets, namespace) {
        versions.versions.iter_mut().for_each(redact_job);
    }
}

/// Whether an event about something in `namespace` (`None`: an agent) reaches `caller`, and
/// whether with its secrets.
pub(crate) fn event_visibility(caller: &Caller, namespace: Option<&str>) -> Option<bool> {
    match namespace {
        None => (caller.acl.agent() >= Access::Read).then_some(true),
        Some(namespace) => caller
            .allows(Capability::ReadJob, namespace)
            .then(|| caller.allows(Capability::ReadSecrets, namespace)),
    }
}
