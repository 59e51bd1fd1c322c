#![no_main]
//! The TLS accept path up to the end of the handshake, with penstock's own server
//! configuration (`penstock_server::tls::Tls`: TLS 1.2/1.3, ALPN http/1.1, the certificate
//! resolver): a client's bytes, in records of any shape, go through `read_tls` and
//! `process_new_packets` as the loop feeds them (`http/tls_io.rs`), and whatever the server
//! answers is drained. Nothing may panic or loop; an error ends the connection as it does
//! in the server.
//!
//! The certificate and key in `fuzz/fixtures/tls-fuzz-*.pem` are a throwaway self-signed
//! pair made for this target only (P-256, CN=penstock-fuzz); they protect nothing.
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use penstock_server::tls::{CertificatePair, Tls, TlsConfig};

static TLS: OnceLock<Tls> = OnceLock::new();

fn tls() -> &'static Tls {
    TLS.get_or_init(|| {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("penstock-fuzz-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cert = dir.join("cert.pem");
        let key = dir.join("key.pem");
        std::fs::write(&cert, include_bytes!("../fixtures/tls-fuzz-cert.pem")).unwrap();
        std::fs::write(&key, include_bytes!("../fixtures/tls-fuzz-key.pem")).unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        Tls::start(&TlsConfig {
            certificates: vec![CertificatePair { cert, key }],
            ..TlsConfig::default()
        })
        .unwrap()
    })
}

fuzz_target!(|data: &[u8]| {
    let mut conn = tls().accept().unwrap();
    // The first byte splits the input into reads of varying sizes, as a socket would.
    let (step, mut rest) = match data.split_first() {
        Some((s, r)) => (usize::from(*s).max(1), r),
        None => return,
    };
    let mut sent = Vec::new();
    for _ in 0..256 {
        if rest.is_empty() {
            break;
        }
        let n = step.min(rest.len());
        let mut chunk = &rest[..n];
        match conn.read_tls(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(used) => rest = &rest[used..],
        }
        let failed = conn.process_new_packets().is_err();
        while conn.wants_write() {
            sent.clear();
            if conn.write_tls(&mut sent).is_err() {
                break;
            }
        }
        if failed {
            break;
        }
    }
});
