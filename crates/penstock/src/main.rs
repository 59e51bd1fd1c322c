//! The `penstock` command: thin glue over the engine.
//!
//! Exit codes: 0 success; 1 the operation failed (the error is on stderr); 2 bad usage.

mod bench_http;
mod bench_paths;
mod cmd_ctl;
mod cmd_serve;
mod cmd_stream;
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
    /// Serve a directory over HTTP/1.1, and the stream control protocol.
    Serve(cmd_serve::ServeArgs),
    /// Send control protocol commands to a server (interactive without a command).
    Ctl(cmd_ctl::CtlArgs),
    /// Run a benchmark.
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// MARS Table 1 re-done: file → TCP loopback receiver for every data path.
    Paths(bench_paths::PathsArgs),
    /// penstock serve against nginx, with wrk: large and small files, 1 to 512 clients.
    Http(bench_http::HttpArgs),
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
        Command::Bench(BenchCommand::Paths(a)) => bench_paths::run(a),
        Command::Serve(a) => cmd_serve::run(a),
        Command::Ctl(a) => cmd_ctl::run(a).map(|code| {
            if code != 0 {
                std::process::exit(code)
            }
        }),
        Command::Bench(BenchCommand::Http(a)) => bench_http::run(a),
    };
    if let Err(e) = r {
        eprintln!("penstock: error: {e:#}");
        std::process::exit(1);
    }
}
