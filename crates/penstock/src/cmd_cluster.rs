//! `penstock cluster`: what etcd says of the cluster (docs/cluster.md). `status` lists the
//! nodes; `haproxy-config` renders HAProxy's configuration from them (`core::cluster::
//! haproxy`) and, with `--watch`, rewrites it when membership changes and reloads HAProxy
//! through its master socket.
//!
//! `--watch` polls (a prefix range every `--interval`) rather than holding etcd's
//! `/v3/watch` stream open: the gateway's watch is a never-ending HTTP response that needs
//! its own reader and reconnection, while a poll is one bounded call, and the file is
//! rewritten only when the rendered bytes differ — the records' capacity figures change
//! often but are not in HAProxy's file, so they cause no reload.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use penstock_core::cluster::NodeRecord;
use penstock_core::cluster::haproxy::{HaproxyOptions, render};
use penstock_server::cluster::etcd::{Etcd, EtcdError};

#[derive(Subcommand, Debug)]
pub enum ClusterCommand {
    /// List the nodes registered in etcd: name, addresses, capacity, lease time left.
    Status(StatusArgs),
    /// Render an HAProxy configuration from the nodes in etcd (`balance uri`, `hash-type
    /// consistent`, `hash-balance-factor`, a `/healthz` check per node).
    HaproxyConfig(HaproxyArgs),
}

#[derive(Args, Debug)]
pub struct EtcdArgs {
    /// etcd's client URL (its v3 JSON gateway).
    #[arg(long, default_value = "http://127.0.0.1:2379", value_name = "URL")]
    pub etcd: String,
    /// The key prefix (`[cluster] prefix` of the nodes).
    #[arg(long, default_value = "/penstock")]
    pub prefix: String,
    /// Deadline of each call to etcd.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub etcd_timeout: Duration,
    /// With an https:// etcd: the PEM certificates its certificate must chain to (default:
    /// Mozilla's roots).
    #[arg(long, value_name = "FILE")]
    pub etcd_cacert: Option<PathBuf>,
    /// With an https:// etcd that asks for one: the client certificate (PEM) …
    #[arg(long, value_name = "FILE", requires = "etcd_key")]
    pub etcd_cert: Option<PathBuf>,
    /// … and its key (PEM, mode 0600).
    #[arg(long, value_name = "FILE", requires = "etcd_cert")]
    pub etcd_key: Option<PathBuf>,
}

#[derive(Args, Debug)]
#[command(after_help = "Example:\n  penstock cluster status --etcd http://10.0.0.5:2379 --json")]
pub struct StatusArgs {
    #[command(flatten)]
    pub etcd: EtcdArgs,
    /// One JSON array of the nodes instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  penstock cluster haproxy-config --out /etc/haproxy/penstock.cfg\n  \
    haproxy -W -S /run/haproxy-master.sock -f /etc/haproxy/penstock.cfg &\n  \
    penstock cluster haproxy-config --out /etc/haproxy/penstock.cfg --watch --master-socket /run/haproxy-master.sock"
)]
pub struct HaproxyArgs {
    #[command(flatten)]
    pub etcd: EtcdArgs,
    /// Write the configuration to FILE (atomically: a temporary file renamed) instead of stdout.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// The frontend's address.
    #[arg(long, default_value = "127.0.0.1:8000", value_name = "HOST:PORT")]
    pub bind: String,
    /// `hash-balance-factor`: a node above this percentage of the mean load is skipped for
    /// the next one on the ring (100 ..= 65535).
    #[arg(long, default_value_t = 150)]
    pub balance_factor: u32,
    /// The health check's path on each node.
    #[arg(long, default_value = "/healthz")]
    pub health_path: String,
    /// Interval of the health checks.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub check_interval: Duration,
    /// HAProxy's `maxconn` (it needs about two descriptors a connection under its
    /// RLIMIT_NOFILE).
    #[arg(long, default_value_t = 4096)]
    pub connections_max: u32,
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub timeout_connect: Duration,
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub timeout_client: Duration,
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub timeout_server: Duration,
    /// Keep running: read etcd every --interval and rewrite --out when the nodes changed
    /// (then reload HAProxy through --master-socket). Stops on SIGTERM/SIGINT.
    #[arg(long, requires = "out")]
    pub watch: bool,
    /// How often --watch reads etcd.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub interval: Duration,
    /// HAProxy's master CLI socket (`haproxy -W -S PATH`): `reload` is sent there after
    /// each rewrite.
    #[arg(long, value_name = "PATH", requires = "watch")]
    pub master_socket: Option<PathBuf>,
}

pub fn run(c: ClusterCommand) -> Result<()> {
    match c {
        ClusterCommand::Status(a) => status(a),
        ClusterCommand::HaproxyConfig(a) => haproxy(a),
    }
}

fn client(a: &EtcdArgs) -> Result<Etcd> {
    let tls = penstock_server::cluster::etcd::EtcdTls {
        ca_file: a.etcd_cacert.clone(),
        cert_file: a.etcd_cert.clone(),
        key_file: a.etcd_key.clone(),
    };
    Ok(Etcd::with_tls(&a.etcd, a.etcd_timeout, &tls)?)
}

fn nodes_prefix(prefix: &str) -> String {
    format!("{}/nodes/", prefix.trim_end_matches('/'))
}

/// The nodes in etcd, with each one's lease; records that cannot be read are skipped with
/// a warning.
fn read_nodes(etcd: &Etcd, prefix: &str) -> Result<(Vec<(NodeRecord, i64)>, i64)> {
    let (kvs, rev) = etcd.range_prefix(&nodes_prefix(prefix))?;
    let mut out = Vec::new();
    for kv in kvs {
        match std::str::from_utf8(&kv.value)
            .map_err(|e| e.to_string())
            .and_then(|t| NodeRecord::decode(t).map_err(|e| e.0))
        {
            Ok(r) => out.push((r, kv.lease)),
            Err(e) => {
                tracing::warn!(key = %kv.key, error = %e, "skipped a record that cannot be read")
            }
        }
    }
    out.sort_by(|a, b| a.0.name.cmp(&b.0.name));
    Ok((out, rev))
}

fn status(a: StatusArgs) -> Result<()> {
    let etcd = client(&a.etcd)?;
    let (nodes, _) = read_nodes(&etcd, &a.etcd.prefix).map_err(|e| unreachable(&etcd, e))?;
    let mut rows = Vec::new();
    for (n, lease) in &nodes {
        let ttl = if *lease == 0 {
            None
        } else {
            etcd.time_to_live(*lease)?
        };
        rows.push((n, ttl));
    }
    if a.json {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|(n, ttl)| {
                serde_json::json!({
                    "name": n.name.as_str(),
                    "http": n.http,
                    "rtsp": n.rtsp,
                    "control": n.control,
                    "rt_bytes_per_s": n.rt_bytes_per_s,
                    "rt_bytes_per_s_left": n.rt_bytes_per_s_left,
                    "streams": n.streams,
                    "streams_max": n.streams_max,
                    "cache_bytes": n.cache_bytes,
                    "lease_ttl_left_s": ttl,
                })
            })
            .collect();
        println!("{}", serde_json::Value::Array(v));
        return Ok(());
    }
    println!(
        "{:<20} {:<22} {:<22} {:>14} {:>14} {:>9} {:>7}",
        "NODE", "HTTP", "RTSP", "RT_LEFT_B/S", "RT_B/S", "STREAMS", "TTL_S"
    );
    for (n, ttl) in &rows {
        println!(
            "{:<20} {:<22} {:<22} {:>14} {:>14} {:>9} {:>7}",
            n.name.as_str(),
            n.http,
            n.rtsp.as_deref().unwrap_or("-"),
            n.rt_bytes_per_s_left,
            n.rt_bytes_per_s,
            format!("{}/{}", n.streams, n.streams_max),
            ttl.map_or_else(|| "-".into(), |t| t.to_string()),
        );
    }
    println!("{} node(s) in {}", rows.len(), etcd.endpoint());
    Ok(())
}

/// An etcd that cannot be reached said so in plain words: what the nodes do meanwhile
/// and where each one says how stale its membership is (docs/cluster.md).
fn unreachable(etcd: &Etcd, e: anyhow::Error) -> anyhow::Error {
    match e.downcast_ref::<EtcdError>() {
        Some(EtcdError::Transport { .. }) => e.context(format!(
            "etcd at {} is unreachable: the membership cannot be read. Nodes keep serving \
             with the membership they last read; each one's /metrics says since when \
             (penstock_cluster_membership 0, penstock_cluster_last_refresh_timestamp_seconds)",
            etcd.endpoint()
        )),
        _ => e,
    }
}

fn options(a: &HaproxyArgs) -> HaproxyOptions {
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    HaproxyOptions {
        bind: a.bind.clone(),
        balance_factor_percent: a.balance_factor,
        health_path: a.health_path.clone(),
        check_interval_ms: ms(a.check_interval),
        timeout_connect_ms: ms(a.timeout_connect),
        timeout_client_ms: ms(a.timeout_client),
        timeout_server_ms: ms(a.timeout_server),
        connections_max: a.connections_max,
        ..HaproxyOptions::default()
    }
}

fn rendered(etcd: &Etcd, a: &HaproxyArgs) -> Result<(String, usize)> {
    let (nodes, rev) = read_nodes(etcd, &a.etcd.prefix)?;
    let records: Vec<NodeRecord> = nodes.into_iter().map(|(n, _)| n).collect();
    let text = render(
        &records,
        &options(a),
        &format!(
            "{} node(s) under {} at etcd revision {rev}",
            records.len(),
            nodes_prefix(&a.etcd.prefix)
        ),
    )?;
    Ok((text, records.len()))
}

/// Writes `text` to `path` through a temporary file in the same directory and a rename, so
/// that HAProxy never reads half a file.
fn write_atomic(path: &Path, text: &str) -> Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("a temporary file in {}", dir.display()))?;
    tmp.write_all(text.as_bytes())?;
    tmp.as_file().sync_all()?;
    tmp.persist(path)
        .with_context(|| format!("renaming onto {}", path.display()))?;
    Ok(())
}

/// `reload` on HAProxy's master CLI; what it answered (HAProxy 2.6 answers nothing and
/// closes; later versions say `Success=1`).
fn reload_haproxy(socket: &Path) -> Result<String> {
    let mut s = UnixStream::connect(socket)
        .with_context(|| format!("HAProxy master socket {}", socket.display()))?;
    let t = Some(Duration::from_secs(5));
    s.set_read_timeout(t)?;
    s.set_write_timeout(t)?;
    s.write_all(b"reload\n")?;
    let mut reply = String::new();
    let _ = s.take(64 * 1024).read_to_string(&mut reply);
    if reply.contains("Success=0") {
        bail!("HAProxy refused the reload: {}", reply.trim());
    }
    Ok(reply.trim().to_string())
}

fn haproxy(a: HaproxyArgs) -> Result<()> {
    let etcd = client(&a.etcd)?;
    let (text, count) = rendered(&etcd, &a)?;
    let Some(out) = a.out.clone() else {
        print!("{text}");
        return Ok(());
    };
    write_atomic(&out, &text)?;
    eprintln!("wrote {} ({count} node(s))", out.display());
    if !a.watch {
        return Ok(());
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    let mut current = text;
    let step = Duration::from_millis(50);
    while !stop.load(Ordering::Acquire) {
        let mut slept = Duration::ZERO;
        while slept < a.interval && !stop.load(Ordering::Acquire) {
            std::thread::sleep(step.min(a.interval - slept));
            slept += step;
        }
        if stop.load(Ordering::Acquire) {
            break;
        }
        let (text, count) = match rendered(&etcd, &a) {
            Ok(r) => r,
            Err(e) => {
                // etcd out of reach: HAProxy keeps the last configuration (its health
                // checks still drop dead nodes).
                tracing::warn!(error = %crate::error_text(&e), "reading etcd failed; keeping the last configuration");
                continue;
            }
        };
        if text == current {
            continue;
        }
        write_atomic(&out, &text)?;
        current = text;
        eprintln!(
            "membership changed: wrote {} ({count} node(s))",
            out.display()
        );
        if let Some(sock) = &a.master_socket {
            match reload_haproxy(sock) {
                Ok(r) => eprintln!(
                    "reloaded HAProxy{}",
                    if r.is_empty() {
                        String::new()
                    } else {
                        format!(": {r}")
                    }
                ),
                Err(e) => {
                    tracing::warn!(error = %crate::error_text(&e), "HAProxy reload failed")
                }
            }
        }
    }
    Ok(())
}
