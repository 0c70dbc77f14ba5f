//! `muster tls ca create` and `muster tls cert create` write PEM files a node can load, with
//! the role and name asked for; they never overwrite, and bad input names the problem.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Command, Output};

use anyhow::ensure;
use muster_security::{DEFAULT_CLUSTER, Role, Tls, TlsFiles};

const BIN: &str = env!("CARGO_BIN_EXE_muster");

fn muster(dir: &Path, args: &[&str]) -> anyhow::Result<Output> {
    Ok(Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .env("RUST_LOG", "warn")
        .output()?)
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn a_ca_and_a_certificate_per_role_load_with_their_identity() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let made = muster(dir.path(), &["tls", "ca", "create"])?;
    ensure!(made.status.success(), "{}", stderr(&made));
    for (role, name) in [
        (Role::Master, "m1"),
        (Role::Agent, "node-7"),
        (Role::Client, "alice"),
    ] {
        let made = muster(
            dir.path(),
            &[
                "tls",
                "cert",
                "create",
                "--role",
                role.as_str(),
                "--name",
                name,
                "--additional-ipaddress",
                "10.0.0.7",
            ],
        )?;
        ensure!(made.status.success(), "{}", stderr(&made));
        let stem = format!("global-{role}-muster-{name}");
        let files = TlsFiles {
            ca: dir.path().join("muster-ca.pem"),
            cert: dir.path().join(format!("{stem}.pem")),
            key: dir.path().join(format!("{stem}-key.pem")),
        };
        let mode = std::fs::metadata(&files.key)?.permissions().mode() & 0o777;
        ensure!(mode == 0o600, "key mode {mode:o}");
        let identity = Tls::load(files, DEFAULT_CLUSTER)?.identity();
        ensure!(
            identity.role == role && identity.name == name,
            "{identity:?}"
        );
    }
    let mode = std::fs::metadata(dir.path().join("muster-ca-key.pem"))?
        .permissions()
        .mode()
        & 0o777;
    ensure!(mode == 0o600, "CA key mode {mode:o}");

    // Never overwritten.
    let again = muster(dir.path(), &["tls", "ca", "create"])?;
    ensure!(!again.status.success(), "the CA was overwritten");
    ensure!(
        stderr(&again).contains("muster-ca.pem exists"),
        "{}",
        stderr(&again)
    );
    Ok(())
}

#[test]
fn bad_input_is_named() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let no_ca = muster(dir.path(), &["tls", "cert", "create", "--role", "agent"])?;
    ensure!(!no_ca.status.success());
    ensure!(
        stderr(&no_ca).contains("muster-ca.pem"),
        "{}",
        stderr(&no_ca)
    );

    let bad_role = muster(dir.path(), &["tls", "cert", "create", "--role", "admin"])?;
    ensure!(bad_role.status.code() == Some(2), "{bad_role:?}");
    let text = stderr(&bad_role);
    ensure!(
        text.contains("admin") && text.contains("master, agent or client"),
        "{text}"
    );

    let zero = muster(dir.path(), &["tls", "ca", "create", "--days", "0"])?;
    ensure!(!zero.status.success());
    ensure!(stderr(&zero).contains("--days"), "{}", stderr(&zero));
    Ok(())
}
