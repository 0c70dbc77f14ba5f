//! The configuration reference: a program's settings as a Markdown table, rendered from the
//! same clap command as `--help` ([`reference`]), and the check that keeps the copy in the docs
//! up to date ([`check_reference`]).

use std::fmt;
use std::path::Path;

use anyhow::{Context as _, bail};
use clap::ArgAction;
use serde::de::{self, DeserializeOwned, Deserializer, Visitor};

use super::Command;

/// The keys serde reads a struct `T` from, aliases included, in order; empty if `T` is no
/// struct. The reference takes the file keys from here, so that it shows what the file takes.
pub fn keys_of<T: DeserializeOwned>() -> &'static [&'static str] {
    /// Records the fields a struct asks for, then stops it.
    struct Keys(&'static [&'static str]);

    /// Why [`Keys`] stops: it is no real input.
    #[derive(Debug)]
    struct Stop;

    impl fmt::Display for Stop {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("only the keys are read")
        }
    }

    impl std::error::Error for Stop {}

    impl de::Error for Stop {
        fn custom<M: fmt::Display>(_: M) -> Self {
            Stop
        }
    }

    impl<'de> Deserializer<'de> for &mut Keys {
        type Error = Stop;

        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
            Err(Stop)
        }

        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Stop> {
            self.0 = fields;
            Err(Stop)
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
            identifier ignored_any
        }
    }

    let mut keys = Keys(&[]);
    let _ = T::deserialize(&mut keys);
    keys.0
}

/// The reference of `command`'s settings, in Markdown: its about, then a table of each flag,
/// its key in the config file, its default and what it sets, all as `--help` shows them (the
/// default is split from the end of the help). Keys are those serde reads `S` from; `tables`
/// are its nested tables, each a name and its keys: an argument whose id is a key, or the
/// table's name, `_` and a key, is `table.key`. One that has no key is a flag only.
pub fn reference<S: DeserializeOwned>(command: &Command, tables: &[(&str, &[&str])]) -> String {
    let keys = keys_of::<S>();
    let mut command = command.clone();
    command.build();
    let mut out = format!("## `{}`\n\n", command.get_name());
    if let Some(about) = command.get_about() {
        let about = about.to_string();
        out.push_str(&escape(&about));
        // clap drops the full stop of a one-line doc comment.
        if !about.ends_with(['.', '!', '?', ')']) {
            out.push('.');
        }
        out.push_str("\n\n");
    }
    out.push_str("| flag | config file key | default | what it sets |\n|---|---|---|---|\n");
    for arg in command.get_arguments() {
        let id = arg.get_id().as_str();
        let Some(long) = arg.get_long() else {
            continue;
        };
        if arg.is_hide_set() || matches!(id, "help" | "version") {
            continue;
        }
        let takes_value = arg.get_action().takes_values()
            && arg
                .get_num_args()
                .is_none_or(|range| range.max_values() > 0);
        let mut flag = format!("`--{long}");
        if takes_value {
            let names = arg
                .get_value_names()
                .map(|names| names.iter().map(ToString::to_string).collect::<Vec<_>>())
                .unwrap_or_else(|| vec![id.to_uppercase()]);
            flag.push_str(&format!(" <{}>`", names.join("> <")));
        } else {
            flag.push('`');
        }
        if matches!(arg.get_action(), ArgAction::Append) {
            flag.push_str(", repeatable");
        }
        let key = file_key(id, keys, tables)
            .map_or_else(|| "none: a flag only".to_owned(), |key| format!("`{key}`"));
        let help = arg
            .get_long_help()
            .or_else(|| arg.get_help())
            .map(ToString::to_string)
            .unwrap_or_default();
        let (what, default) = split_default(&help);
        let default = match default {
            None => String::new(),
            Some(text) if text.contains(char::is_whitespace) => escape(text),
            Some(text) => format!("`{text}`"),
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            flag.replace('|', "\\|"),
            key,
            default,
            escape(what)
        ));
    }
    out
}

/// The file key of the argument `id`: itself, or in one of `tables` (see [`reference`]).
fn file_key(id: &str, keys: &[&str], tables: &[(&str, &[&str])]) -> Option<String> {
    if keys.contains(&id) {
        return Some(id.to_owned());
    }
    tables.iter().find_map(|(table, keys)| {
        let key = id
            .strip_prefix(table)
            .and_then(|rest| rest.strip_prefix('_'))
            .filter(|key| keys.contains(key))
            .or_else(|| keys.contains(&id).then_some(id))?;
        Some(format!("{table}.{key}"))
    })
}

/// A help text without its trailing `[default: …]`, and that default.
fn split_default(help: &str) -> (&str, Option<&str>) {
    help.strip_suffix(']')
        .and_then(|rest| rest.rsplit_once("[default: "))
        .map_or((help.trim(), None), |(what, default)| {
            (what.trim(), Some(default.trim()))
        })
}

/// Text for a Markdown table cell: `|` escaped, and `<` outside code spans (it would start an
/// HTML tag); line breaks become spaces.
fn escape(text: &str) -> String {
    text.split('`')
        .enumerate()
        .map(|(i, part)| {
            let part = part.replace('|', "\\|").replace('\n', " ");
            if i % 2 == 0 {
                part.replace('<', "&lt;")
            } else {
                part
            }
        })
        .collect::<Vec<_>>()
        .join("`")
}

/// Checks that the section `section` of the Markdown file at `path` (the lines between
/// `<!-- begin SECTION -->` and `<!-- end SECTION -->`) is `text`; or, when the variable
/// `MUSTER_BLESS` is `1`, writes it there (adding the section at the end if the file lacks
/// it, creating the file if need be).
///
/// # Errors
/// The section differs or is missing (naming the first line that differs, and how to write
/// it anew), or the file cannot be read or written.
pub fn check_reference(path: &Path, section: &str, text: &str) -> anyhow::Result<()> {
    let bless = std::env::var_os("MUSTER_BLESS").is_some_and(|value| value == "1");
    let current = match std::fs::read_to_string(path) {
        Ok(current) => current,
        Err(error) if bless && error.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(error) => {
            return Err(error).with_context(|| format!("cannot read {}", path.display()));
        }
    };
    if bless {
        let blessed = splice(&current, section, text);
        if blessed != current {
            std::fs::write(path, blessed)
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
        return Ok(());
    }
    let hint = "write it anew with MUSTER_BLESS=1 and the same test";
    let Some((inner, stop)) = find_section(&current, section) else {
        bail!("{} has no section {section}: {hint}", path.display());
    };
    let written = &current[inner..stop];
    if written != text {
        let line = written
            .lines()
            .zip(text.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| written.lines().count().min(text.lines().count()));
        bail!(
            "the section {section} of {} is out of date (from its line {}: it has {:?}, --help \
             gives {:?}): {hint}",
            path.display(),
            line + 1,
            written.lines().nth(line).unwrap_or(""),
            text.lines().nth(line).unwrap_or(""),
        );
    }
    Ok(())
}

/// Where the lines of `section` are in `text`: from after its begin marker to its end marker.
fn find_section(text: &str, section: &str) -> Option<(usize, usize)> {
    let begin = format!("<!-- begin {section} -->\n");
    let end = format!("<!-- end {section} -->\n");
    let inner = text.find(&begin)? + begin.len();
    let stop = inner + text[inner..].find(&end)?;
    Some((inner, stop))
}

/// `current` with the lines of `section` replaced by `text`, or with the section added at the
/// end.
pub(super) fn splice(current: &str, section: &str, text: &str) -> String {
    match find_section(current, section) {
        Some((inner, stop)) => format!("{}{text}{}", &current[..inner], &current[stop..]),
        None => {
            let before = current.trim_end_matches('\n');
            let gap = if before.is_empty() { "" } else { "\n\n" };
            format!("{before}{gap}<!-- begin {section} -->\n{text}<!-- end {section} -->\n")
        }
    }
}
