//! TLS on the HTTP listeners named `https://…` (docs/tls.md).
//!
//! - [`TlsConfig`], the `[tls]` section: certificate chains and keys as PEM files, several
//!   chosen by the client's SNI name, the handshake's deadline, and whether kernel TLS may
//!   be used.
//! - [`Tls`]: the one rustls `ServerConfig` every TLS listener uses (TLS 1.2 and 1.3, ALPN
//!   `http/1.1`, the `ring` provider) and the certificates behind it ([`CertStore`]), which
//!   SIGHUP replaces as a whole ([`Tls::reload`]): handshakes after the switch get the new
//!   ones, connections already up keep theirs.
//! - [`plan`]: the one place that decides a TLS connection's data path from facts — the
//!   kernel's `tls` ULP ([`penstock_uring::ktls::ulp_available`], read once at start) and
//!   the negotiated cipher: [`TlsPath::Ktls`] (keys handed to the kernel after the
//!   handshake, [`hand_to_kernel`]; sendfile then runs unchanged) or [`TlsPath::User`]
//!   (rustls encrypts in user space; file bytes are read with `pread` into a bounded buffer).
//!
//! A file is refused with a clear error: a key readable by group or others, a key that does
//! not match its certificate, a file with no certificate or no key. An expired (or not yet
//! valid) certificate is served with a warning, as nginx does.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use penstock_uring::ktls;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{CipherSuite, ConnectionTrafficSecrets, ServerConnection};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::{Deserialize, Serialize};

/// `[tls]`: what every TLS listener serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// `[[tls.certificates]]`: `cert` (the chain, leaf first, PEM) and `key` (PEM, mode 0600
    /// or stricter). The client's SNI name picks the certificate whose names (its
    /// subjectAltName DNS entries, `*.` wildcards for one label) match; without a match, or
    /// without SNI, the first one.
    pub certificates: Vec<CertificatePair>,
    /// A TLS connection must finish its handshake within this long, else it is closed.
    pub handshake_timeout_ms: u64,
    /// Use kernel TLS where the kernel offers it (`tcp_available_ulp` lists `tls`) and the
    /// cipher allows; `false` keeps every connection on user-space TLS.
    pub ktls: bool,
}

impl Default for TlsConfig {
    fn default() -> TlsConfig {
        TlsConfig {
            certificates: Vec::new(),
            handshake_timeout_ms: 10_000,
            ktls: true,
        }
    }
}

/// One certificate chain and its key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CertificatePair {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TlsConfig {
    /// What can be checked without reading the files.
    pub fn check(&self) -> Result<(), String> {
        if self.handshake_timeout_ms == 0 {
            return Err("tls.handshake_timeout_ms must be above 0".into());
        }
        Ok(())
    }
}

/// How a TLS connection's bytes are encrypted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsPath {
    /// By the kernel (TLS ULP, keys set with `TLS_TX`/`TLS_RX`): sendfile works as on a
    /// plain socket.
    Ktls,
    /// By rustls in this process: the body's bytes pass through a buffer of ours.
    User,
}

impl TlsPath {
    /// The name in the access log's `path=` and the metrics' `path` label.
    pub fn label(self) -> &'static str {
        match self {
            TlsPath::Ktls => "ktls",
            TlsPath::User => "tls-user",
        }
    }
}

/// The data path of a TLS connection whose handshake negotiated `suite`, on a kernel that
/// has (`ulp`) or has not the TLS ULP: the one rule, from facts only.
pub fn plan(ulp: bool, suite: CipherSuite) -> TlsPath {
    if ulp && kernel_has_cipher(suite) {
        TlsPath::Ktls
    } else {
        TlsPath::User
    }
}

/// Whether an interleaved RTSP session's engine stream may write its frames to the
/// connection's socket itself (`[rtsp] interleaved_direct`): only on a plain connection
/// (`tls` `None`).
///
/// - `tls-user`: raw bytes on the socket would break the TLS stream; the frames go through
///   the connection's rustls session instead.
/// - `ktls`: the socket takes plaintext, but the engine sends each frame whole with
///   `MSG_WAITALL` (and may plan SEND_ZC), which the kernel's TLS `sendmsg` refuses with
///   EOPNOTSUPP (seen in the QEMU run of `tests/ktls.rs`: every frame failed); the
///   connection thread writes the frames with a plain `write`, which the kernel encrypts.
pub fn interleaved_direct(configured: bool, tls: Option<TlsPath>) -> bool {
    configured && tls.is_none()
}

/// The AEADs Linux's TLS ULP implements (AES-GCM since 4.13/4.17, ChaCha20-Poly1305 since
/// 5.11), for the suites rustls negotiates.
fn kernel_has_cipher(suite: CipherSuite) -> bool {
    matches!(
        suite,
        CipherSuite::TLS13_AES_128_GCM_SHA256
            | CipherSuite::TLS13_AES_256_GCM_SHA384
            | CipherSuite::TLS13_CHACHA20_POLY1305_SHA256
            | CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
            | CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384
            | CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
            | CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256
            | CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384
            | CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256
    )
}

/// Hands a finished handshake's keys to the kernel: `TCP_ULP "tls"` must already be set on
/// `sock` ([`ktls::attach_ulp`]), and every byte rustls had to send must be out. Sets
/// `TLS_TX` then `TLS_RX`; from then on the socket reads and writes plaintext. On an error
/// the session is lost (rustls gave its secrets up): the caller closes the connection.
///
/// The lead's QEMU harness calls this through `crates/server/tests/tls.rs`
/// (`ktls_serves_a_file_with_sendfile`).
pub fn hand_to_kernel(sock: impl AsFd, conn: ServerConnection) -> io::Result<()> {
    let version = match conn.protocol_version() {
        Some(rustls::ProtocolVersion::TLSv1_2) => ktls::Version::Tls12,
        Some(rustls::ProtocolVersion::TLSv1_3) => ktls::Version::Tls13,
        v => {
            return Err(io::Error::other(format!(
                "kTLS: protocol {v:?} has no kernel support"
            )));
        }
    };
    let secrets = conn
        .dangerous_extract_secrets()
        .map_err(|e| io::Error::other(format!("kTLS: extracting the keys: {e}")))?;
    let tx = kernel_keys(version, secrets.tx)?;
    let rx = kernel_keys(version, secrets.rx)?;
    let fd = sock.as_fd();
    ktls::set_keys(fd, ktls::Direction::Tx, &tx)?;
    ktls::set_keys(fd, ktls::Direction::Rx, &rx)?;
    Ok(())
}

fn kernel_keys(
    version: ktls::Version,
    (seq, s): (u64, ConnectionTrafficSecrets),
) -> io::Result<ktls::Keys> {
    fn arr<const N: usize>(b: &[u8]) -> io::Result<[u8; N]> {
        b.try_into()
            .map_err(|_| io::Error::other("kTLS: a key of an unexpected length"))
    }
    let cipher = match s {
        ConnectionTrafficSecrets::Aes128Gcm { key, iv } => ktls::Cipher::Aes128Gcm {
            key: arr(key.as_ref())?,
            iv: arr(iv.as_ref())?,
        },
        ConnectionTrafficSecrets::Aes256Gcm { key, iv } => ktls::Cipher::Aes256Gcm {
            key: arr(key.as_ref())?,
            iv: arr(iv.as_ref())?,
        },
        ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => ktls::Cipher::Chacha20Poly1305 {
            key: arr(key.as_ref())?,
            iv: arr(iv.as_ref())?,
        },
        _ => return Err(io::Error::other("kTLS: a cipher the kernel lacks")),
    };
    Ok(ktls::Keys {
        version,
        cipher,
        seq,
    })
}

/// The TLS state every listener shares.
#[derive(Debug)]
pub struct Tls {
    config: Arc<rustls::ServerConfig>,
    /// The same, without ALPN, for `rtsps://` listeners (RTSP has no ALPN name; a client
    /// offering one is not refused for it).
    rtsp_config: Arc<rustls::ServerConfig>,
    store: Arc<CertStore>,
    handshake_timeout_ms: AtomicU64,
    /// Decided once at start: kernel TLS allowed (`[tls] ktls`) and the ULP is there.
    ktls: bool,
}

impl Tls {
    /// Loads the certificates (refusing bad files) and builds the rustls configuration.
    /// Says once whether kernel TLS will be used, and why not.
    pub fn start(cfg: &TlsConfig) -> Result<Tls, String> {
        let ulp = ktls::ulp_available();
        let tls = Tls::build(cfg, cfg.ktls && ulp)?;
        if !cfg.ktls {
            tracing::info!("tls: kernel TLS off ([tls] ktls = false): user-space TLS (rustls)");
        } else if !ulp {
            tracing::warn!(
                "tls: this kernel has no TLS ULP (/proc/sys/net/ipv4/tcp_available_ulp lacks \"tls\"; `modprobe tls` if the module exists): user-space TLS for every connection (path=tls-user), file bodies are read into a buffer and encrypted by rustls"
            );
        } else {
            tracing::info!(
                "tls: kernel TLS available: after each handshake the keys go to the kernel and bodies keep sendfile (path=ktls)"
            );
        }
        Ok(tls)
    }

    /// [`Tls::start`] with the kTLS decision given (`ktls`: secrets extractable, no TLS 1.3
    /// tickets).
    pub(crate) fn build(cfg: &TlsConfig, ktls: bool) -> Result<Tls, String> {
        cfg.check()?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let set = load(cfg, &provider)?;
        let store = Arc::new(CertStore {
            set: RwLock::new(Arc::new(set)),
            provider: provider.clone(),
        });
        let mut sc = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|e| format!("tls: {e}"))?
            .with_no_client_auth()
            .with_cert_resolver(store.clone());
        sc.alpn_protocols = vec![b"http/1.1".to_vec()];
        if ktls {
            sc.enable_secret_extraction = true;
            // A ticket sent after the handshake would be a record rustls numbers after the
            // keys went to the kernel; none is sent (resumption by session ID still works
            // for TLS 1.2).
            sc.send_tls13_tickets = 0;
        }
        let mut rtsp = sc.clone();
        rtsp.alpn_protocols = Vec::new();
        Ok(Tls {
            config: Arc::new(sc),
            rtsp_config: Arc::new(rtsp),
            store,
            handshake_timeout_ms: AtomicU64::new(cfg.handshake_timeout_ms),
            ktls,
        })
    }

    /// Reads the files again: all good, they replace the certificates for every handshake
    /// from now on; any error, nothing changes (the caller logs it). Returns the warnings.
    pub fn reload(&self, cfg: &TlsConfig) -> Result<Vec<String>, String> {
        let staged = self.stage(cfg)?;
        let w = staged.warnings.clone();
        self.commit(cfg, staged);
        Ok(w)
    }

    /// Loads and checks `cfg`'s files without applying them ([`Tls::commit`] does).
    pub(crate) fn stage(&self, cfg: &TlsConfig) -> Result<CertSet, String> {
        cfg.check()?;
        load(cfg, &self.store.provider)
    }

    pub(crate) fn commit(&self, cfg: &TlsConfig, set: CertSet) {
        *self.store.set.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(set);
        self.handshake_timeout_ms
            .store(cfg.handshake_timeout_ms, Ordering::Relaxed);
    }

    /// A new server-side session for an accepted connection.
    pub fn accept(&self) -> Result<ServerConnection, rustls::Error> {
        ServerConnection::new(self.config.clone())
    }

    /// A new server-side session for a connection accepted on an `rtsps://` listener.
    pub fn accept_rtsp(&self) -> Result<ServerConnection, rustls::Error> {
        ServerConnection::new(self.rtsp_config.clone())
    }

    pub fn handshake_timeout(&self) -> Duration {
        Duration::from_millis(self.handshake_timeout_ms.load(Ordering::Relaxed))
    }

    /// Whether kernel TLS is tried after handshakes (allowed and the ULP present at start).
    pub fn ktls(&self) -> bool {
        self.ktls
    }

    /// The names served, per certificate (for the start line and tests).
    pub fn names(&self) -> Vec<Vec<String>> {
        let set = self.store.set.read().unwrap_or_else(|p| p.into_inner());
        set.entries.iter().map(|e| e.names.clone()).collect()
    }
}

/// The certificates in force.
#[derive(Debug)]
pub(crate) struct CertSet {
    entries: Vec<Entry>,
    pub(crate) warnings: Vec<String>,
}

#[derive(Debug)]
struct Entry {
    names: Vec<String>,
    key: Arc<CertifiedKey>,
}

/// rustls asks it for a certificate at each ClientHello.
#[derive(Debug)]
struct CertStore {
    set: RwLock<Arc<CertSet>>,
    provider: Arc<CryptoProvider>,
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let set = self.set.read().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(sni) = hello.server_name()
            && let Some(e) = set
                .entries
                .iter()
                .find(|e| e.names.iter().any(|n| name_matches(n, sni)))
        {
            return Some(e.key.clone());
        }
        set.entries.first().map(|e| e.key.clone())
    }
}

/// `pattern` (a certificate's DNS name, maybe `*.example.com`) against a client's SNI name.
fn name_matches(pattern: &str, host: &str) -> bool {
    let host = host.trim_end_matches('.');
    if let Some(suffix) = pattern.strip_prefix("*.") {
        return host
            .split_once('.')
            .is_some_and(|(first, rest)| !first.is_empty() && rest.eq_ignore_ascii_case(suffix));
    }
    pattern.eq_ignore_ascii_case(host)
}

fn load(cfg: &TlsConfig, provider: &CryptoProvider) -> Result<CertSet, String> {
    if cfg.certificates.is_empty() {
        return Err(
            "tls: no [[tls.certificates]] (cert = \"chain.pem\", key = \"key.pem\")".into(),
        );
    }
    let now = SystemTime::now();
    let mut entries = Vec::new();
    let mut warnings = Vec::new();
    for p in &cfg.certificates {
        let (e, mut w) = load_pair(p, provider, now)?;
        for line in &w {
            tracing::warn!(cert = %p.cert.display(), "tls: {line}");
        }
        warnings.append(&mut w);
        entries.push(e);
    }
    Ok(CertSet { entries, warnings })
}

fn load_pair(
    p: &CertificatePair,
    provider: &CryptoProvider,
    now: SystemTime,
) -> Result<(Entry, Vec<String>), String> {
    let cert_name = p.cert.display();
    let key_name = p.key.display();
    key_is_private(&p.key)?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&p.cert)
        .map_err(|e| format!("tls: certificate file {cert_name}: {e}"))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("tls: certificate file {cert_name}: {e}"))?;
    if chain.is_empty() {
        return Err(format!(
            "tls: certificate file {cert_name} holds no CERTIFICATE block (a missing chain: the leaf first, then its intermediates)"
        ));
    }
    let key = PrivateKeyDer::from_pem_file(&p.key)
        .map_err(|e| format!("tls: key file {key_name}: no private key read ({e})"))?;
    let ee = webpki::EndEntityCert::try_from(&chain[0])
        .map_err(|e| format!("tls: certificate file {cert_name}: not a certificate ({e:?})"))?;
    let names: Vec<String> = ee.valid_dns_names().map(str::to_string).collect();
    let mut warnings = Vec::new();
    if chain.len() == 1 && ee.issuer() != ee.subject() {
        warnings.push(format!(
            "{cert_name} holds only the leaf certificate: clients that lack its issuer will refuse it (give the full chain, leaf first)"
        ));
    }
    match validity(&chain[0]) {
        Some((not_before, not_after)) => {
            let t = now
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64);
            if t > not_after {
                warnings.push(format!(
                    "the certificate in {cert_name} expired {} days ago: clients will refuse it",
                    (t - not_after) / 86_400
                ));
            } else if t < not_before {
                warnings.push(format!(
                    "the certificate in {cert_name} is not valid yet: clients will refuse it"
                ));
            }
        }
        None => warnings.push(format!(
            "the validity dates of {cert_name} could not be read"
        )),
    }
    let certified = CertifiedKey::from_der(chain, key, provider).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => format!(
            "tls: key file {key_name} does not match the certificate in {cert_name} (a wrong key)"
        ),
        e => format!("tls: key file {key_name}: {e}"),
    })?;
    Ok((
        Entry {
            names,
            key: Arc::new(certified),
        },
        warnings,
    ))
}

/// A TLS client's configuration for ureq (the etcd client, `docs/cluster.md`): the
/// certificates a server's must chain to — those of `ca_file` (PEM), else Mozilla's roots
/// built in — and, where etcd asks for one (`--client-cert-auth`), a client certificate
/// (`cert_file`, the chain leaf first, and `key_file`, mode 0600). `what` names the keys in
/// errors.
pub fn client_config(
    what: &str,
    ca_file: Option<&Path>,
    cert_file: Option<&Path>,
    key_file: Option<&Path>,
) -> Result<ureq::tls::TlsConfig, String> {
    let mut tls = ureq::tls::TlsConfig::builder();
    if let Some(p) = ca_file {
        tls = tls.root_certs(ureq::tls::RootCerts::Specific(Arc::new(pem_certificates(
            &format!("{what}.ca_file"),
            p,
        )?)));
    }
    match (cert_file, key_file) {
        (None, None) => {}
        (Some(c), Some(k)) => {
            let chain = pem_certificates(&format!("{what}.cert_file"), c)?;
            key_is_private(k)?;
            let pem =
                std::fs::read(k).map_err(|e| format!("{what}.key_file {}: {e}", k.display()))?;
            let key = ureq::tls::PrivateKey::from_pem(&pem)
                .map_err(|e| format!("{what}.key_file {}: no private key ({e})", k.display()))?;
            tls = tls.client_cert(Some(ureq::tls::ClientCert::new_with_certs(&chain, key)));
        }
        _ => return Err(format!("{what}.cert_file and {what}.key_file go together")),
    }
    Ok(tls.build())
}

/// The certificates of a PEM file (other items, such as a key, are ignored): at least one,
/// or why not (`what` names the setting).
pub fn pem_certificates(
    what: &str,
    path: &Path,
) -> Result<Vec<ureq::tls::Certificate<'static>>, String> {
    let name = || format!("{what} {}", path.display());
    let pem = std::fs::read(path).map_err(|e| format!("{}: {e}", name()))?;
    let mut certs = Vec::new();
    for item in ureq::tls::parse_pem(&pem) {
        if let ureq::tls::PemItem::Certificate(c) = item.map_err(|e| format!("{}: {e}", name()))? {
            certs.push(c);
        }
    }
    if certs.is_empty() {
        return Err(format!("{}: no PEM certificate in it", name()));
    }
    Ok(certs)
}

/// A key file must not be readable (nor writable) by group or others, as ssh asks of its
/// keys.
fn key_is_private(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let meta =
        std::fs::metadata(path).map_err(|e| format!("tls: key file {}: {e}", path.display()))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "tls: key file {} is open to group or others (mode {mode:04o}): `chmod 600` it",
            path.display()
        ));
    }
    Ok(())
}

/// One DER TLV: (tag, contents, what follows). `None` on anything malformed.
fn tlv(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, b) = b.split_first()?;
    let (&l0, mut b) = b.split_first()?;
    let len = if l0 < 0x80 {
        usize::from(l0)
    } else {
        let n = usize::from(l0 & 0x7f);
        if n == 0 || n > 4 || b.len() < n {
            return None;
        }
        let l = b[..n]
            .iter()
            .fold(0usize, |l, &x| (l << 8) | usize::from(x));
        b = &b[n..];
        l
    };
    (b.len() >= len).then(|| (tag, &b[..len], &b[len..]))
}

/// A certificate's notBefore and notAfter as Unix seconds (RFC 5280 §4.1: Certificate →
/// tbsCertificate → [version], serial, signature, issuer, validity).
fn validity(der: &[u8]) -> Option<(i64, i64)> {
    let (_, cert, _) = tlv(der)?;
    let (_, tbs, _) = tlv(cert)?;
    let mut rest = tbs;
    let (tag, _, r) = tlv(rest)?;
    if tag == 0xa0 {
        rest = r;
    }
    for _ in 0..3 {
        rest = tlv(rest)?.2;
    }
    let (_, v, _) = tlv(rest)?;
    let (t1, nb, r) = tlv(v)?;
    let (t2, na, _) = tlv(r)?;
    Some((asn1_time(t1, nb)?, asn1_time(t2, na)?))
}

/// UTCTime (`YYMMDDHHMMSSZ`, 1950..2049) or GeneralizedTime (`YYYYMMDDHHMMSSZ`).
fn asn1_time(tag: u8, s: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(s).ok()?;
    let s = s.strip_suffix('Z')?;
    let num = |a: &str| a.parse::<i64>().ok();
    let (year, rest) = match tag {
        0x17 if s.len() == 12 => {
            let yy = num(&s[..2])?;
            (if yy < 50 { 2000 + yy } else { 1900 + yy }, &s[2..])
        }
        0x18 if s.len() == 14 => (num(&s[..4])?, &s[4..]),
        _ => return None,
    };
    let (mo, d, h, mi, se) = (
        num(&rest[0..2])?,
        num(&rest[2..4])?,
        num(&rest[4..6])?,
        num(&rest[6..8])?,
        num(&rest[8..10])?,
    );
    Some(days_from_civil(year, mo, d) * 86_400 + h * 3600 + mi * 60 + se)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The SNI names each certificate answers, for the start line.
pub(crate) fn describe(tls: &Tls) -> String {
    let names: BTreeMap<usize, String> = tls
        .names()
        .into_iter()
        .enumerate()
        .map(|(i, n)| {
            (
                i,
                if n.is_empty() {
                    "(no DNS name)".into()
                } else {
                    n.join(",")
                },
            )
        })
        .collect();
    names.into_values().collect::<Vec<_>>().join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_path_is_ktls_only_with_the_ulp_and_a_kernel_cipher() {
        assert_eq!(
            plan(true, CipherSuite::TLS13_AES_128_GCM_SHA256),
            TlsPath::Ktls
        );
        assert_eq!(
            plan(false, CipherSuite::TLS13_AES_128_GCM_SHA256),
            TlsPath::User
        );
        assert_eq!(
            plan(true, CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA),
            TlsPath::User
        );
        assert_eq!(TlsPath::Ktls.label(), "ktls");
        assert_eq!(TlsPath::User.label(), "tls-user");
    }

    #[test]
    fn no_engine_writes_reach_a_user_space_tls_socket() {
        assert!(interleaved_direct(true, None));
        assert!(!interleaved_direct(true, Some(TlsPath::Ktls)));
        assert!(!interleaved_direct(true, Some(TlsPath::User)));
        assert!(!interleaved_direct(false, None));
        assert!(!interleaved_direct(false, Some(TlsPath::Ktls)));
    }

    #[test]
    fn sni_names_and_wildcards() {
        assert!(name_matches("a.example", "A.Example."));
        assert!(name_matches("*.example", "x.example"));
        assert!(!name_matches("*.example", "x.y.example"));
        assert!(!name_matches("*.example", "example"));
        assert!(!name_matches("a.example", "b.example"));
    }

    /// A server with secret extraction on (as where the kernel has the ULP), the fixture
    /// certificate of fuzz/fixtures, and a client trusting it; handshaken in memory.
    fn handshaken() -> (rustls::ClientConnection, ServerConnection) {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("penstock-ktls-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (cert, key) = (dir.join("c.pem"), dir.join("k.pem"));
        std::fs::write(
            &cert,
            include_bytes!("../../../fuzz/fixtures/tls-fuzz-cert.pem"),
        )
        .unwrap();
        std::fs::write(
            &key,
            include_bytes!("../../../fuzz/fixtures/tls-fuzz-key.pem"),
        )
        .unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        let cfg = TlsConfig {
            certificates: vec![CertificatePair {
                cert: cert.clone(),
                key,
            }],
            ..TlsConfig::default()
        };
        let tls = Tls::build(&cfg, true).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(&cert).unwrap() {
            roots.add(c.unwrap()).unwrap();
        }
        let mut cc = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        cc.enable_secret_extraction = true;
        cc.alpn_protocols = vec![b"http/1.1".to_vec()];
        let mut client =
            rustls::ClientConnection::new(Arc::new(cc), "localhost".try_into().unwrap()).unwrap();
        let mut server = tls.accept().unwrap();
        for _ in 0..10 {
            let mut b = Vec::new();
            while client.wants_write() {
                client.write_tls(&mut b).unwrap();
            }
            server.read_tls(&mut &b[..]).unwrap();
            server.process_new_packets().unwrap();
            let mut b = Vec::new();
            while server.wants_write() {
                server.write_tls(&mut b).unwrap();
            }
            client.read_tls(&mut &b[..]).unwrap();
            client.process_new_packets().unwrap();
            if !client.is_handshaking() && !server.is_handshaking() {
                break;
            }
        }
        assert!(!server.is_handshaking());
        assert!(
            !server.wants_write(),
            "no ticket or other record left to send"
        );
        (client, server)
    }

    /// The kernel's keys made from the server's TX are the client's RX (and the other way),
    /// numbered from where the peer expects the next record.
    #[test]
    fn kernel_keys_are_the_peer_s() {
        let (client, server) = handshaken();
        assert_eq!(
            plan(true, server.negotiated_cipher_suite().unwrap().suite()),
            TlsPath::Ktls
        );
        let v = ktls::Version::Tls13;
        let s = server.dangerous_extract_secrets().unwrap();
        let c = client.dangerous_extract_secrets().unwrap();
        let (s_tx, s_rx) = (kernel_keys(v, s.tx).unwrap(), kernel_keys(v, s.rx).unwrap());
        let (c_tx, c_rx) = (kernel_keys(v, c.tx).unwrap(), kernel_keys(v, c.rx).unwrap());
        assert!(s_tx.cipher == c_rx.cipher && s_tx.seq == c_rx.seq);
        assert!(s_rx.cipher == c_tx.cipher && s_rx.seq == c_tx.seq);
        assert!(s_tx.cipher != s_rx.cipher, "each direction has its own key");
    }

    /// A socket without the ULP refuses the keys: an error (the loop then closes the
    /// connection), not a panic.
    #[test]
    fn a_socket_without_the_ulp_refuses_the_keys() {
        let (_client, server) = handshaken();
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert!(hand_to_kernel(&a, server).is_err());
    }

    #[test]
    fn asn1_times() {
        assert_eq!(asn1_time(0x17, b"700101000000Z"), Some(0));
        assert_eq!(asn1_time(0x18, b"20000301000000Z"), Some(951_868_800));
        assert_eq!(asn1_time(0x17, b"491231235959Z"), Some(2_524_607_999));
        assert_eq!(asn1_time(0x17, b"garbage"), None);
        assert_eq!(validity(b"\x30\x03\x30\x01"), None);
        assert_eq!(validity(b""), None);
    }
}
