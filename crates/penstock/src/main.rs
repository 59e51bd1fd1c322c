//! The `penstock` command: thin glue over the engine.
//!
//! Exit codes: 0 success; 1 the operation failed (the error is on stderr); 2 bad usage.

mod bench_paths;
mod bench_stripe;
mod cmd_stream;
mod cmd_volume;
mod demo;
mod sink;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "penstock",
    version,
    about = "A storage-to-network streaming engine for Linux"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Stream a generated sample to a local receiver through every data path, checked byte for byte.
    Demo(demo::DemoArgs),
    /// Stream SRC to DST as fast as possible (a burst stream).
    Stream(cmd_stream::StreamArgs),
    /// Receive on a TCP address and count bytes (a receiver for tests and benchmarks).
    Sink(sink::SinkArgs),
    /// Volumes: striped members, dynamic partitions (see docs/volume-format.md).
    #[command(subcommand)]
    Volume(cmd_volume::VolumeCommand),
    /// Run a benchmark.
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// MARS Table 1 re-done: file → TCP loopback receiver for every data path.
    Paths(bench_paths::PathsArgs),
    /// Clockwise Fig. 1 / MARS ccd: read throughput of a partition striped over 1-4 members.
    Stripe(bench_stripe::StripeArgs),
}

fn main() {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("PENSTOCK_LOG")
        .unwrap_or_else(|_| "warn".into());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let r = match cli.command {
        Command::Demo(a) => demo::run(a),
        Command::Stream(a) => cmd_stream::run(a),
        Command::Sink(a) => sink::run(a),
        Command::Volume(c) => cmd_volume::run(c),
        Command::Bench(BenchCommand::Paths(a)) => bench_paths::run(a),
        Command::Bench(BenchCommand::Stripe(a)) => bench_stripe::run(a),
    };
    if let Err(e) = r {
        eprintln!("penstock: error: {e:#}");
        std::process::exit(1);
    }
}
