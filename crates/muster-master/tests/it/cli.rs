//! The `muster-master` binary: its help, and a clear error (exit status and text) for each kind
//! of bad start: a port in use, an unusable data dir, a bad config file, a bad peer.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use muster_security::Role;
use muster_security::testing::TestPki;

use crate::common::BIN;

/// Runs the binary to its end (these are error paths: it must end by itself).
fn run(args: &[&str]) -> anyhow::Result<Output> {
    run_with(&TestPki::shared().args(Role::Master, "master-1"), args)
}

/// Runs the binary with `tls` (its TLS flags, or none) and then `args`.
fn run_with(tls: &[std::ffi::OsString], args: &[&str]) -> anyhow::Result<Output> {
    let mut child = Command::new(BIN)
        .args(tls)
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot run muster-master")?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait()?.is_none() {
        if Instant::now() > deadline {
            child.kill()?;
            anyhow::bail!("muster-master {args:?} did not exit");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(child.wait_with_output()?)
}

fn failed_with(output: &Output, expected: &[&str]) -> anyhow::Result<()> {
    ensure!(!output.status.success(), "it started: {output:?}");
    let text = String::from_utf8_lossy(&output.stderr);
    for part in expected {
        ensure!(text.contains(part), "stderr lacks {part:?}:\n{text}");
    }
    Ok(())
}

#[test]
fn help_lists_the_flags() -> anyhow::Result<()> {
    let output = run(&["--help"])?;
    ensure!(output.status.success(), "{output:?}");
    let text = String::from_utf8_lossy(&output.stdout);
    for flag in [
        "--config",
        "--id",
        "--listen",
        "--peer",
        "--data-dir",
        "--ping-interval",
        "--max-missed-pings",
        "--reregistration-timeout",
        "--removal-limit",
    ] {
        ensure!(text.contains(flag), "--help lacks {flag}:\n{text}");
    }
    Ok(())
}

#[test]
fn a_port_in_use_is_an_error_naming_the_address() -> anyhow::Result<()> {
    let taken = std::net::TcpListener::bind("127.0.0.1:0")?;
    let address = taken.local_addr()?.to_string();
    let dir = tempfile::tempdir()?;
    let data_dir = dir.path().to_string_lossy().into_owned();
    let output = run(&["--listen", &address, "--data-dir", &data_dir])?;
    failed_with(&output, &[&address, "in use"])
}

#[test]
fn an_unusable_data_dir_is_an_error_naming_it() -> anyhow::Result<()> {
    // A path through a regular file cannot be a directory, whoever runs the test.
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"not a directory")?;
    let data_dir = file.join("registry");
    let data_dir = data_dir.to_string_lossy().into_owned();
    let output = run(&["--listen", "127.0.0.1:0", "--data-dir", &data_dir])?;
    failed_with(&output, &[&data_dir])
}

#[test]
fn a_bad_config_file_is_an_error_naming_the_file_and_the_key() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("master.toml");
    std::fs::write(&config, "listen = \"127.0.0.1:0\"\nping_intervl = \"5s\"\n")?;
    let config = config.to_string_lossy().into_owned();
    let output = run(&["--config", &config, "--data-dir", "unused"])?;
    failed_with(&output, &[&config, "ping_intervl"])?;

    let bad_value = dir.path().join("bad-value.toml");
    std::fs::write(&bad_value, "ping_interval = \"soon\"\n")?;
    let bad_value = bad_value.to_string_lossy().into_owned();
    let output = run(&["--config", &bad_value, "--data-dir", "unused"])?;
    failed_with(&output, &["ping_interval", "soon"])
}

#[test]
fn a_bad_peer_or_missing_data_dir_is_an_error() -> anyhow::Result<()> {
    let output = run(&["--peer", "one=127.0.0.1:1", "--data-dir", "unused"])?;
    failed_with(&output, &["one=127.0.0.1:1", "numeric id"])?;
    let output = run(&[
        "--id",
        "4",
        "--listen",
        "127.0.0.1:0",
        "--peer",
        "1=127.0.0.1:1",
        "--data-dir",
        "unused",
    ])?;
    failed_with(&output, &["master id 4 is not among the peers"])?;
    let output = run(&["--listen", "127.0.0.1:0"])?;
    failed_with(&output, &["--data-dir is required"])
}

#[test]
fn without_tls_material_it_refuses_to_start_unless_insecure() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let data_dir = dir.path().join("data").to_string_lossy().into_owned();
    let output = run_with(&[], &["--listen", "127.0.0.1:0", "--data-dir", &data_dir])?;
    ensure!(
        !output.status.success(),
        "it started without TLS: {output:?}"
    );
    let text = String::from_utf8_lossy(&output.stderr);
    for part in ["no TLS material", "--tls-ca", "--insecure"] {
        ensure!(text.contains(part), "stderr lacks {part:?}:\n{text}");
    }
    let partial = TestPki::shared().args(Role::Master, "master-1");
    let output = run_with(
        &partial[..2],
        &["--listen", "127.0.0.1:0", "--data-dir", &data_dir],
    )?;
    ensure!(
        !output.status.success(),
        "it started with a CA alone: {output:?}"
    );
    let text = String::from_utf8_lossy(&output.stderr);
    ensure!(text.contains("missing --tls-cert, --tls-key"), "{text}");
    Ok(())
}

#[test]
fn a_certificate_of_another_role_is_refused_at_start() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let data_dir = dir.path().join("data").to_string_lossy().into_owned();
    let output = run_with(
        &TestPki::shared().args(Role::Agent, "impostor"),
        &["--listen", "127.0.0.1:0", "--data-dir", &data_dir],
    )?;
    ensure!(
        !output.status.success(),
        "it started with a {} certificate: {output:?}",
        "agent"
    );
    let text = String::from_utf8_lossy(&output.stderr);
    ensure!(
        text.contains("certificate") && text.contains("needs a master certificate"),
        "{text}"
    );
    Ok(())
}
