//! `--generate KIND`, which every binary's settings gain in [`parse`](super::parse): its man
//! page or its completions for a shell, printed from the same clap definition that parses its
//! flags (clap_mangen and clap_complete), as ripgrep's `--generate` does. A package or an
//! install script runs `muster-master --generate man > muster-master.1`.

use std::io::Write;

use clap::{Arg, Command};
use clap_complete::Generator as _;

/// The argument's id.
pub(super) const GENERATE: &str = "generate";

/// What `--generate` can print: `man`, or `complete-` and a shell clap_complete knows.
const KINDS: [&str; 6] = [
    "man",
    "complete-bash",
    "complete-zsh",
    "complete-fish",
    "complete-elvish",
    "complete-powershell",
];

/// `command` with `--generate KIND`, which takes no other flag.
pub(super) fn with_generate(command: Command) -> Command {
    command.arg(
        Arg::new(GENERATE)
            .long(GENERATE)
            .value_name("KIND")
            .value_parser(KINDS)
            .exclusive(true)
            .help(
                "Print this program's man page (man) or its completions for a shell \
                 (complete-bash, complete-zsh, complete-fish, ...) and exit",
            ),
    )
}

/// Writes what `kind` names for `command` to `out`.
///
/// # Errors
/// For a kind that is not one of [`KINDS`], or a failed write.
pub(super) fn generate(command: &Command, kind: &str, out: &mut dyn Write) -> std::io::Result<()> {
    let name = command.get_name().to_owned();
    if kind == "man" {
        return clap_mangen::Man::new(command.clone()).render(out);
    }
    let shell = kind
        .strip_prefix("complete-")
        .and_then(|shell| shell.parse::<clap_complete::Shell>().ok())
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("--generate {kind:?} is not one of {}", KINDS.join(", ")),
            )
        })?;
    // `try_generate`, which returns a failed write (a reader gone away) where `generate` would
    // panic on it.
    let mut command = command.clone();
    command.set_bin_name(name);
    command.build();
    shell.try_generate(&command, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command() -> Command {
        with_generate(
            Command::new("muster-test").version("1.0").arg(
                Arg::new("data-dir")
                    .long("data-dir")
                    .help("Where data goes"),
            ),
        )
    }

    #[test]
    fn each_kind_names_the_programs_flags() -> anyhow::Result<()> {
        for kind in KINDS {
            let mut out = Vec::new();
            generate(&command(), kind, &mut out)?;
            // A man page escapes its hyphens.
            let text = String::from_utf8(out)?.replace("\\-", "-");
            anyhow::ensure!(text.contains("data-dir"), "{kind}: {text}");
            anyhow::ensure!(text.contains("muster-test"), "{kind}: {text}");
        }
        let mut out = Vec::new();
        let refused = generate(&command(), "complete-tcsh", &mut out).expect_err("no tcsh");
        anyhow::ensure!(refused.to_string().contains("tcsh"), "{refused}");
        Ok(())
    }

    #[test]
    fn generate_takes_no_other_flag() {
        let refused = command()
            .try_get_matches_from(["muster-test", "--generate", "man", "--data-dir", "/x"])
            .expect_err("exclusive");
        assert_eq!(refused.kind(), clap::error::ErrorKind::ArgumentConflict);
    }
}
