//! `muster completions SHELL` and `muster man`: shell completions and man pages, both made
//! from the CLI's own clap definitions (clap_complete and clap_mangen), so that they cannot
//! drift from the commands they describe.

use std::path::Path;

use clap::CommandFactory;

/// `muster completions SHELL`: the completion script for `shell`, on stdout. Install it as the
/// shell expects (bash: `muster completions bash > /etc/bash_completion.d/muster`; zsh: a file
/// `_muster` on `$fpath`; fish: `~/.config/fish/completions/muster.fish`).
pub(crate) fn completions<C: CommandFactory>(shell: clap_complete::Shell) -> anyhow::Result<()> {
    let mut command = C::command();
    let mut out = std::io::stdout().lock();
    clap_complete::generate(shell, &mut command, "muster", &mut out);
    Ok(())
}

/// `muster man --out-dir DIR`: `muster.1` and a page per subcommand (`muster-job-run.1`), in
/// `dir` (made if missing); the paths written.
pub(crate) fn man_pages<C: CommandFactory>(dir: &Path) -> anyhow::Result<Vec<std::path::PathBuf>> {
    std::fs::create_dir_all(dir)
        .map_err(|e| anyhow::anyhow!("cannot make the directory {}: {e}", dir.display()))?;
    let mut written = Vec::new();
    write_pages(C::command(), "muster", dir, &mut written)?;
    Ok(written)
}

/// Writes the page of `command`, named `name`, and those of its subcommands.
fn write_pages(
    command: clap::Command,
    name: &str,
    dir: &Path,
    written: &mut Vec<std::path::PathBuf>,
) -> anyhow::Result<()> {
    let command = command.name(name.to_owned());
    let path = dir.join(format!("{name}.1"));
    let mut page = Vec::new();
    clap_mangen::Man::new(command.clone()).render(&mut page)?;
    std::fs::write(&path, page)
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
    written.push(path);
    for sub in command.get_subcommands().filter(|sub| !sub.is_hide_set()) {
        let sub_name = format!("{name}-{}", sub.get_name());
        write_pages(sub.clone(), &sub_name, dir, written)?;
    }
    Ok(())
}
