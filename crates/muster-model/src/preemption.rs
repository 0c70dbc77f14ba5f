//! Preemption: a plan may stop tasks of lower-priority jobs so that a higher-priority job's
//! task fits, where the cluster's [`PreemptionConfig`] allows it for the job's type: off for
//! service and batch jobs and on for system jobs by default, as in Nomad.

use serde::{Deserialize, Serialize};

use crate::job::SchedulerType;

/// Which job types may preempt lower-priority tasks (Nomad's `preemption_config`). An
/// operator setting of the masters, handed to every scheduler with its snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreemptionConfig {
    /// Service jobs may preempt.
    pub service: bool,
    /// Batch jobs may preempt.
    pub batch: bool,
    /// System jobs may preempt (a system job's task belongs on every agent).
    pub system: bool,
}

impl Default for PreemptionConfig {
    /// System jobs only.
    fn default() -> Self {
        PreemptionConfig {
            service: false,
            batch: false,
            system: true,
        }
    }
}

impl PreemptionConfig {
    /// Whether jobs of type `kind` may preempt.
    pub fn allows(&self, kind: SchedulerType) -> bool {
        match kind {
            SchedulerType::Service => self.service,
            SchedulerType::Batch => self.batch,
            SchedulerType::System => self.system,
        }
    }

    /// Reads a list of job types (`system,service`; `none` or empty for none).
    ///
    /// # Errors
    /// The first word that is not a job type, named.
    pub fn parse(list: &str) -> Result<PreemptionConfig, String> {
        let mut config = PreemptionConfig {
            service: false,
            batch: false,
            system: false,
        };
        for word in list.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            match word {
                "none" => {}
                "service" => config.service = true,
                "batch" => config.batch = true,
                "system" => config.system = true,
                other => {
                    return Err(format!(
                        "{other:?} is not a job type (service, batch, system, or none)"
                    ));
                }
            }
        }
        Ok(config)
    }
}

impl std::fmt::Display for PreemptionConfig {
    /// The list [`parse`](Self::parse) reads: `service,system`, or `none`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kinds: Vec<&str> = SchedulerType::ALL
            .into_iter()
            .filter(|kind| self.allows(*kind))
            .map(SchedulerType::name)
            .collect();
        if kinds.is_empty() {
            f.write_str("none")
        } else {
            f.write_str(&kinds.join(","))
        }
    }
}

impl std::str::FromStr for PreemptionConfig {
    type Err = String;

    fn from_str(list: &str) -> Result<Self, String> {
        PreemptionConfig::parse(list)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_jobs_preempt_by_default_and_a_list_says_which_others_do() {
        let default = PreemptionConfig::default();
        assert!(default.allows(SchedulerType::System));
        assert!(!default.allows(SchedulerType::Service) && !default.allows(SchedulerType::Batch));
        let listed = PreemptionConfig::parse("service, system");
        assert_eq!(
            listed,
            Ok(PreemptionConfig {
                service: true,
                batch: false,
                system: true
            })
        );
        assert_eq!(
            PreemptionConfig::parse("none").map(|c| c.allows(SchedulerType::System)),
            Ok(false)
        );
        assert_eq!(default.to_string(), "system");
        assert_eq!(
            PreemptionConfig::parse(&listed.clone().unwrap_or_default().to_string()),
            listed
        );
        let bad = PreemptionConfig::parse("service,cron").expect_err("cron is no type");
        assert!(bad.contains("\"cron\""), "{bad}");
    }
}
