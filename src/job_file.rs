//! The TOML form of a job (`muster job run FILE`), read into the wire form
//! (`muster.model.v1.Job`).

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context as _, bail};
use muster::proto::model as pb;
use serde::Deserialize;

/// A job file: the job's name, type and priority, and its task groups.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JobFile {
    name: String,
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    priority: u32,
    #[serde(rename = "group", default)]
    groups: Vec<GroupFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GroupFile {
    name: String,
    #[serde(default = "one")]
    count: u32,
    command: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: HashMap<String, String>,
    cpus: f64,
    mem_mb: u64,
    #[serde(rename = "constraint", default)]
    constraints: Vec<ConstraintFile>,
    /// The user its tasks run as (the agent must allow it); absent: the agent's task user.
    #[serde(default)]
    user: String,
}

fn one() -> u32 {
    1
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConstraintFile {
    attribute: String,
    #[serde(default)]
    operator: String,
    value: String,
}

/// Reads a job file. The master validates the job; this only checks the file's shape and its
/// words (`type`, `operator`), and its errors name the file and the key.
pub(crate) fn read(path: &Path) -> anyhow::Result<pb::Job> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the job file {}", path.display()))?;
    parse(&text).with_context(|| format!("bad job file {}", path.display()))
}

fn scheduler(kind: &str) -> anyhow::Result<pb::SchedulerType> {
    Ok(match kind {
        "" => pb::SchedulerType::Unspecified,
        "service" => pb::SchedulerType::Service,
        "batch" => pb::SchedulerType::Batch,
        "system" => pb::SchedulerType::System,
        other => bail!("type: {other:?} is not service, batch or system"),
    })
}

fn operator(word: &str, at: &str) -> anyhow::Result<pb::ConstraintOp> {
    Ok(match word {
        "" => pb::ConstraintOp::Unspecified,
        "=" | "==" => pb::ConstraintOp::Equal,
        "!=" => pb::ConstraintOp::NotEqual,
        other => bail!("{at}.operator: {other:?} is not = or !="),
    })
}

fn parse(text: &str) -> anyhow::Result<pb::Job> {
    let file: JobFile = toml::from_str(text)?;
    let mut groups = Vec::with_capacity(file.groups.len());
    for (i, g) in file.groups.into_iter().enumerate() {
        let mut constraints = Vec::with_capacity(g.constraints.len());
        for (c, constraint) in g.constraints.into_iter().enumerate() {
            let op = operator(&constraint.operator, &format!("group[{i}].constraint[{c}]"))?;
            constraints.push(pb::Constraint {
                attribute: constraint.attribute,
                op: op as i32,
                value: constraint.value,
            });
        }
        groups.push(pb::TaskGroup {
            name: g.name,
            count: g.count,
            resources: Some(pb::Resources {
                cpus: g.cpus,
                mem_mb: g.mem_mb,
            }),
            command: g.command,
            args: g.args,
            env: g.env,
            constraints,
            spec_version: 0,
            user: g.user,
        });
    }
    Ok(pb::Job {
        name: file.name,
        priority: file.priority,
        scheduler: scheduler(&file.kind)? as i32,
        groups,
        stopped: false,
        version: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_job_parses() -> anyhow::Result<()> {
        let spec = read(Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/examples/jobs/hello.toml"
        )))?;
        assert_eq!(spec.name, "hello");
        assert_eq!(spec.scheduler, pb::SchedulerType::Batch as i32);
        assert_eq!(spec.groups[0].count, 1);
        assert_eq!(spec.groups[0].env["MUSTER_GREETING"], "one");
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
