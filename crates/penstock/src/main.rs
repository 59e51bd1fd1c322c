//! The `penstock` command: thin glue over the engine. The benchmarks, the `sink` receiver
//! and the hidden `hog` load live in `penstock-bench`; this binary only names them.
//!
//! Exit codes: 0 success; 1 the operation failed (the error is on stderr); 2 bad usage.
//!
//! Logging goes to stderr: the filter is `PENSTOCK_LOG`, else `RUST_LOG` (tracing's
//! `EnvFilter` syntax, e.g. `info` or `penstock_server=debug`), else warnings only — and for
//! `serve` its lifecycle lines too (listening, reloaded, stopping, RLIMIT_NOFILE raised) at
//! info. Colours only when stderr is a terminal; `--log-format json` writes one JSON object
//! per line for log shippers.

#![forbid(unsafe_code)]

mod activation;
mod calibrate;
mod cmd_cluster;
mod cmd_ctl;
mod cmd_manual;
mod cmd_mount;
mod cmd_record;
mod cmd_serve;
mod cmd_sign;
mod cmd_stream;
mod cmd_volume;
mod demo;
mod plot;
mod report;
mod service;
mod timing;

use clap::{CommandFactory, Parser, Subcommand};
use penstock_bench as bench;

#[derive(Parser, Debug)]
#[command(
    name = "penstock",
    version,
    about = "A storage-to-network streaming engine for Linux"
)]
#[command(
    after_help = "Logging: PENSTOCK_LOG or RUST_LOG set the filter (e.g. info, \
    penstock_server=debug); default warnings only (serve: its lifecycle at info)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// How log lines on stderr look: text, or json (one object per line).
    #[arg(long, global = true, value_parser = ["text", "json"], default_value = "text")]
    log_format: String,
}

// Parsed once per process: the size of the largest variant costs nothing worth a Box.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum Command {
    /// Stream a generated sample to a local receiver through every data path, checked byte for byte.
    Demo(demo::DemoArgs),
    /// Stream SRC to DST as fast as possible (a burst stream).
    Stream(Box<cmd_stream::StreamArgs>),
    /// Receive on a TCP address and count bytes (a receiver for tests and benchmarks).
    Sink(bench::sink::SinkArgs),
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
    /// Measure the disk under PATH (sequential MB/s, random IOPS) for admission control.
    Calibrate(calibrate::CalibrateArgs),
    /// Serve a directory over HTTP/1.1 and RTSP (TS files to players), and the stream control
    /// protocol.
    Serve(cmd_serve::ServeArgs),
    /// Send control protocol commands to a server (interactive without a command).
    Ctl(cmd_ctl::CtlArgs),
    /// Print a signed URL (`?expires=&kid=&sig=`) for a location with `auth = "signed"`,
    /// with the keys of the configuration's `[auth]` (docs/security.md "Viewers").
    Sign(cmd_sign::SignArgs),
    /// Volumes: striped members, dynamic partitions (see docs/volume-format.md).
    Volume(cmd_volume::VolumeArgs),
    /// A cluster of serve nodes on etcd: list the nodes, render HAProxy's configuration
    /// (docs/cluster.md).
    #[command(subcommand)]
    Cluster(cmd_cluster::ClusterCommand),
    /// Run a benchmark.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) to stdout.
    Completions(cmd_manual::CompletionsArgs),
    /// Print the man page penstock(1) to stdout, or write every command's page with --dir.
    Man(cmd_manual::ManArgs),
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// MARS Table 1 re-done: file → TCP loopback receiver for every data path.
    Paths(bench::paths::PathsArgs),
    /// Roadrunner's experiment: N periodic UDP streams against thread-per-stream sleep loops.
    Periodic(bench::periodic::PeriodicArgs),
    /// Issue 8: M recordings of an ~8 Mbit/s MPEG-TS at once (loss), and playback timing.
    Record(bench::record::RecordBenchArgs),
    /// MARS Table 2: an rt stream's completion time under background readers, DRR vs FIFO.
    Isolation(bench::qos::IsolationArgs),
    /// MARS Table 3: three periodic streams (60, 75, 120 ms) sharing disk and network;
    /// --upcalls: the three periods as Real-Time Upcalls beside paced streams on one worker.
    Rtu(bench::qos::RtuArgs),
    /// penstock serve against nginx, with wrk: large and small files, 1 to 512 clients.
    Http(bench::http::HttpArgs),
    /// `bench http --https`: both servers over TLS (penstock's rustls or kTLS, nginx's
    /// OpenSSL), wrk over https; 8 and 64 clients by default.
    Https(bench::http::HttpArgs),
    /// HLS viewers (one event-driven emulator) of penstock's playlists cut from the original
    /// TS and MP4 against nginx serving ffmpeg's pre-segmented copies: late segments, server
    /// CPU per viewer, segment copies on disk.
    Hls(bench::hls::HlsArgs),
    /// Clockwise Fig. 1 / MARS ccd: read throughput of a partition striped over 1-4 members.
    Stripe(bench::stripe::StripeArgs),
    /// The Cues experiments (issue 14): the example C server built with read/write, sendfile
    /// and cue(); throughput, CPU/GB, a (K, T) sweep and the CPU left to a metering process.
    Cues(bench::cues::CuesArgs),
    /// Issue 15: N RTSP sessions of an 8 Mbit/s TS over RTP/UDP from penstock serve and from
    /// GStreamer's RTSP server: the largest N each keeps without loss, CPU per session, jitter.
    Rtsp(bench::rtsp::RtspArgs),
    /// Every bench (paths, periodic, isolation, rtu, stripe, record, http, cues, rtsp,
    /// admission), one after another, and one report page beside the papers' numbers:
    /// DIR/index.html, DIR/*.svg, DIR/results.json.
    All(report::AllArgs),
    /// Issue 22: rt streams of an 8 Mbit/s TS ramped until admission refuses (N_adm), run
    /// beside bulk readers (no misses), then forced beyond until units miss (N_miss).
    Admission(bench::admission::AdmissionArgs),
}

fn main() {
    let cli = Cli::parse();
    init_logging(
        matches!(cli.command, Command::Serve(_)),
        cli.log_format == "json",
    );
    // Commands that may hold many descriptors (a socket or two per stream, thousands in a
    // benchmark) raise the soft RLIMIT_NOFILE to the hard limit, said at info level; `serve`
    // does it in `Server::start`, where it also checks its connection limits against it.
    if matches!(
        cli.command,
        Command::Stream(_) | Command::Demo(_) | Command::Record(_) | Command::Bench(_)
    ) {
        penstock_driver::rlimit::raise_nofile();
    }
    let r = match cli.command {
        Command::Demo(a) => demo::run(a),
        Command::Stream(a) => cmd_stream::run(*a),
        Command::Sink(a) => bench::sink::run(a),
        Command::Plot(a) => plot::run(a),
        Command::Record(a) => cmd_record::run(a),
        Command::Tracks(a) => cmd_record::run_tracks(a),
        Command::Bench(BenchCommand::Paths(a)) => bench::paths::run(a),
        Command::Bench(BenchCommand::Periodic(a)) => bench::periodic::run(a),
        Command::Bench(BenchCommand::Record(a)) => bench::record::run(a),
        Command::Bench(BenchCommand::Isolation(a)) => bench::qos::isolation(a),
        Command::Bench(BenchCommand::Rtu(a)) => bench::qos::rtu(a),
        Command::Calibrate(a) => calibrate::run(a),
        Command::Hog { kind, file } => bench::hog::run(&kind, file.as_deref()),
        Command::Serve(a) => cmd_serve::run(a),
        Command::Sign(a) => cmd_sign::run(a),
        Command::Ctl(a) => cmd_ctl::run(a).map(|code| {
            if code != 0 {
                std::process::exit(code)
            }
        }),
        Command::Bench(BenchCommand::Http(a)) => bench::http::run(a),
        Command::Bench(BenchCommand::Https(a)) => {
            bench::http::run(bench::http::HttpArgs { https: true, ..a })
        }
        Command::Volume(c) => cmd_volume::run(c),
        Command::Cluster(c) => cmd_cluster::run(c),
        Command::Bench(BenchCommand::Hls(a)) => bench::hls::run(a),
        Command::Bench(BenchCommand::Stripe(a)) => bench::stripe::run(a),
        Command::Bench(BenchCommand::Cues(a)) => bench::cues::run(a),
        Command::Bench(BenchCommand::Rtsp(a)) => bench::rtsp::run(a),
        Command::Bench(BenchCommand::All(a)) => report::run(a),
        Command::Bench(BenchCommand::Admission(a)) => bench::admission::run(a),
        Command::Completions(a) => cmd_manual::completions(a, Cli::command()),
        Command::Man(a) => cmd_manual::man(a, Cli::command()),
    };
    if let Err(e) = r {
        eprintln!("penstock: error: {}", error_text(&e));
        // A malformed endpoint name is bad usage too, as clap's own errors are.
        std::process::exit(
            if e.downcast_ref::<Usage>().is_some()
                || e.downcast_ref::<penstock_core::endpoint::EndpointError>()
                    .is_some()
            {
                2
            } else {
                1
            },
        );
    }
}

/// Bad usage that clap cannot see (flags that only conflict in some combinations): exit 2.
#[derive(Debug)]
pub struct Usage(pub String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

/// Logs to stderr, filtered by `PENSTOCK_LOG`, else `RUST_LOG`, else the default.
fn init_logging(serve: bool, json: bool) {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    // rustls warns of what clients send (an IP address as SNI: wrk does it on every
    // connection), one line per connection: a peer could fill the log. penstock says what
    // matters of a handshake itself, rate-limited (`peer_log`).
    let default = if serve {
        "warn,rustls=error,penstock=info,penstock_server=info,penstock_driver::rlimit=info"
    } else {
        "warn,rustls=error"
    };
    let filter = EnvFilter::try_from_env("PENSTOCK_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.with_ansi(std::io::stderr().is_terminal()).init();
    }
}

/// The error and its causes, each cause once: library errors often already quote their
/// source in their own message.
pub(crate) fn error_text(e: &anyhow::Error) -> String {
    let mut msg = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !msg.contains(&c) {
            msg.push_str(": ");
            msg.push_str(&c);
        }
    }
    msg
}
