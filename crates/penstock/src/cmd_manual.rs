//! `penstock completions SHELL` and `penstock man`: shell completion scripts and man pages
//! generated from the command line's own definitions (clap_complete, clap_mangen), so they
//! never drift from `--help`. Printed at run time rather than built by `build.rs`: the
//! installed binary is the one source, `cargo install` needs no extra step, and packagers
//! run the two commands (docs/service.md).

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use clap_complete::Shell;

#[derive(Args, Debug)]
#[command(after_help = "Install, for example:\n  \
    bash: penstock completions bash > /usr/share/bash-completion/completions/penstock\n  \
    zsh:  penstock completions zsh > /usr/local/share/zsh/site-functions/_penstock\n  \
    fish: penstock completions fish > ~/.config/fish/completions/penstock.fish")]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: Shell,
}

#[derive(Args, Debug)]
#[command(after_help = "Install, for example: penstock man --dir /usr/local/share/man/man1")]
pub struct ManArgs {
    /// Write one page per command (penstock.1, penstock-serve.1, penstock-bench-http.1, …)
    /// into this directory instead of printing penstock(1) to stdout.
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

/// Prints the completion script for `a.shell`.
pub fn completions(a: CompletionsArgs, mut cmd: clap::Command) -> Result<()> {
    let mut out = std::io::stdout().lock();
    clap_complete::generate(a.shell, &mut cmd, "penstock", &mut out);
    out.flush().context("writing the completion script")
}

/// Prints penstock(1), or writes every command's page into `a.dir`.
pub fn man(a: ManArgs, cmd: clap::Command) -> Result<()> {
    match a.dir {
        Some(dir) => {
            clap_mangen::generate_to(cmd, &dir)
                .with_context(|| format!("writing man pages into {}", dir.display()))?;
        }
        None => {
            let mut out = std::io::stdout().lock();
            clap_mangen::Man::new(cmd)
                .render(&mut out)
                .and_then(|()| out.flush())
                .context("writing the man page")?;
        }
    }
    Ok(())
}
