//! Kernel TLS (issue 33): with `[tls] ktls = true` a 100 MB body over https leaves penstock by
//! sendfile on a socket the kernel encrypts, none of its bytes read into penstock's memory;
//! with `ktls = false` the same body goes through user-space TLS (read, then encrypted and
//! written). Both byte-exact to curl. This machine's kernel has no `tls` ULP: the transfer
//! runs in a Debian kernel under QEMU (`tools/qemu/run.sh`, fetched by `tools/qemu/fetch.sh`,
//! which `.ci/run` runs), or directly where the host kernel has the ULP. The guest's script,
//! `tests/ktls/guest.sh`, prints what it saw; this test reads it.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

const BYTES: u64 = 100 << 20;

fn run(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn host_has_ktls() -> bool {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_ulp")
        .is_ok_and(|s| s.split_whitespace().any(|u| u == "tls"))
}

fn qemu_root() -> PathBuf {
    std::env::var_os("PENSTOCK_QEMU_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/penstock-qemu")
        })
}

fn which(tool: &str) -> PathBuf {
    penstock_testreq::which(tool).unwrap_or_else(|| panic!("{tool} was required"))
}

/// `BYTES` of xorshift output, no two 8-byte words alike: a body whose every misplaced
/// byte changes its hash, made quickly on the host (random bytes made in the guest take
/// the emulated CPU minutes).
fn write_body(path: &Path) {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut buf = Vec::with_capacity(BYTES as usize);
    while (buf.len() as u64) < BYTES {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        buf.extend_from_slice(&x.to_le_bytes());
    }
    std::fs::write(path, &buf).unwrap();
}

/// `KTLS_BYTES mode=M call=C bytes=N` lines → (mode, call) → bytes.
fn bytes_by_call(log: &str) -> BTreeMap<(String, String), u64> {
    let mut out = BTreeMap::new();
    for line in log.lines() {
        let Some(rest) = line.trim().strip_prefix("KTLS_BYTES ") else {
            continue;
        };
        let f: BTreeMap<&str, &str> = rest
            .split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .collect();
        if let (Some(m), Some(c), Some(n)) = (f.get("mode"), f.get("call"), f.get("bytes")) {
            out.insert((m.to_string(), c.to_string()), n.parse().unwrap_or(0));
        }
    }
    out
}

#[test]
fn a_100_mb_body_leaves_by_sendfile_on_a_ktls_socket_and_through_user_space_without_it() {
    for tool in ["curl", "strace", "openssl"] {
        if !penstock_testreq::require(tool) {
            return;
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("conf");
    std::fs::create_dir(&conf).unwrap();
    common::make_ca(&conf);
    // `cert.pem` (the chain) and `cert.key`, as tests/ktls/guest.sh names them.
    common::make_cert(&conf, "cert", "localhost");
    let srv = dir.path().join("srv");
    std::fs::create_dir(&srv).unwrap();
    write_body(&srv.join("big.bin"));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ktls/guest.sh");
    let penstock = env!("CARGO_BIN_EXE_penstock");
    let out = if host_has_ktls() {
        let work = dir.path().join("work");
        run(Command::new("sh")
            .arg(&script)
            .env("PENSTOCK", penstock)
            .env("WORK", &work)
            .env("CONF", &conf)
            .env("SRV", &srv))
    } else {
        let root = qemu_root();
        let missing = (!root.join("ready").exists()).then(|| {
            format!(
                "this kernel has no tls ULP and no QEMU kernel is in {} (tools/qemu/fetch.sh)",
                root.display()
            )
        });
        if !penstock_testreq::require_that("qemu-ktls", missing) {
            return;
        }
        let runner = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/qemu/run.sh");
        let mut cmd = Command::new("bash");
        cmd.arg(&runner)
            .env("PENSTOCK_QEMU_ROOT", &root)
            .args(["--script"])
            .arg(&script)
            .args(["--bin", penstock])
            .arg("--bin")
            .arg(which("curl"))
            .arg("--bin")
            .arg(which("strace"))
            .args(["--mem", "1024", "--timeout", "900"]);
        for f in ["ca.pem", "cert.pem", "cert.key"] {
            cmd.arg("--file")
                .arg(format!("{}:/etc/ktls/{f}", conf.join(f).display()));
        }
        cmd.arg("--file")
            .arg(format!("{}:/srv/big.bin", srv.join("big.bin").display()));
        run(&mut cmd)
    };
    let log = String::from_utf8_lossy(&out.stdout).into_owned();
    let shown: Vec<&str> = log
        .lines()
        .map(|l| l.trim_end_matches('\r'))
        .filter(|l| l.contains("KTLS_") || l.contains("PENSTOCK_QEMU"))
        .collect();
    println!("{}", shown.join("\n"));
    let bytes = bytes_by_call(&log);
    let sum = |mode: &str, calls: &[&str]| -> u64 {
        calls
            .iter()
            .map(|c| {
                bytes
                    .get(&(mode.to_string(), c.to_string()))
                    .copied()
                    .unwrap_or(0)
            })
            .sum()
    };
    let reads = ["read", "pread64", "readv", "preadv"];
    let writes = ["write", "writev", "sendto", "sendmsg"];
    let zero_copy = ["sendfile", "splice"];
    for (mode, path) in [("ktls", "path=ktls"), ("user", "path=tls-user")] {
        let result = shown
            .iter()
            .find(|l| l.contains(&format!("KTLS_RESULT mode={mode} ")))
            .unwrap_or_else(|| panic!("no result for {mode}:\n{log}"));
        assert!(
            result.contains("same=yes"),
            "{mode}: curl got other bytes: {result}"
        );
        assert!(
            result.contains(path),
            "{mode}: the access log names another path: {result}"
        );
    }
    // kTLS: the body by sendfile/splice, the bytes through penstock's memory only heads,
    // handshakes and its own files (under 1 % of the body).
    assert!(
        sum("ktls", &zero_copy) >= BYTES,
        "kTLS: the body did not leave by sendfile: {bytes:?}"
    );
    assert!(
        sum("ktls", &reads) < BYTES / 100,
        "kTLS: the body was read into user space: {bytes:?}"
    );
    assert!(
        sum("ktls", &writes) < BYTES / 100,
        "kTLS: the body was written from user space: {bytes:?}"
    );
    // User-space TLS: the body read into memory once and written encrypted.
    assert!(
        sum("user", &reads) >= BYTES,
        "user TLS: the body was not read: {bytes:?}"
    );
    assert!(
        sum("user", &writes) >= BYTES,
        "user TLS: the body was not written: {bytes:?}"
    );
    // The kernel counted the kTLS session.
    let tx_sw = shown
        .iter()
        .find_map(|l| l.trim().strip_prefix("KTLS_STAT TlsTxSw"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    assert!(
        tx_sw >= 1,
        "/proc/net/tls_stat counts no kTLS transmit session:\n{log}"
    );
}
