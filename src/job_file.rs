//! The TOML form of a job (`muster job run FILE`), read into the wire form
//! (`muster.model.v1.Job`) through [`muster_api::JobSpec`].

use std::path::Path;

use anyhow::Context as _;
use muster::proto::model as pb;
use muster_api::JobSpec;

/// Reads a job file (the TOML form of [`JobSpec`], the document `POST /v1/jobs` takes as
/// JSON), in the file's `namespace`, else in `namespace` (`--namespace`). The master validates
/// the job; this only checks the file's shape and its words (`type`, `operator`), and its
/// errors name the file and the key.
pub(crate) fn read(path: &Path, namespace: &str) -> anyhow::Result<pb::Job> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the job file {}", path.display()))?;
    let mut job = parse(&text).with_context(|| format!("bad job file {}", path.display()))?;
    if job.namespace.is_empty() {
        namespace.clone_into(&mut job.namespace);
    }
    Ok(job)
}

fn parse(text: &str) -> anyhow::Result<pb::Job> {
    Ok(JobSpec::from_toml(text)?.to_proto()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_job_parses() -> anyhow::Result<()> {
        let spec = read(
            Path::new(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/examples/jobs/hello.toml"
            )),
            "default",
        )?;
        assert_eq!(spec.name, "hello");
        assert_eq!(spec.scheduler, pb::SchedulerType::Batch as i32);
        assert_eq!(spec.groups[0].count, 1);
        assert_eq!(spec.groups[0].env["MUSTER_GREETING"], "one");
        Ok(())
    }

    #[test]
    fn the_custom_scheduler_example_names_its_scheduler() -> anyhow::Result<()> {
        let spec = read(
            Path::new(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/examples/jobs/fewest-tasks.toml"
            )),
            "default",
        )?;
        assert_eq!(spec.scheduler, pb::SchedulerType::Service as i32);
        assert_eq!(spec.scheduler_name, "fewest-tasks");
        // The model reads it as named, and refuses another type's built-in scheduler.
        let job = muster_model::Job::from_submitted(spec.clone())?;
        assert_eq!(job.scheduler_name(), "fewest-tasks");
        let batch = pb::Job {
            scheduler_name: "batch".into(),
            ..spec
        };
        let refused = muster_model::Job::from_submitted(batch).expect_err("batch is not service's");
        assert_eq!(refused.field(), "scheduler");
        assert!(
            refused
                .problem()
                .contains("built-in scheduler of batch jobs"),
            "{refused}"
        );
        Ok(())
    }

    #[test]
    fn the_placement_example_parses() -> anyhow::Result<()> {
        let spec = read(
            Path::new(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/examples/jobs/web.toml"
            )),
            "default",
        )?;
        let group = &spec.groups[0];
        assert_eq!(
            group.constraints[0].op,
            pb::ConstraintOp::DistinctHosts as i32
        );
        assert_eq!(group.spreads[0].attribute, "zone");
        assert_eq!(group.spreads[0].weight, 100);
        assert_eq!(group.ports[0].label, "http");
        assert_eq!(group.kill_timeout_ms, Some(10_000));
        assert_eq!(group.restart.as_ref().map(|r| r.attempts), Some(2));
        assert_eq!(group.reschedule.as_ref().map(|r| r.unlimited), Some(true));
        // And the master would take it.
        muster::model::Job::from_submitted(spec.clone())?;
        Ok(())
    }

    #[test]
    fn a_group_may_name_its_user() -> anyhow::Result<()> {
        let spec = parse(
            "name = \"web\"\n[[group]]\nname = \"g\"\ncommand = \"sleep\"\ncpus = 0.1\nmem_mb = 8\nuser = \"daemon\"\n",
        )?;
        assert_eq!(spec.groups[0].user, "daemon");
        Ok(())
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: std::env::var("MUSTER_FUZZ_CASES")
                .ok()
                .and_then(|cases| cases.parse().ok())
                .unwrap_or(2_000),
            failure_persistence: None,
            ..proptest::prelude::ProptestConfig::default()
        })]

        /// Any text, or the example file with a slice of it replaced, parses or answers an
        /// error; never a panic.
        #[test]
        fn any_job_file_parses_or_is_refused(
            text in "\\PC{0,200}",
            cut in 0usize..600,
            patch in "[a-z0-9_=\\[\\]\" .{}\n-]{0,30}",
        ) {
            let _ = parse(&text);
            let example = include_str!("../examples/jobs/hello.toml");
            let at = example.char_indices().map(|(i, _)| i).nth(cut % example.chars().count()).unwrap_or(0);
            let mut patched = example[..at].to_owned();
            patched.push_str(&patch);
            patched.push_str(&example[at..]);
            let _ = parse(&patched);
        }
    }

    #[test]
    fn unknown_and_missing_keys_are_named() {
        let unknown = parse(
            "name = \"x\"\n[[group]]\nname = \"g\"\ncommand = \"c\"\ncpus = 1\nmem_mb = 1\ncuont = 2\n",
        );
        let text = format!("{:#}", unknown.expect_err("unknown key"));
        assert!(text.contains("cuont"), "{text}");
        let missing = parse("name = \"x\"\n[[group]]\nname = \"g\"\ncpus = 1\nmem_mb = 1\n");
        let text = format!("{:#}", missing.expect_err("missing command"));
        assert!(text.contains("command"), "{text}");
        let kind = parse("name = \"x\"\ntype = \"cron\"\n");
        let text = format!("{:#}", kind.expect_err("unknown type"));
        assert!(text.contains("type") && text.contains("cron"), "{text}");
        let op = parse(
            "name = \"x\"\n[[group]]\nname = \"g\"\ncommand = \"c\"\ncpus = 1\nmem_mb = 1\n[[group.constraint]]\nattribute = \"rack\"\noperator = \"~\"\nvalue = \"r1\"\n",
        );
        let text = format!("{:#}", op.expect_err("unknown operator"));
        assert!(text.contains("group[0].constraint[0].operator"), "{text}");
    }
}
