//! What `dist/` installs for an agent: its systemd unit passes `systemd-analyze verify` (with
//! this build's binary in its `ExecStart`), and the example config file reads as the binary
//! reads one.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context as _, bail, ensure};

use crate::common::BIN;

/// The repository's `dist/`.
fn dist() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../dist"))
}

#[test]
fn the_agent_unit_passes_systemd_analyze_verify() -> anyhow::Result<()> {
    let found = Command::new("systemd-analyze")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok();
    if !found {
        if std::env::var("MUSTER_REQUIRE_SYSTEMD_ANALYZE").as_deref() == Ok("1") {
            bail!("systemd-analyze is not on PATH and MUSTER_REQUIRE_SYSTEMD_ANALYZE=1");
        }
        eprintln!("systemd-analyze is not on PATH: skipped");
        return Ok(());
    }
    let unit = std::fs::read_to_string(dist().join("systemd/muster-agent.service"))?;
    for line in [
        "ExecStart=/usr/local/bin/muster-agent --config /etc/muster/agent.toml",
        "Delegate=yes",
        "KillMode=process",
    ] {
        ensure!(unit.lines().any(|l| l == line), "the unit lacks {line:?}");
    }
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("muster-agent.service");
    std::fs::write(&path, unit.replace("/usr/local/bin/muster-agent", BIN))?;
    let verified = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()?;
    let said = String::from_utf8_lossy(&verified.stderr);
    ensure!(
        verified.status.success() && !said.contains("muster-agent.service"),
        "systemd-analyze verify: {said}"
    );
    Ok(())
}

#[test]
fn the_example_config_starts_an_agent_but_for_its_machine() -> anyhow::Result<()> {
    let config = dist().join("config/agent.toml");
    let dir = tempfile::tempdir()?;
    // Everything in the file is read; what fails is only what names this machine's paths:
    // the TLS files, which do not exist here.
    let output = Command::new(BIN)
        .arg("--config")
        .arg(&config)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args(["--listen", "127.0.0.1:0"])
        .output()
        .context("running the agent")?;
    let said = String::from_utf8_lossy(&output.stderr);
    ensure!(!output.status.success(), "it started: {said}");
    ensure!(
        said.contains("/etc/muster/tls/") && !said.contains("unknown"),
        "not the TLS files that failed: {said}"
    );
    Ok(())
}
