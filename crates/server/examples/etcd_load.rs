//! The etcd load of N penstock nodes, measured against a real etcd through penstock's own
//! client (`cluster::etcd`, the v3 JSON gateway): the figures of docs/cluster.md's scaling
//! estimate.
//!
//! ```text
//! cargo run -p penstock-server --example etcd_load -- URL paced NODES TTL_S SECONDS [ETCD_PID]
//! cargo run -p penstock-server --example etcd_load -- URL max THREADS SECONDS [ETCD_PID]
//! cargo run -p penstock-server --example etcd_load -- URL register NODES HTTP_ADDR TTL_S
//! ```
//!
//! - `paced`: NODES simulated nodes, each doing what `cluster::Keeper::turn` does every
//!   `TTL / 3` — one keepalive, one put of its record (the worst case: the record changed
//!   every turn) and one range of `/penstock/nodes/` — spread over 4 threads, for SECONDS.
//!   Prints each call's rate and latency (p50, p99, max) and, given ETCD_PID, etcd's CPU.
//! - `max`: THREADS threads each doing keepalives, then puts, back to back for SECONDS each:
//!   the rate one etcd member sustains with this client (the client's CPU shares the machine,
//!   so it is a lower bound).
//! - `register`: puts NODES records under a lease of TTL_S, all with HTTP address
//!   HTTP_ADDR (the input of `penstock cluster haproxy-config` with NODES servers), and exits.

use std::time::{Duration, Instant};

use penstock_core::cluster::{NodeName, NodeRecord};
use penstock_server::cluster::etcd::Etcd;

const PREFIX: &str = "/penstock/nodes/";

fn record(i: usize, http: &str) -> NodeRecord {
    NodeRecord {
        name: NodeName::new(&format!("edge-{i:03}")).expect("a valid name"),
        http: http.to_string(),
        rtsp: Some(format!("10.0.{}.{}:8554", i / 250, i % 250 + 1)),
        control: Some(format!("10.0.{}.{}:7070", i / 250, i % 250 + 1)),
        rt_bytes_per_s: 12_500_000,
        rt_bytes_per_s_left: 9_000_000 + i as u64,
        streams: 3,
        streams_max: 1024,
        cache_bytes: Some(1 << 30),
        fill_key: None,
        https: None,
    }
}

/// Latencies of one kind of call, in microseconds.
#[derive(Default)]
struct Calls {
    us: Vec<u64>,
    failed: u64,
}

impl Calls {
    fn time<T, E>(&mut self, f: impl FnOnce() -> Result<T, E>) -> Option<T> {
        let t = Instant::now();
        let r = f();
        self.us.push(t.elapsed().as_micros() as u64);
        match r {
            Ok(v) => Some(v),
            Err(_) => {
                self.failed += 1;
                None
            }
        }
    }

    fn merge(&mut self, o: Calls) {
        self.us.extend(o.us);
        self.failed += o.failed;
    }

    fn report(&mut self, what: &str, seconds: f64) {
        self.us.sort_unstable();
        let q = |p: f64| {
            self.us
                .get(((self.us.len() as f64 * p) as usize).min(self.us.len().saturating_sub(1)))
                .map_or(0.0, |&u| u as f64 / 1000.0)
        };
        println!(
            "{what:<10} {:>8} calls {:>9.1}/s  p50 {:>7.2} ms  p99 {:>7.2} ms  max {:>7.2} ms  failed {}",
            self.us.len(),
            self.us.len() as f64 / seconds,
            q(0.5),
            q(0.99),
            self.us.last().map_or(0.0, |&u| u as f64 / 1000.0),
            self.failed
        );
    }
}

/// etcd's user + system CPU seconds so far (`/proc/PID/stat`, clock ticks of 1/100 s).
fn cpu_s(pid: Option<u32>) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid?)).ok()?;
    let after = stat.rsplit_once(") ")?.1;
    let f: Vec<&str> = after.split(' ').collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

fn client(url: &str) -> Etcd {
    Etcd::new(url, Duration::from_secs(5)).expect("an http:// etcd URL")
}

fn paced(url: &str, nodes: usize, ttl_s: u64, seconds: u64, pid: Option<u32>) {
    const THREADS: usize = 4;
    let period = Duration::from_millis(ttl_s * 1000 / 3);
    let cpu0 = cpu_s(pid);
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs(seconds);
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let url = url.to_string();
            std::thread::spawn(move || {
                let etcd = client(&url);
                let mine: Vec<usize> = (0..nodes).filter(|i| i % THREADS == t).collect();
                let (mut keep, mut put, mut range) =
                    (Calls::default(), Calls::default(), Calls::default());
                let leases: Vec<i64> = mine
                    .iter()
                    .map(|_| etcd.grant(ttl_s as i64).expect("lease grant").id)
                    .collect();
                // Each node's turn at its own phase within the period.
                let mut next: Vec<Instant> = mine
                    .iter()
                    .map(|&i| t0 + period * i as u32 / nodes as u32)
                    .collect();
                let mut turn = 0u64;
                loop {
                    let (k, &due) = next
                        .iter()
                        .enumerate()
                        .min_by_key(|(_, d)| **d)
                        .expect("a node");
                    if due >= end {
                        break;
                    }
                    if let Some(w) = due.checked_duration_since(Instant::now()) {
                        std::thread::sleep(w);
                    }
                    let i = mine[k];
                    keep.time(|| etcd.keepalive(leases[k]));
                    let mut r = record(i, &format!("10.0.{}.{}:8080", i / 250, i % 250 + 1));
                    r.rt_bytes_per_s_left -= turn % 1000;
                    put.time(|| {
                        etcd.put(
                            &format!("{PREFIX}{}", r.name.as_str()),
                            r.encode().as_bytes(),
                            leases[k],
                        )
                    });
                    range.time(|| etcd.range_prefix(PREFIX));
                    next[k] += period;
                    turn += 1;
                }
                for l in leases {
                    let _ = etcd.revoke(l);
                }
                (keep, put, range)
            })
        })
        .collect();
    let (mut keep, mut put, mut range) = (Calls::default(), Calls::default(), Calls::default());
    for h in handles {
        let (k, p, r) = h.join().expect("a load thread");
        keep.merge(k);
        put.merge(p);
        range.merge(r);
    }
    let s = t0.elapsed().as_secs_f64();
    println!("paced: {nodes} nodes, ttl {ttl_s} s (a turn every {period:?}), {s:.1} s");
    keep.report("keepalive", s);
    put.report("put", s);
    range.report("range", s);
    if let (Some(a), Some(b)) = (cpu0, cpu_s(pid)) {
        println!(
            "etcd CPU: {:.2} s in {s:.1} s = {:.1} % of one core",
            b - a,
            (b - a) / s * 100.0
        );
    }
}

fn max(url: &str, threads: usize, seconds: u64, pid: Option<u32>) {
    for what in ["keepalive", "put"] {
        let cpu0 = cpu_s(pid);
        let t0 = Instant::now();
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let url = url.to_string();
                std::thread::spawn(move || {
                    let etcd = client(&url);
                    let lease = etcd.grant(60).expect("lease grant").id;
                    let r = record(t, "10.0.0.1:8080").encode();
                    let key = format!("{PREFIX}max-{t}");
                    let mut c = Calls::default();
                    while t0.elapsed() < Duration::from_secs(seconds) {
                        if what == "put" {
                            c.time(|| etcd.put(&key, r.as_bytes(), lease));
                        } else {
                            c.time(|| etcd.keepalive(lease));
                        }
                    }
                    let _ = etcd.revoke(lease);
                    c
                })
            })
            .collect();
        let mut all = Calls::default();
        for h in handles {
            all.merge(h.join().expect("a load thread"));
        }
        let s = t0.elapsed().as_secs_f64();
        all.report(&format!("{what} x{threads}"), s);
        if let (Some(a), Some(b)) = (cpu0, cpu_s(pid)) {
            println!("etcd CPU: {:.2} s in {s:.1} s", b - a);
        }
    }
}

fn register(url: &str, nodes: usize, http: &str, ttl_s: i64) {
    let etcd = client(url);
    let lease = etcd.grant(ttl_s).expect("lease grant").id;
    for i in 0..nodes {
        let r = record(i, http);
        etcd.put(
            &format!("{PREFIX}{}", r.name.as_str()),
            r.encode().as_bytes(),
            lease,
        )
        .expect("put");
    }
    println!("{nodes} records under lease {lease} (ttl {ttl_s} s)");
}

fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let n = |i: usize| -> u64 {
        a.get(i)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("argument {i}: a number (see the module doc)"))
    };
    let pid = |i: usize| a.get(i).and_then(|v| v.parse().ok());
    match a.get(1).map(String::as_str) {
        Some("paced") => paced(&a[0], n(2) as usize, n(3), n(4), pid(5)),
        Some("max") => max(&a[0], n(2) as usize, n(3), pid(4)),
        Some("register") => register(&a[0], n(2) as usize, &a[3], n(4) as i64),
        _ => eprintln!("usage: see the doc of crates/server/examples/etcd_load.rs"),
    }
}
