//! No import circle inside a crate: within each crate's `src/`, the top-level modules (a file
//! `x.rs` together with its folder `x/`) import each other along a graph without a cycle, so
//! each can be read, and moved, above the ones it uses. An import is a path through `crate::`,
//! or through `super::` that climbs out of the module's own top-level module; a file's test
//! module (from its `#[cfg(test)]` on, or its `tests.rs`) and comments are not read.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::Context as _;

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let entry = entry?;
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            rust_files(&path, found)?;
        } else if path.extension().is_some_and(|e| e == "rs")
            // A module's tests in a file of their own are its test module.
            && path.file_name().is_some_and(|n| n != "tests.rs")
        {
            found.push(path);
        }
    }
    Ok(())
}

/// A file's module path under `src/`: `src/master/agents.rs` is `["master", "agents"]`
/// (`mod.rs` names its folder); the crate's root (`lib.rs`, `main.rs`) is empty.
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(src).unwrap_or(file);
    let mut parts: Vec<String> = relative
        .iter()
        .map(|part| part.to_string_lossy().trim_end_matches(".rs").to_owned())
        .collect();
    if parts.last().is_some_and(|last| last == "mod") {
        parts.pop();
    }
    if parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main") {
        parts.clear();
    }
    parts
}

/// The text of a file that counts: up to its test module, without comments.
fn code_of(text: &str) -> String {
    let mut code = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with("#[cfg(test)]") {
            break;
        }
        let line = line.split("//").next().unwrap_or_default();
        code.push_str(line);
        code.push('\n');
    }
    code
}

/// The identifier starting at `text`'s beginning (after spaces).
fn identifier(text: &str) -> Option<&str> {
    let text = text.trim_start();
    let end = text
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(text.len());
    (end > 0).then(|| &text[..end])
}

/// The first segments of the paths that `prefix::` (at `text`'s start) leads to: one, or each
/// item's of a `{...}` group.
fn first_segments(text: &str) -> Vec<&str> {
    let text = text.trim_start();
    let Some(group) = text.strip_prefix('{') else {
        return identifier(text).into_iter().collect();
    };
    let mut found = Vec::new();
    let mut depth = 0usize;
    let mut start = 0usize;
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                found.extend(identifier(&group[start..i]));
                break;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                found.extend(identifier(&group[start..i]));
                start = i + 1;
            }
            _ => {}
        }
    }
    found
}

/// The top-level modules `code` (of the module at `path`) imports through `crate::` or a
/// `super::` that climbs out of its own top-level module.
fn imported_units(code: &str, path: &[String]) -> BTreeSet<String> {
    let mut units = BTreeSet::new();
    let bytes = code.as_bytes();
    for (at, _) in code.match_indices("crate::") {
        if at > 0
            && (bytes[at - 1] == b'$'
                || bytes[at - 1].is_ascii_alphanumeric()
                || bytes[at - 1] == b'_')
        {
            continue;
        }
        for first in first_segments(&code[at + "crate::".len()..]) {
            units.insert(first.to_owned());
        }
    }
    let mut at = 0;
    while let Some(found) = code[at..].find("super::") {
        let start = at + found;
        at = start + "super::".len();
        if start > 0 && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b':') {
            continue; // the second `super::` of a chain, read with the first
        }
        let mut climbs = 1;
        let mut rest = &code[at..];
        while let Some(after) = rest.strip_prefix("super::") {
            climbs += 1;
            rest = after;
        }
        // A module at depth d climbing k levels lands at depth d - k: out of its top-level
        // module when that is 0 (the crate root, then the first segment names the unit).
        if path.len() == climbs {
            for first in first_segments(rest) {
                units.insert(first.to_owned());
            }
        }
    }
    units
}

/// A cycle in `graph`, if there is one, as the units along it.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        unit: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, bool>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match state.get(unit) {
            Some(true) => {
                let from = stack.iter().position(|u| u == unit).unwrap_or(0);
                let mut cycle = stack[from..].to_vec();
                cycle.push(unit.to_owned());
                return Some(cycle);
            }
            Some(false) => return None,
            None => {}
        }
        state.insert(unit.to_owned(), true);
        stack.push(unit.to_owned());
        for next in graph.get(unit).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, state, stack) {
                return Some(cycle);
            }
        }
        stack.pop();
        state.insert(unit.to_owned(), false);
        None
    }
    let mut state = BTreeMap::new();
    for unit in graph.keys() {
        if let Some(cycle) = visit(unit, graph, &mut state, &mut Vec::new()) {
            return Some(cycle);
        }
    }
    None
}

/// Each crate's top-level modules and what each imports of the others.
fn crate_graphs() -> anyhow::Result<BTreeMap<String, BTreeMap<String, BTreeSet<String>>>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut crates = vec![root.to_owned()];
    for entry in std::fs::read_dir(root.join("crates"))? {
        crates.push(entry?.path());
    }
    let mut graphs = BTreeMap::new();
    for dir in crates {
        let src = dir.join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files)?;
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for file in &files {
            let path = module_path(&src, file);
            let Some(unit) = path.first() else { continue };
            graph.entry(unit.clone()).or_default();
        }
        let units: BTreeSet<String> = graph.keys().cloned().collect();
        for file in &files {
            let path = module_path(&src, file);
            let Some(unit) = path.first().cloned() else {
                continue;
            };
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("cannot read {}", file.display()))?;
            let imported = imported_units(&code_of(&text), &path);
            let edges = graph.entry(unit.clone()).or_default();
            edges.extend(
                imported
                    .into_iter()
                    .filter(|other| *other != unit && units.contains(other)),
            );
        }
        let name = dir
            .file_name()
            .map_or_else(|| "?".to_owned(), |n| n.to_string_lossy().into_owned());
        graphs.insert(name, graph);
    }
    Ok(graphs)
}

#[test]
fn no_crate_has_an_import_circle_between_its_modules() -> anyhow::Result<()> {
    let graphs = crate_graphs()?;
    assert!(graphs.len() >= 12, "crates read: {:?}", graphs.keys());
    let mut circles = Vec::new();
    for (name, graph) in &graphs {
        if let Some(cycle) = find_cycle(graph) {
            circles.push(format!("{name}: {}", cycle.join(" -> ")));
        }
    }
    assert!(circles.is_empty(), "import circles: {circles:#?}");
    Ok(())
}

#[test]
fn the_check_sees_a_circle_through_crate_and_super_paths() {
    let path = |p: &str| p.split('/').map(str::to_owned).collect::<Vec<_>>();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    graph.insert(
        "a".into(),
        imported_units(&code_of("use crate::{b::X, c};\n"), &path("a")),
    );
    graph.insert(
        "b".into(),
        imported_units(
            &code_of("use super::super::a::Y; // crate::c\n"),
            &path("b/inner"),
        ),
    );
    graph.insert("c".into(), BTreeSet::new());
    assert_eq!(graph["a"], ["b", "c"].map(str::to_owned).into());
    assert_eq!(graph["b"], ["a"].map(str::to_owned).into());
    assert_eq!(find_cycle(&graph), Some(path("a/b/a")));
    graph.insert("b".into(), BTreeSet::new());
    assert_eq!(find_cycle(&graph), None);
}
