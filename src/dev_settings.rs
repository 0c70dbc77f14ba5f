//! The settings file a running `muster dev` writes for the CLI in other terminals: where it
//! lives, its `export KEY='VALUE'` format, and writing and reading it safely.
//!
//! It holds a management token, so it is kept where only its user can reach it:
//! `$XDG_RUNTIME_DIR` (private to the user, by the XDG specification) or a directory of the
//! temp dir that `muster dev` creates 0700 and checks on every use (owned by this user, not a
//! symlink, open to nobody else). The file itself is created 0600 with `O_EXCL` and
//! `O_NOFOLLOW`: a file or a symlink planted at its path is never written through.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::Read as _;
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};

/// The file's name in the directory that holds it.
const FILE_NAME: &str = "muster-dev.env";

/// Where the settings file is, and whether its directory is one Muster must check (and may
/// create) as private.
pub(crate) struct SettingsPath {
    /// The file.
    pub(crate) file: PathBuf,
    /// The directory to check: `None` for a path the user named (`MUSTER_DEV_ENV`).
    private_dir: Option<PathBuf>,
}

/// Where the settings file is: `$MUSTER_DEV_ENV` if set, else
/// `$XDG_RUNTIME_DIR/muster-dev.env`, else `<temp dir>/muster-dev-<uid>/muster-dev.env`.
pub(crate) fn settings_path() -> SettingsPath {
    if let Some(path) = std::env::var_os("MUSTER_DEV_ENV") {
        return SettingsPath {
            file: PathBuf::from(path),
            private_dir: None,
        };
    }
    let dir = match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => std::env::temp_dir().join(format!("muster-dev-{}", current_uid())),
    };
    SettingsPath {
        file: dir.join(FILE_NAME),
        private_dir: Some(dir),
    }
}

fn current_uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// Checks that `dir` is a directory (not a symlink) owned by this user and closed to
/// everyone else; with `create`, makes it 0700 first if it is missing.
fn check_private_dir(dir: &Path, create: bool) -> anyhow::Result<()> {
    if create {
        match std::fs::DirBuilder::new().mode(0o700).create(dir) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(error) => {
                return Err(error).with_context(|| format!("cannot create {}", dir.display()));
            }
        }
    }
    let meta =
        std::fs::symlink_metadata(dir).with_context(|| format!("cannot read {}", dir.display()))?;
    let fix = "remove it, or set XDG_RUNTIME_DIR or MUSTER_DEV_ENV";
    if !meta.file_type().is_dir() {
        bail!(
            "{} is not a directory (a symlink or a file): {fix}",
            dir.display()
        );
    }
    if meta.uid() != current_uid() {
        bail!(
            "{} belongs to uid {}, not to this user (uid {}): {fix}",
            dir.display(),
            meta.uid(),
            current_uid()
        );
    }
    if meta.mode() & 0o077 != 0 {
        bail!(
            "{} is open to other users (mode {:o}): chmod 700 it, or {fix}",
            dir.display(),
            meta.mode() & 0o777
        );
    }
    Ok(())
}

/// Writes `text` as the settings file, created anew 0600 (a file left there by an earlier
/// `muster dev` is replaced; a symlink is removed, never followed).
///
/// # Errors
/// The directory is not private to this user, or the file cannot be written.
pub(crate) fn write(path: &SettingsPath, text: &str) -> anyhow::Result<()> {
    if let Some(dir) = &path.private_dir {
        check_private_dir(dir, true)?;
    }
    muster_security::certs::write_private(&path.file, text)
        .with_context(|| format!("cannot write {}", path.file.display()))
}

/// The settings file's text, if a dev cluster wrote one where only this user could.
///
/// # Errors
/// The file is there but cannot be read, or its directory is not private to this user.
pub(crate) fn read(path: &SettingsPath) -> anyhow::Result<Option<String>> {
    let file = &path.file;
    if std::fs::symlink_metadata(file).is_err() {
        return Ok(None);
    }
    if let Some(dir) = &path.private_dir {
        check_private_dir(dir, false).with_context(|| {
            format!("not reading the dev cluster's settings {}", file.display())
        })?;
    }
    let mut text = String::new();
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(file)
        .and_then(|mut f| f.read_to_string(&mut text))
        .with_context(|| format!("cannot read the dev cluster's settings {}", file.display()))?;
    Ok(Some(text))
}

/// `export KEY='VALUE'` lines for `vars`, as `muster dev` writes and prints them.
pub(crate) fn export_lines(vars: &BTreeMap<&str, String>) -> String {
    vars.iter()
        .map(|(key, value)| format!("export {key}='{}'\n", value.replace('\'', "'\\''")))
        .collect()
}

/// Reads `export KEY='VALUE'` lines back.
pub(crate) fn parse_exports(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|line| line.trim().strip_prefix("export "))
        .filter_map(|line| line.split_once('='))
        .map(|(key, value)| {
            let value = value
                .strip_prefix('\'')
                .and_then(|v| v.strip_suffix('\''))
                .unwrap_or(value)
                .replace("'\\''", "'");
            (key.trim().to_owned(), value)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exports_round_trip_and_paste_into_a_shell() {
        let vars = BTreeMap::from([
            ("MUSTER_ADDR", "127.0.0.1:5050".to_owned()),
            ("MUSTER_CACERT", "/tmp/a dir/ca.pem".to_owned()),
            ("MUSTER_TOKEN", "it's".to_owned()),
        ]);
        let text = export_lines(&vars);
        assert!(
            text.contains("export MUSTER_CACERT='/tmp/a dir/ca.pem'\n"),
            "{text}"
        );
        let back = parse_exports(&text);
        assert_eq!(back.len(), 3);
        assert_eq!(back["MUSTER_TOKEN"], "it's");
        assert_eq!(back["MUSTER_CACERT"], "/tmp/a dir/ca.pem");
    }

    fn private(dir: &Path) -> SettingsPath {
        SettingsPath {
            file: dir.join(FILE_NAME),
            private_dir: Some(dir.to_owned()),
        }
    }

    #[test]
    fn a_planted_symlink_is_replaced_not_followed() -> anyhow::Result<()> {
        let scratch = tempfile::tempdir()?;
        let dir = scratch.path().join("muster-dev-x");
        let victim = scratch.path().join("victim");
        std::fs::write(&victim, "precious")?;
        check_private_dir(&dir, true)?;
        let path = private(&dir);
        std::os::unix::fs::symlink(&victim, &path.file)?;
        write(&path, "export MUSTER_TOKEN='s'\n")?;
        assert_eq!(std::fs::read_to_string(&victim)?, "precious");
        let meta = std::fs::symlink_metadata(&path.file)?;
        assert!(meta.file_type().is_file());
        assert_eq!(meta.mode() & 0o777, 0o600);
        assert_eq!(read(&path)?.as_deref(), Some("export MUSTER_TOKEN='s'\n"));
        Ok(())
    }

    #[test]
    fn a_directory_others_can_reach_or_a_symlinked_one_is_refused() -> anyhow::Result<()> {
        use std::os::unix::fs::PermissionsExt as _;
        let scratch = tempfile::tempdir()?;
        let open = scratch.path().join("open");
        std::fs::create_dir(&open)?;
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777))?;
        let error = write(&private(&open), "x").expect_err("an open directory");
        assert!(
            error.to_string().contains("open to other users"),
            "{error:#}"
        );
        assert!(!open.join(FILE_NAME).exists());

        let linked = scratch.path().join("linked");
        std::os::unix::fs::symlink(scratch.path(), &linked)?;
        let error = write(&private(&linked), "x").expect_err("a symlinked directory");
        assert!(error.to_string().contains("not a directory"), "{error:#}");
        // Nor is a settings file read from there.
        std::fs::write(open.join(FILE_NAME), "export MUSTER_TOKEN='planted'\n")?;
        assert!(read(&private(&open)).is_err());
        Ok(())
    }
}
