//! Namespaces: a job's name is unique within its namespace, and who may see or change it is
//! decided by namespace (Nomad's namespaces).
//!
//! Inside Muster a job is known by its **id**: its name in the `default` namespace (`web`),
//! and `namespace:name` in any other (`team-a:web`). Names and namespaces hold no `:`, so the
//! id is unambiguous, and every record keyed by job (the registry's maps, evaluations, task
//! names `team-a:web.api[0]`, task ids and their directories on agents) carries its
//! namespace without a field of its own. The APIs show the namespace and the name apart.

use serde::{Deserialize, Serialize};

use crate::error::FieldError;
use crate::resources::Resources;

/// The namespace of a job that names none. It always exists.
pub const DEFAULT_NAMESPACE: &str = "default";

/// The longest namespace name.
pub const MAX_NAMESPACE_NAME: usize = 64;

/// What separates a namespace from a job's name in a job id.
pub const SEPARATOR: char = ':';

/// The id of the job `name` in `namespace` (empty: `default`).
pub fn job_id(namespace: &str, name: &str) -> String {
    if namespace.is_empty() || namespace == DEFAULT_NAMESPACE {
        name.to_owned()
    } else {
        format!("{namespace}{SEPARATOR}{name}")
    }
}

/// The namespace and the name of the job whose id is `id`.
pub fn split_job_id(id: &str) -> (&str, &str) {
    match id.split_once(SEPARATOR) {
        Some((namespace, name)) => (namespace, name),
        None => (DEFAULT_NAMESPACE, id),
    }
}

/// The namespace of the job whose id is `id`; also of a task name or task id, which begin
/// with their job's id.
pub fn namespace_of(id: &str) -> &str {
    split_job_id(id).0
}

/// Whether `name` may name a namespace: letters, digits, `-` and `_`, 1 to
/// [`MAX_NAMESPACE_NAME`] characters.
pub fn valid_namespace(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAMESPACE_NAME
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
}

/// Checks a namespace name from outside (a job file, a request).
///
/// # Errors
/// [`FieldError`] on `namespace` naming what is allowed.
pub fn check_namespace(name: &str) -> Result<(), FieldError> {
    if valid_namespace(name) {
        Ok(())
    } else {
        Err(FieldError::new(
            "namespace",
            format!(
                "{name:?} is not a namespace name (letters, digits, '-' and '_', 1 to \
                 {MAX_NAMESPACE_NAME} characters)"
            ),
        ))
    }
}

/// The most a namespace's live tasks may hold together (Nomad's quota specification). A limit
/// left unset is no limit.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Quota {
    /// CPU cores.
    pub cpus: Option<f64>,
    /// Memory in MiB.
    pub mem_mb: Option<u64>,
    /// Tasks.
    pub tasks: Option<u64>,
}

impl Quota {
    /// Whether it sets no limit.
    pub fn is_unlimited(&self) -> bool {
        self.cpus.is_none() && self.mem_mb.is_none() && self.tasks.is_none()
    }

    /// Why `tasks` more tasks needing `more` in all, on top of `used` by `running` live tasks,
    /// would go over this quota; `None` if they fit.
    pub fn exceeded_by(
        &self,
        used: &Resources,
        running: u64,
        more: &Resources,
        tasks: u64,
    ) -> Option<String> {
        let total = used.saturating_add(more);
        if let Some(cpus) = self.cpus
            && total.cpus > cpus + crate::resources::CPU_EPSILON
        {
            return Some(format!(
                "its quota of {cpus} cpus (its tasks would need {:.3})",
                total.cpus
            ));
        }
        if let Some(mem_mb) = self.mem_mb
            && total.mem_mb > mem_mb
        {
            return Some(format!(
                "its quota of {mem_mb} MiB of memory (its tasks would need {})",
                total.mem_mb
            ));
        }
        if let Some(limit) = self.tasks
            && running.saturating_add(tasks) > limit
        {
            return Some(format!(
                "its quota of {limit} tasks (it would have {})",
                running.saturating_add(tasks)
            ));
        }
        None
    }
}

/// The namespace a task counts against: its job's (`job` is its job's id), or for a task
/// launched by hand, without a job, its name's.
pub fn task_namespace<'a>(job: &'a str, name: &'a str) -> &'a str {
    if job.is_empty() {
        namespace_of(name)
    } else {
        namespace_of(job)
    }
}

/// A namespace's live tasks counted against its quota, as a scheduler or the plan applier
/// adds the tasks of one plan: what they hold and how many they are.
#[derive(Clone, Debug, PartialEq)]
pub struct QuotaUsage {
    /// The namespace.
    pub namespace: String,
    /// Its quota.
    pub quota: Quota,
    /// What its live tasks hold.
    pub used: Resources,
    /// How many live tasks it has.
    pub tasks: u64,
}

impl QuotaUsage {
    /// `namespace`, limited by `quota`, with no task counted yet.
    pub fn new(namespace: impl Into<String>, quota: Quota) -> Self {
        QuotaUsage {
            namespace: namespace.into(),
            quota,
            used: Resources::default(),
            tasks: 0,
        }
    }

    /// Counts a live task holding `resources` (one placed, or found running).
    pub fn add(&mut self, resources: &Resources) {
        self.used = self.used.saturating_add(resources);
        self.tasks = self.tasks.saturating_add(1);
    }

    /// Why one more task needing `need` may not be added, naming the namespace and the limit
    /// (`namespace "team-a" is at its quota of 2 tasks (it would have 3)`); `None` if it fits.
    pub fn refusal(&self, need: &Resources) -> Option<String> {
        let reason = self.quota.exceeded_by(&self.used, self.tasks, need, 1)?;
        Some(format!("namespace {:?} is at {reason}", self.namespace))
    }
}

/// A namespace, as the registry stores it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Namespace {
    /// Its name.
    pub name: String,
    /// What it is for, for people.
    #[serde(default)]
    pub description: String,
    /// The most its live tasks may hold.
    #[serde(default)]
    pub quota: Quota,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_id_carries_its_namespace_outside_default() {
        assert_eq!(job_id("default", "web"), "web");
        assert_eq!(job_id("", "web"), "web");
        assert_eq!(job_id("team-a", "web"), "team-a:web");
        assert_eq!(split_job_id("team-a:web"), ("team-a", "web"));
        assert_eq!(split_job_id("web"), ("default", "web"));
        assert_eq!(namespace_of("team-a:web.api[0]-00ab"), "team-a");
        assert_eq!(namespace_of("web.api[0]-00ab"), "default");
        assert!(check_namespace("team:a").is_err());
        assert!(check_namespace("").is_err());
        assert!(check_namespace("team_a-2").is_ok());
    }

    #[test]
    fn a_quota_names_the_limit_a_placement_would_pass() {
        let quota = Quota {
            cpus: Some(2.0),
            mem_mb: None,
            tasks: Some(3),
        };
        let used = Resources {
            cpus: 1.5,
            mem_mb: 100,
        };
        let half = Resources {
            cpus: 0.5,
            mem_mb: 10,
        };
        assert_eq!(quota.exceeded_by(&used, 2, &half, 1), None);
        let over = quota
            .exceeded_by(&used, 2, &half, 2)
            .expect("over in tasks");
        assert!(over.contains("3 tasks"), "{over}");
        let cpus = quota
            .exceeded_by(
                &used,
                0,
                &Resources {
                    cpus: 1.0,
                    mem_mb: 0,
                },
                1,
            )
            .expect("over in cpus");
        assert!(cpus.contains("2 cpus"), "{cpus}");
        assert!(Quota::default().is_unlimited());
    }

    #[test]
    fn a_usage_refuses_the_task_past_its_quota_naming_the_namespace() {
        let quota = Quota {
            tasks: Some(2),
            ..Quota::default()
        };
        let mut usage = QuotaUsage::new("team-a", quota);
        let one = Resources {
            cpus: 1.0,
            mem_mb: 1,
        };
        assert_eq!(usage.refusal(&one), None);
        usage.add(&one);
        usage.add(&one);
        assert_eq!(
            usage.refusal(&one).as_deref(),
            Some("namespace \"team-a\" is at its quota of 2 tasks (it would have 3)")
        );
        assert_eq!(task_namespace("team-a:web", "x"), "team-a");
        assert_eq!(task_namespace("", "team-b:adhoc"), "team-b");
        assert_eq!(task_namespace("", "adhoc"), "default");
    }
}
