//! The `muster-master` binary's logs: a normal start (a group of one that takes the lead, then
//! SIGTERM) logs at info and nothing worse, and logs to a pipe carry no colour escape codes.

use std::io::{BufRead as _, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use muster_security::Role;
use muster_security::testing::TestPki;

use crate::common::BIN;

/// The line the master logs once it leads and its broker serves.
const LEADING: &str = "leading master: waiting for admitted agents to re-register";

/// Sends each line `from` yields to the returned channel, as a background thread reads it.
fn lines(from: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (send, receive) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(from).lines() {
            let Ok(line) = line else { break };
            if send.send(line).is_err() {
                break;
            }
        }
    });
    receive
}

/// Lines from `lines` up to and including the first that contains `wanted`.
fn until(
    lines: &mpsc::Receiver<String>,
    wanted: &str,
    within: Duration,
) -> anyhow::Result<Vec<String>> {
    let deadline = Instant::now() + within;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => {
                let found = line.contains(wanted);
                seen.push(line);
                if found {
                    return Ok(seen);
                }
            }
            Err(error) => bail!(
                "no line with {wanted:?} ({error}); got:\n{}",
                seen.join("\n")
            ),
        }
    }
}

/// Kills the child if the test ends early.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_normal_start_logs_no_warning_and_no_escape_codes() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let data_dir = dir.path().join("registry");
    let mut child = Running(
        Command::new(BIN)
            .args(TestPki::shared().args(Role::Master, "master-1"))
            .args(["--listen", "127.0.0.1:0", "--data-dir"])
            .arg(&data_dir)
            // The default filter, whatever the environment running the tests sets.
            .env_remove("RUST_LOG")
            .env_remove("NO_COLOR")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("cannot run muster-master")?,
    );
    let stdout = lines(child.0.stdout.take().context("no stdout")?);
    let stderr = lines(child.0.stderr.take().context("no stderr")?);
    until(&stdout, "listening on", Duration::from_secs(30))?;
    let mut logged = until(&stderr, LEADING, Duration::from_secs(30))?;

    let status = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()?;
    ensure!(status.success(), "kill -TERM failed: {status}");
    // stderr closes when the process ends.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match stderr.recv_timeout(left) {
            Ok(line) => logged.push(line),
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                bail!(
                    "muster-master did not stop on SIGTERM:\n{}",
                    logged.join("\n")
                )
            }
        }
    }
    let exit = child.0.wait()?;
    let text = logged.join("\n");
    ensure!(exit.success(), "muster-master ended with {exit}:\n{text}");

    ensure!(
        !text.contains('\x1b'),
        "escape codes in logs to a pipe:\n{text:?}"
    );
    ensure!(text.contains(" INFO "), "no info lines:\n{text}");
    ensure!(text.contains("shutting down"), "no shutdown line:\n{text}");
    for level in [" WARN ", " ERROR "] {
        ensure!(
            !text.contains(level),
            "{level:?} lines in a normal start:\n{text}"
        );
    }
    // openraft's info chatter stays out by default.
    ensure!(!text.contains("openraft"), "openraft lines:\n{text}");
    Ok(())
}

#[test]
fn insecure_is_said_at_start_in_the_log_and_on_stdout() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut child = Running(
        Command::new(BIN)
            .args(["--insecure", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.path().join("registry"))
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("cannot run muster-master")?,
    );
    let stdout = lines(child.0.stdout.take().context("no stdout")?);
    let stderr = lines(child.0.stderr.take().context("no stderr")?);
    let listening = until(&stdout, "listening on", Duration::from_secs(30))?;
    ensure!(
        listening.iter().any(|l| l.ends_with(", INSECURE")),
        "{listening:?}"
    );
    let logged = until(&stderr, "--insecure", Duration::from_secs(30))?;
    ensure!(
        logged
            .iter()
            .any(|l| l.contains(" WARN ") && l.contains("no TLS")),
        "{logged:?}"
    );
    Ok(())
}
