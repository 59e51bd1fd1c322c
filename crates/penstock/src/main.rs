//! The `penstock` command: thin glue over the engine.
//!
//! Exit codes: 0 success; 1 the operation failed (the error is on stderr); 2 bad usage.

mod bench_paths;
mod bench_periodic;
mod bench_record;
mod cmd_record;
mod cmd_stream;
mod demo;
mod hog;
mod plot;
mod sink;
mod udp_sink;

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
    /// Background load for benchmarks: `cpu` spins a core, `disk FILE` reads FILE with O_DIRECT.
    #[command(hide = true)]
    Hog {
        kind: String,
        file: Option<std::path::PathBuf>,
    },
    /// Plot `--trace` files: lateness against sequence number, and its histogram (PNG or SVG).
    Plot(plot::PlotArgs),
    /// Record datagrams from SRC into the file DST, with time, packet and frame tracks beside it.
    Record(cmd_record::RecordArgs),
    /// Dump a recording's tracks as CSV, or `--check` them against the media.
    Tracks(cmd_record::TracksArgs),
    /// Run a benchmark.
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// MARS Table 1 re-done: file → TCP loopback receiver for every data path.
    Paths(bench_paths::PathsArgs),
    /// Roadrunner's experiment: N periodic UDP streams against thread-per-stream sleep loops.
    Periodic(bench_periodic::PeriodicArgs),
    /// Issue 8: M recordings of an ~8 Mbit/s MPEG-TS at once (loss), and playback timing.
    Record(bench_record::RecordBenchArgs),
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
        Command::Plot(a) => plot::run(a),
        Command::Record(a) => cmd_record::run(a),
        Command::Tracks(a) => cmd_record::run_tracks(a),
        Command::Bench(BenchCommand::Paths(a)) => bench_paths::run(a),
        Command::Bench(BenchCommand::Periodic(a)) => bench_periodic::run(a),
        Command::Bench(BenchCommand::Record(a)) => bench_record::run(a),
        Command::Hog { kind, file } => hog::run(&kind, file.as_deref()),
    };
    if let Err(e) = r {
        eprintln!("penstock: error: {e:#}");
        std::process::exit(1);
    }
}
