//! `cargo run --release -p penstock-driver --example cpu_probe -- SECONDS STREAMS...`: the
//! engine's CPU per paced 1316-byte datagram at each stream count (`cpu_probe::send_ns_at`),
//! to see how the cost depends on the rate.
fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let secs: f64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(1.0);
    for n in args {
        let n: usize = n.parse().map_err(std::io::Error::other)?;
        let ns =
            penstock_driver::cpu_probe::send_ns_at(std::time::Duration::from_secs_f64(secs), n)?;
        println!("{n} streams: {ns} ns a datagram");
    }
    Ok(())
}
