//! What `dist/` installs for a master: its systemd unit passes `systemd-analyze verify` (with
//! this build's binary in its `ExecStart`), and the example config file reads as the binary
//! reads one.

use std::path::Path;
use std::process::Command;

use anyhow::{Context as _, ensure};

use crate::common::{BIN, installed};

/// The repository's `dist/`.
fn dist() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../dist"))
}

#[test]
fn the_master_unit_passes_systemd_analyze_verify() -> anyhow::Result<()> {
    if !installed(
        "systemd-analyze",
        "--version",
        "MUSTER_REQUIRE_SYSTEMD_ANALYZE",
    )? {
        return Ok(());
    }
    let unit = std::fs::read_to_string(dist().join("systemd/muster-master.service"))?;
    ensure!(
        unit.contains("ExecStart=/usr/local/bin/muster-master --config /etc/muster/master.toml"),
        "{unit}"
    );
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("muster-master.service");
    std::fs::write(&path, unit.replace("/usr/local/bin/muster-master", BIN))?;
    let verified = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()?;
    let said = String::from_utf8_lossy(&verified.stderr);
    ensure!(
        verified.status.success() && !said.contains("muster-master.service"),
        "systemd-analyze verify: {said}"
    );
    Ok(())
}

#[test]
fn the_example_config_starts_a_master_but_for_its_machine() -> anyhow::Result<()> {
    let config = dist().join("config/master.toml");
    let dir = tempfile::tempdir()?;
    // Everything in the file is read; what fails is only what names this machine's paths and
    // addresses: the TLS files, which do not exist here.
    let output = Command::new(BIN)
        .arg("--config")
        .arg(&config)
        .args(["--data-dir"])
        .arg(dir.path().join("data"))
        .args(["--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"])
        .output()
        .context("running the master")?;
    let said = String::from_utf8_lossy(&output.stderr);
    ensure!(!output.status.success(), "it started: {said}");
    ensure!(
        said.contains("/etc/muster/tls/") && !said.contains("unknown"),
        "not the TLS files that failed: {said}"
    );
    Ok(())
}
