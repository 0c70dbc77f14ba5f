//! The shape of the source tree: no `.rs` file under `crates/`, `src/`, `tests/`, `benches/`
//! or `examples/` is over [`MAX_LINES`] lines, unless it is named in [`ONE_JOB`] with the one
//! job it holds. A long file with two jobs is split into modules by job (its tests may move to
//! their own file, `x/tests.rs`; a test module's cases to child modules by topic, beside the
//! harness they share).

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail, ensure};

/// The most lines (as `wc -l` counts them) a `.rs` file may have, unless it is in [`ONE_JOB`].
const MAX_LINES: usize = 800;

/// The folders checked, from the workspace's root.
const ROOTS: [&str; 5] = ["crates", "src", "tests", "benches", "examples"];

/// The files allowed past [`MAX_LINES`], each with the one job it holds ("one job: ...").
/// Keep it short: a file that takes a second job leaves this list by being split.
const ONE_JOB: &[(&str, &str)] = &[];

/// Every `.rs` file under `dir`, but in folders named `target` or starting with a dot.
fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    let entries =
        std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))?;
    for entry in entries {
        let entry = entry.with_context(|| format!("cannot read {}", dir.display()))?;
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if entry.file_type()?.is_dir() {
            if name != "target" && !name.starts_with('.') {
                rust_files(&path, found)?;
            }
        } else if name.ends_with(".rs") {
            found.push(path);
        }
    }
    Ok(())
}

/// The lines of each `.rs` file under [`ROOTS`], by its path from the workspace's root
/// (`/`-separated), sorted.
fn line_counts() -> anyhow::Result<Vec<(String, usize)>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ROOTS {
        rust_files(&root.join(dir), &mut files)?;
    }
    let mut counts = Vec::new();
    for path in files {
        let text =
            std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
        let relative = path.strip_prefix(root)?.components();
        let relative: Vec<_> = relative
            .map(|part| part.as_os_str().to_string_lossy())
            .collect();
        counts.push((
            relative.join("/"),
            text.iter().filter(|&&b| b == b'\n').count(),
        ));
    }
    counts.sort();
    Ok(counts)
}

#[test]
fn no_rust_file_is_over_800_lines_unless_it_holds_one_job() -> anyhow::Result<()> {
    let counts = line_counts()?;
    ensure!(
        counts.len() > 100,
        "only {} .rs files found: is the tree there?",
        counts.len()
    );
    let listed = |path: &str| ONE_JOB.iter().any(|(allowed, _)| *allowed == path);
    let long: Vec<String> = counts
        .iter()
        .filter(|(path, lines)| *lines > MAX_LINES && !listed(path))
        .map(|(path, lines)| format!("{path}: {lines} lines"))
        .collect();
    ensure!(
        long.is_empty(),
        "over {MAX_LINES} lines: split each into modules by job, or, if it truly holds one job, \
         name it in ONE_JOB (tests/it/layout.rs) with that job:\n{}",
        long.join("\n")
    );
    Ok(())
}

#[test]
fn every_file_allowed_to_be_long_is_there_is_long_and_says_its_one_job() -> anyhow::Result<()> {
    let counts = line_counts()?;
    for (path, why) in ONE_JOB {
        let lines = counts
            .iter()
            .find(|(counted, _)| counted == path)
            .map(|(_, lines)| *lines);
        let Some(lines) = lines else {
            bail!("{path} is in ONE_JOB but is no .rs file under {ROOTS:?}: take it out");
        };
        ensure!(
            lines > MAX_LINES,
            "{path} has {lines} lines, no more than {MAX_LINES}: take it out of ONE_JOB"
        );
        ensure!(
            why.starts_with("one job: ") && why.len() > "one job: ".len(),
            "{path}'s reason must say its one job (\"one job: ...\"), not {why:?}"
        );
    }
    Ok(())
}

/// The examples are built as a program outside this repository would build them: against the
/// facade crate `muster` alone (`muster::scheduler::…`), never a workspace crate by its own
/// name (`muster_launch::…`), which such a program would not depend on.
#[test]
fn the_examples_use_only_the_facade_crate() -> anyhow::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut files = Vec::new();
    rust_files(&root, &mut files)?;
    ensure!(files.len() >= 3, "examples not found in {}", root.display());
    let mut reaching = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read {}", file.display()))?;
        for (n, line) in text.lines().enumerate() {
            let inner = line.match_indices("muster_").any(|(at, _)| {
                let before = line[..at].chars().next_back();
                let after = &line[at..];
                !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
                    && after
                        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                        .next()
                        .is_some_and(|word| after[word.len()..].starts_with("::"))
            });
            if inner {
                reaching.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    ensure!(
        reaching.is_empty(),
        "examples reach past the facade crate (use muster::… instead):\n{}",
        reaching.join("\n")
    );
    Ok(())
}
