//! `muster completions` and `muster man`: generated from the CLI's clap definitions, for
//! every shell clap_complete knows and for every visible subcommand.

use std::process::Command;

use anyhow::ensure;

const BIN: &str = env!("CARGO_BIN_EXE_muster");

#[test]
fn completions_name_the_commands_for_each_shell() -> anyhow::Result<()> {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let output = Command::new(BIN).args(["completions", shell]).output()?;
        ensure!(output.status.success(), "{shell}: {output:?}");
        let script = String::from_utf8(output.stdout)?;
        for word in ["muster", "job", "namespace", "operator", "completions"] {
            ensure!(script.contains(word), "{shell} completions lack {word:?}");
        }
    }
    let output = Command::new(BIN).args(["completions", "tcsh"]).output()?;
    ensure!(!output.status.success(), "an unknown shell is refused");
    let said = String::from_utf8_lossy(&output.stderr);
    ensure!(said.contains("tcsh") && said.contains("bash"), "{said}");
    Ok(())
}

#[test]
fn man_writes_a_page_per_command() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let out = dir.path().join("man");
    let output = Command::new(BIN)
        .args(["man", "--out-dir"])
        .arg(&out)
        .output()?;
    ensure!(output.status.success(), "{output:?}");
    for (page, says) in [
        ("muster.1", ".TH muster 1"),
        ("muster-job.1", "job"),
        ("muster-job-run.1", "run"),
        ("muster-operator-snapshot-save.1", "save"),
    ] {
        let text = std::fs::read_to_string(out.join(page))?;
        ensure!(text.contains(says), "{page}: {text}");
    }
    let listed = String::from_utf8(output.stdout)?;
    ensure!(listed.lines().count() > 20, "pages written: {listed}");
    Ok(())
}

/// `muster-master` and `muster-agent --generate`: each binary's man page and completions, from
/// the clap definition that parses its flags.
#[test]
fn the_master_and_the_agent_generate_their_man_pages_and_completions() -> anyhow::Result<()> {
    for (binary, flag) in [
        ("muster-master", "--data-dir"),
        ("muster-agent", "--master"),
    ] {
        let path = crate::common::binary(binary)?;
        let output = Command::new(&path).args(["--generate", "man"]).output()?;
        ensure!(output.status.success(), "{binary} man: {output:?}");
        let page = String::from_utf8(output.stdout)?;
        ensure!(
            page.contains(&format!(".TH {binary} 1")),
            "{binary}: {page}"
        );
        ensure!(
            page.contains(&flag.replace('-', "\\-")),
            "{binary} man lacks {flag}"
        );
        for shell in ["bash", "zsh", "fish"] {
            let output = Command::new(&path)
                .args(["--generate", &format!("complete-{shell}")])
                .output()?;
            ensure!(output.status.success(), "{binary} {shell}: {output:?}");
            let script = String::from_utf8(output.stdout)?;
            ensure!(
                script.contains(binary) && script.contains(flag.trim_start_matches('-')),
                "{binary}'s {shell} completions lack {flag}"
            );
        }
        // Into a reader that stops at once (`| head -1`): no "Broken pipe", success.
        for kind in ["man", "complete-bash"] {
            let mut child = Command::new(&path)
                .args(["--generate", kind])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()?;
            drop(child.stdout.take());
            let cut = child.wait_with_output()?;
            ensure!(
                cut.status.success() && cut.stderr.is_empty(),
                "{binary} --generate {kind} into a closed pipe: {cut:?}"
            );
        }
        let output = Command::new(&path)
            .args(["--generate", "complete-tcsh"])
            .output()?;
        ensure!(!output.status.success(), "{binary}: tcsh was taken");
        let said = String::from_utf8_lossy(&output.stderr);
        ensure!(
            said.contains("tcsh") && said.contains("complete-bash"),
            "{said}"
        );
    }
    Ok(())
}
