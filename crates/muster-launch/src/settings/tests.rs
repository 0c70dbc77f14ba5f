//! The settings' tests: values as written, the file under the flags, and the reference.

use std::time::Duration;

use anyhow::bail;

use super::reference::splice;
use super::*;

#[test]
fn sizes_take_bytes_or_binary_units_and_name_bad_text() {
    let size = |text: &str| text.parse::<ByteSize>().map(u64::from);
    assert_eq!(size("4096"), Ok(4096));
    assert_eq!(size("512KiB"), Ok(512 * 1024));
    assert_eq!(size("10MiB"), Ok(10 * 1024 * 1024));
    assert_eq!(size("10m"), Ok(10 * 1024 * 1024));
    assert_eq!(size("1 GiB"), Ok(1024 * 1024 * 1024));
    assert_eq!(size("7B"), Ok(7));
    for bad in ["", "MiB", "10MB", "ten", "-1", "99999999999999999999GiB"] {
        let Err(error) = size(bad) else {
            panic!("{bad:?} parsed as a size");
        };
        assert!(error.contains(&format!("{bad:?}")), "{error}");
    }
}

#[test]
fn sizes_and_durations_show_as_they_are_written() {
    assert_eq!(ByteSize(10 << 20).to_string(), "10MiB");
    assert_eq!(ByteSize(1536 << 10).to_string(), "1536KiB");
    assert_eq!(ByteSize(1000).to_string(), "1000");
    assert_eq!(ByteSize(0).to_string(), "0");
    assert_eq!(HumanDuration(Duration::from_secs(300)).to_string(), "5m");
    assert_eq!(
        HumanDuration(Duration::from_millis(250)).to_string(),
        "250ms"
    );
    for size in [ByteSize(10 << 20), ByteSize(1000), ByteSize(3 << 30)] {
        assert_eq!(size.to_string().parse::<ByteSize>(), Ok(size));
    }
}

/// Settings of a test program.
#[derive(Debug, Default, Deserialize, clap::Parser)]
#[serde(default, deny_unknown_fields)]
struct Test {
    /// How long.
    #[arg(long)]
    wait: Option<HumanDuration>,
    /// How much.
    #[arg(long)]
    size: Option<ByteSize>,
    /// Pairs.
    #[arg(long = "pair", value_parser = pair)]
    #[serde(deserialize_with = "table")]
    pairs: Vec<(String, String)>,
    /// A list.
    #[arg(long = "item")]
    items: Vec<String>,
    /// Not in the file.
    #[arg(long, num_args = 0, default_missing_value = "true")]
    #[serde(skip)]
    switch: Option<bool>,
    /// A table.
    #[command(flatten)]
    tls: crate::security::TlsFlags,
}

impl Layer for Test {
    fn over(self, lower: Self) -> Self {
        Test {
            wait: self.wait.over(lower.wait),
            size: self.size.over(lower.size),
            pairs: self.pairs.over(lower.pairs),
            items: self.items.over(lower.items),
            switch: self.switch.over(lower.switch),
            tls: self.tls.over(lower.tls),
        }
    }
}

fn pair(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("{text:?} is no pair"))
}

#[test]
fn the_file_takes_what_the_flags_take_and_flags_win() -> anyhow::Result<()> {
    let file: Test = toml::from_str(
        "wait = \"1m\"\nsize = 2048\nitems = [\"a\"]\n[pairs]\nx = \"1\"\ny = \"2\"\n\
         [tls]\ncluster = \"c\"\ninsecure = true\n",
    )?;
    let flags: Test = try_parse_from(
        Test::command(),
        ["test", "--size", "1KiB", "--pair", "y=3", "--switch"],
    )?;
    let merged = flags.over(file);
    assert_eq!(merged.wait, Some(HumanDuration(Duration::from_secs(60))));
    assert_eq!(merged.size, Some(ByteSize(1024)));
    assert_eq!(merged.items, ["a"]);
    assert_eq!(
        merged.pairs.value(),
        Some(BTreeMap::from([
            ("x".to_owned(), "1".to_owned()),
            ("y".to_owned(), "3".to_owned())
        ]))
    );
    assert_eq!(merged.switch, Some(true));
    assert_eq!(merged.tls.cluster.as_deref(), Some("c"));
    assert!(merged.tls.insecure);

    let flags: Test = try_parse_from(Test::command(), ["test", "--item", "b"])?;
    assert_eq!(flags.over(Test::default()).items, ["b"]);
    Ok(())
}

#[test]
fn bad_values_in_the_file_name_the_key() {
    for (text, parts) in [
        ("wait = \"soon\"\n", ["wait", "\"soon\" is not a duration"]),
        ("size = \"lots\"\n", ["size", "\"lots\" is not a size"]),
        ("size = -1\n", ["size", "negative"]),
        ("switch = true\n", ["switch", "unknown field"]),
        ("[tls]\nca_file = \"x\"\n", ["ca_file", "unknown field"]),
    ] {
        let Err(error) = toml::from_str::<Test>(text) else {
            panic!("{text:?} was read");
        };
        let error = error.to_string();
        for part in parts {
            assert!(error.contains(part), "{text:?}: {error}");
        }
    }
}

#[test]
fn the_reference_shows_keys_defaults_and_help() {
    let command = with_defaults(
        Test::command(),
        &[
            ("wait", "5m".to_owned()),
            ("items", "none at all".to_owned()),
        ],
    );
    let reference = reference::<Test>(&command, &[("tls", keys_of::<crate::security::TlsFlags>())]);
    for row in [
        "| `--wait <WAIT>` | `wait` | `5m` | How long |",
        "| `--item <ITEMS>`, repeatable | `items` | none at all | A list |",
        "| `--pair <PAIRS>`, repeatable | `pairs` |  | Pairs |",
        "| `--switch` | none: a flag only |  | Not in the file |",
        "| `--tls-ca <FILE>` | `tls.ca` |",
        "| `--cluster <CLUSTER>` | `tls.cluster` | `global` |",
        "| `--insecure` | `tls.insecure` |  |",
    ] {
        assert!(reference.contains(row), "{row}\n{reference}");
    }
    assert!(!reference.contains("--help"), "{reference}");
}

#[test]
fn defaults_end_the_help() -> anyhow::Result<()> {
    let command = command::<Test>(&[("wait", "5m".to_owned())]);
    let help = command.clone().render_help().to_string();
    assert!(help.contains("How long [default: 5m]"), "{help}");
    let Err(error) = try_parse_from::<Test, _, _>(command, ["test", "--wait", "soon"]) else {
        bail!("a bad duration was parsed");
    };
    assert!(error.to_string().contains("--wait"), "{error}");
    Ok(())
}

#[test]
fn a_section_is_checked_and_blessed() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("reference.md");
    std::fs::write(
        &path,
        "# Intro\n\n<!-- begin one -->\nold\n<!-- end one -->\nafter\n",
    )?;
    check_reference(&path, "one", "old\n")?;
    let error = check_reference(&path, "one", "new\n").err();
    let error = error.map(|e| e.to_string()).unwrap_or_default();
    assert!(
        error.contains("MUSTER_BLESS=1") && error.contains("line 1"),
        "{error}"
    );
    assert!(check_reference(&path, "two", "x\n").is_err());
    let current = std::fs::read_to_string(&path)?;
    assert_eq!(
        splice(&current, "one", "new\n"),
        "# Intro\n\n<!-- begin one -->\nnew\n<!-- end one -->\nafter\n"
    );
    assert_eq!(
        splice(&current, "two", "x\n"),
        format!("{}\n<!-- begin two -->\nx\n<!-- end two -->\n", current)
    );
    assert_eq!(
        splice("", "two", "x\n"),
        "<!-- begin two -->\nx\n<!-- end two -->\n"
    );
    Ok(())
}
