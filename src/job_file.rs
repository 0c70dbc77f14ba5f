//! The TOML form of a job (`muster job run FILE`), read into the wire form.

use std::collections::HashMap;
use std::path::Path;

use anyhow::Context as _;
use muster::proto::cluster as pb;
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

/// Reads a job file. The master validates the job; this only checks the file's shape, and its
/// errors name the file and the key.
pub(crate) fn read(path: &Path) -> anyhow::Result<pb::JobSpec> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the job file {}", path.display()))?;
    parse(&text).with_context(|| format!("bad job file {}", path.display()))
}

fn parse(text: &str) -> anyhow::Result<pb::JobSpec> {
    let file: JobFile = toml::from_str(text)?;
    Ok(pb::JobSpec {
        name: file.name,
        priority: file.priority,
        r#type: file.kind,
        groups: file
            .groups
            .into_iter()
            .map(|g| pb::TaskGroupSpec {
                name: g.name,
                count: g.count,
                resources: Some(pb::Resources {
                    cpus: g.cpus,
                    mem_mb: g.mem_mb,
                }),
                command: g.command,
                args: g.args,
                env: g.env,
                constraints: g
                    .constraints
                    .into_iter()
                    .map(|c| pb::ConstraintSpec {
                        attribute: c.attribute,
                        operator: c.operator,
                        value: c.value,
                    })
                    .collect(),
            })
            .collect(),
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
        assert_eq!(spec.r#type, "batch");
        assert_eq!(spec.groups[0].count, 1);
        assert_eq!(spec.groups[0].env["MUSTER_GREETING"], "one");
        Ok(())
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
    }
}
