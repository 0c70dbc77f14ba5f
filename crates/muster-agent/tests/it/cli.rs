//! The `muster-agent` binary: its help, its errors (exit status and text), and a clean start
//! and stop on SIGTERM.

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use muster_security::Role;
use muster_security::testing::TestPki;

use crate::common::BIN;

/// Runs the binary to its end (it must end by itself: these are error paths).
fn run(args: &[&str]) -> anyhow::Result<Output> {
    run_with(&TestPki::shared().args(Role::Agent, "agent-1"), args)
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
        .context("cannot run muster-agent")?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait()?.is_none() {
        if Instant::now() > deadline {
            child.kill()?;
            anyhow::bail!("muster-agent {args:?} did not exit");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(child.wait_with_output()?)
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn help_lists_the_flags() -> anyhow::Result<()> {
    let output = run(&["--help"])?;
    ensure!(output.status.success(), "{output:?}");
    let text = String::from_utf8_lossy(&output.stdout);
    for flag in [
        "--listen",
        "--advertise",
        "--master",
        "--data-dir",
        "--hostname",
        "--cpus",
        "--mem-mb",
        "--attribute",
        "--config",
        "--task-output-max-bytes",
        "--task-output-files",
        "--task-output-check-interval",
        "--http-listen",
    ] {
        ensure!(
            text.contains(flag),
            "--help does not mention {flag}:\n{text}"
        );
    }
    Ok(())
}

#[test]
fn a_port_in_use_is_an_error_naming_the_address() -> anyhow::Result<()> {
    let taken = std::net::TcpListener::bind("127.0.0.1:0")?;
    let address = taken.local_addr()?.to_string();
    let dir = tempfile::tempdir()?;
    let data_dir = dir.path().to_string_lossy().into_owned();
    let output = run(&[
        "--listen",
        &address,
        "--master",
        "127.0.0.1:1",
        "--data-dir",
        &data_dir,
    ])?;
    ensure!(
        !output.status.success(),
        "started on a taken port: {output:?}"
    );
    let text = stderr(&output);
    ensure!(
        text.contains(&format!("cannot listen on {address}")) && text.contains("in use"),
        "{text}"
    );
    Ok(())
}

#[test]
fn an_http_port_in_use_is_an_error_naming_it() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let data_dir = dir.path().join("data").to_string_lossy().into_owned();
    // Given with --http-listen.
    let taken = std::net::TcpListener::bind("127.0.0.1:0")?;
    let address = taken.local_addr()?.to_string();
    let output = run(&[
        "--listen",
        "127.0.0.1:0",
        "--http-listen",
        &address,
        "--master",
        "127.0.0.1:1",
        "--data-dir",
        &data_dir,
    ])?;
    ensure!(
        !output.status.success(),
        "started on a taken HTTP port: {output:?}"
    );
    let text = stderr(&output);
    ensure!(
        text.contains("--http-listen")
            && text.contains(&format!("cannot listen on {address}"))
            && text.contains("in use"),
        "{text}"
    );

    // By default: the --listen port plus 10. A taken port whose port minus 10 is free (that
    // free port may be taken meanwhile by another program: then try again).
    for _ in 0..20 {
        let taken = std::net::TcpListener::bind("127.0.0.1:0")?;
        let http = taken.local_addr()?;
        let Some(port) = http.port().checked_sub(10) else {
            continue;
        };
        if port == 0 || std::net::TcpListener::bind(("127.0.0.1", port)).is_err() {
            continue;
        }
        let listen = format!("127.0.0.1:{port}");
        let output = run(&[
            "--listen",
            &listen,
            "--master",
            "127.0.0.1:1",
            "--data-dir",
            &data_dir,
        ])?;
        let text = stderr(&output);
        if text.contains(&format!("cannot listen on {listen}")) {
            continue;
        }
        ensure!(
            !output.status.success(),
            "started with its default HTTP port {http} taken: {output:?}"
        );
        ensure!(
            text.contains(&format!("cannot listen on {http}")) && text.contains("in use"),
            "{text}"
        );
        return Ok(());
    }
    anyhow::bail!("found no free port 10 below a taken one in 20 tries")
}

#[test]
fn an_unwritable_data_dir_is_an_error_naming_it() -> anyhow::Result<()> {
    // A path through a regular file cannot be created, even by root.
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("a-file");
    std::fs::write(&file, "not a directory")?;
    let data_dir = file.join("data").to_string_lossy().into_owned();
    let output = run(&[
        "--listen",
        "127.0.0.1:0",
        "--master",
        "127.0.0.1:1",
        "--data-dir",
        &data_dir,
    ])?;
    ensure!(!output.status.success(), "{output:?}");
    let text = stderr(&output);
    ensure!(
        text.contains("data directory") && text.contains(&data_dir),
        "{text}"
    );
    Ok(())
}

#[test]
fn bad_attributes_and_config_files_are_errors_naming_the_problem() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let data_dir = dir.path().to_string_lossy().into_owned();

    let output = run(&[
        "--master",
        "127.0.0.1:1",
        "--data-dir",
        &data_dir,
        "--attribute",
        "no-equals-sign",
    ])?;
    ensure!(!output.status.success(), "{output:?}");
    let text = stderr(&output);
    ensure!(
        text.contains("--attribute") && text.contains("key=value"),
        "{text}"
    );

    let config = dir.path().join("agent.toml");
    std::fs::write(&config, "master = [\"127.0.0.1:1\"]\ncpus = \"many\"\n")?;
    let config = config.to_string_lossy().into_owned();
    let output = run(&["--config", &config, "--data-dir", &data_dir])?;
    ensure!(!output.status.success(), "{output:?}");
    let text = stderr(&output);
    ensure!(text.contains(&config) && text.contains("cpus"), "{text}");

    let output = run(&["--data-dir", &data_dir])?;
    ensure!(!output.status.success(), "{output:?}");
    ensure!(stderr(&output).contains("--master"), "{}", stderr(&output));

    let output = run(&[
        "--master",
        "127.0.0.1:1",
        "--data-dir",
        &data_dir,
        "--advertise",
        "no-port",
    ])?;
    ensure!(!output.status.success(), "{output:?}");
    let text = stderr(&output);
    ensure!(
        text.contains("--advertise") && text.contains("no-port") && text.contains("HOST:PORT"),
        "{text}"
    );

    // Task output rotation: a size that is not one, and zero limits, named.
    let output = run(&[
        "--master",
        "127.0.0.1:1",
        "--data-dir",
        &data_dir,
        "--task-output-max-bytes",
        "lots",
    ])?;
    ensure!(!output.status.success(), "{output:?}");
    let text = stderr(&output);
    ensure!(
        text.contains("--task-output-max-bytes") && text.contains("\"lots\""),
        "{text}"
    );
    for (flag, field) in [
        ("--task-output-max-bytes", "task_output_max_bytes"),
        ("--task-output-files", "task_output_files"),
        ("--task-output-check-interval", "task_output_check_interval"),
    ] {
        let zero = if flag.ends_with("interval") {
            "0s"
        } else {
            "0"
        };
        let output = run(&[
            "--master",
            "127.0.0.1:1",
            "--data-dir",
            &data_dir,
            flag,
            zero,
        ])?;
        ensure!(!output.status.success(), "{output:?}");
        let text = stderr(&output);
        ensure!(text.contains(field), "{flag} {zero}: {text}");
    }
    Ok(())
}

#[test]
fn it_prints_where_it_listens_and_stops_on_sigterm() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("agent.toml");
    let data_dir = dir.path().join("data");
    // TLS from the file's [tls] table this time.
    let tls = TestPki::shared().files(Role::Agent, "agent-1");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\nmaster = [\"127.0.0.1:1\"]\ndata_dir = {:?}\n\
             [attributes]\nrack = \"r1\"\n\
             [tls]\nca = {:?}\ncert = {:?}\nkey = {:?}\n",
            data_dir.to_string_lossy(),
            tls.ca,
            tls.cert,
            tls.key
        ),
    )?;
    let mut child = Command::new(BIN)
        .arg("--config")
        .arg(&config)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let stdout = child.stdout.take().context("no stdout")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let read = BufReader::new(stdout).read_line(&mut line).map(|_| line);
        let _ = tx.send(read);
    });
    let outcome = (|| {
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .context("no line on stdout in time")??;
        let address = line
            .strip_prefix("muster-agent listening on ")
            .and_then(|rest| rest.split_once(' '))
            .map(|(address, _)| address.to_owned())
            .with_context(|| format!("unexpected first line {line:?}"))?;
        // Then where the metrics are: on the HTTP port, with TLS too.
        ensure!(
            line.contains(&format!(
                "(agent@{address}), TLS, metrics on https://127.0.0.1:"
            )) && line.trim_end().ends_with("/metrics"),
            "{line:?}"
        );
        ensure!(data_dir.is_dir(), "the data directory was created");
        let killed = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()?;
        ensure!(killed.success(), "kill failed");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = child.try_wait()? {
                ensure!(status.success(), "exit status after SIGTERM: {status}");
                return Ok(());
            }
            ensure!(Instant::now() < deadline, "did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(10));
        }
    })();
    if outcome.is_err() {
        let _ = child.kill();
        let _ = child.wait();
    }
    outcome
}

#[test]
fn without_tls_material_it_refuses_to_start_unless_insecure() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let data_dir = dir.path().join("data").to_string_lossy().into_owned();
    let output = run_with(
        &[],
        &[
            "--listen",
            "127.0.0.1:0",
            "--master",
            "127.0.0.1:1",
            "--data-dir",
            &data_dir,
        ],
    )?;
    ensure!(
        !output.status.success(),
        "it started without TLS: {output:?}"
    );
    let text = String::from_utf8_lossy(&output.stderr);
    for part in ["no TLS material", "--tls-ca", "--insecure"] {
        ensure!(text.contains(part), "stderr lacks {part:?}:\n{text}");
    }
    let partial = TestPki::shared().args(Role::Agent, "agent-1");
    let output = run_with(
        &partial[..2],
        &[
            "--listen",
            "127.0.0.1:0",
            "--master",
            "127.0.0.1:1",
            "--data-dir",
            &data_dir,
        ],
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
        &TestPki::shared().args(Role::Master, "impostor"),
        &[
            "--listen",
            "127.0.0.1:0",
            "--master",
            "127.0.0.1:1",
            "--data-dir",
            &data_dir,
        ],
    )?;
    ensure!(
        !output.status.success(),
        "it started with a {} certificate: {output:?}",
        "master"
    );
    let text = String::from_utf8_lossy(&output.stderr);
    ensure!(
        text.contains("certificate") && text.contains("needs a agent certificate"),
        "{text}"
    );
    Ok(())
}
