pub fn run(_a: PathsArgs) -> anyhow::Result<()> {
    anyhow::bail!("not yet")
}
#[derive(clap::Args, Debug)]
pub struct PathsArgs {}
