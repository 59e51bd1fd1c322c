//! `cargo run --release -p penstock-driver --example cpu_probe -- SECONDS STREAMS...`: the
//! engine's CPU per paced 1316-byte datagram at each stream count (`cpu_probe::send_ns_at`),
//! to see how the cost depends on the rate. `-- burst UNITS...`: the CPU a byte when that
//! many 1 MiB units fall due at once (`cpu_probe::burst_byte_ps`), against the paced figure
//! (`cpu_probe::byte_ps` of 256 MiB).
fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1).peekable();
    if args.peek().map(String::as_str) == Some("burst") {
        args.next();
        let paced = penstock_driver::cpu_probe::byte_ps(256 << 20)?;
        println!("paced 1 MiB units: {paced} ps a byte");
        for n in args {
            let n: usize = n.parse().map_err(std::io::Error::other)?;
            let ps = penstock_driver::cpu_probe::burst_byte_ps(n)?;
            println!(
                "{n} units due at once: {ps} ps a byte ({:.3} ms a unit)",
                ps as f64 * (1u64 << 20) as f64 / 1e9
            );
        }
        return Ok(());
    }
    let secs: f64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(1.0);
    for n in args {
        let n: usize = n.parse().map_err(std::io::Error::other)?;
        let ns =
            penstock_driver::cpu_probe::send_ns_at(std::time::Duration::from_secs_f64(secs), n)?;
        println!("{n} streams: {ns} ns a datagram");
    }
    Ok(())
}
