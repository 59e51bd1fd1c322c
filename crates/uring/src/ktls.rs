//! Kernel TLS (`Documentation/networking/tls.rst`): after a handshake made in user space,
//! the record keys go to the kernel with two socket options, and from then on `write`,
//! `sendfile` and `splice` on the socket send plaintext that the kernel encrypts into TLS
//! records (and `read` returns decrypted application data with `TLS_RX`).
//!
//! 1. [`attach_ulp`]: `setsockopt(SOL_TCP, TCP_ULP, "tls")`. Until keys are given the socket
//!    passes bytes through unchanged, so a caller whose kernel refuses here keeps its
//!    user-space TLS session intact.
//! 2. [`set_keys`] for [`Direction::Tx`] (and [`Direction::Rx`]): `setsockopt(SOL_TLS,
//!    TLS_TX|TLS_RX, tls12_crypto_info_*)` with the key, the implicit IV (salt) and the
//!    next record's sequence number, as the TLS library extracted them.
//!
//! [`ulp_available`] reads `/proc/sys/net/ipv4/tcp_available_ulp` (it lists `tls` once the
//! `tls` module is loaded; a kernel built without it lists only others, such as `mptcp`).
//! No cryptography happens here: this layer copies key bytes into the kernel's structures.

use std::io;
use std::os::fd::{AsFd, AsRawFd};

/// Whether the running kernel offers the `tls` upper-layer protocol now.
pub fn ulp_available() -> bool {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_ulp")
        .is_ok_and(|s| s.split_whitespace().any(|u| u == "tls"))
}

/// The protocol version of the session whose keys are handed over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    Tls12,
    Tls13,
}

/// The record cipher and its secrets: the key and the 12-byte IV as TLS libraries give them
/// (for AES-GCM the first 4 bytes are the kernel's `salt`, the other 8 its `iv`).
#[derive(Clone, PartialEq, Eq)]
pub enum Cipher {
    Aes128Gcm { key: [u8; 16], iv: [u8; 12] },
    Aes256Gcm { key: [u8; 32], iv: [u8; 12] },
    Chacha20Poly1305 { key: [u8; 32], iv: [u8; 12] },
}

impl std::fmt::Debug for Cipher {
    // Never prints key material.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Cipher::Aes128Gcm { .. } => "Aes128Gcm",
            Cipher::Aes256Gcm { .. } => "Aes256Gcm",
            Cipher::Chacha20Poly1305 { .. } => "Chacha20Poly1305",
        })
    }
}

/// The keys of one direction: cipher, secrets and the sequence number of the next record.
#[derive(Debug, Clone)]
pub struct Keys {
    pub version: Version,
    pub cipher: Cipher,
    pub seq: u64,
}

/// Which direction's keys [`set_keys`] installs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Tx,
    Rx,
}

/// `setsockopt(SOL_TCP, TCP_ULP, "tls")`. `ENOENT` when the kernel has no `tls` module.
pub fn attach_ulp(sock: impl AsFd) -> io::Result<()> {
    let name = b"tls";
    // SAFETY: `name` is a live buffer of `name.len()` bytes for the duration of the call; the
    // kernel copies it (it is a string it looks up, not kept); the descriptor is borrowed.
    let r = unsafe {
        libc::setsockopt(
            sock.as_fd().as_raw_fd(),
            libc::SOL_TCP,
            libc::TCP_ULP,
            name.as_ptr().cast(),
            name.len() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Installs one direction's keys (`SOL_TLS`, `TLS_TX` or `TLS_RX`) on a socket that went
/// through [`attach_ulp`]. The kernel copies the structure; it is wiped here afterwards.
pub fn set_keys(sock: impl AsFd, direction: Direction, keys: &Keys) -> io::Result<()> {
    let version = match keys.version {
        Version::Tls12 => libc::TLS_1_2_VERSION,
        Version::Tls13 => libc::TLS_1_3_VERSION,
    };
    let rec_seq = keys.seq.to_be_bytes();
    let fd = sock.as_fd();
    let name = match direction {
        Direction::Tx => libc::TLS_TX,
        Direction::Rx => libc::TLS_RX,
    };
    match &keys.cipher {
        Cipher::Aes128Gcm { key, iv } => {
            let mut info = libc::tls12_crypto_info_aes_gcm_128 {
                info: libc::tls_crypto_info {
                    version,
                    cipher_type: libc::TLS_CIPHER_AES_GCM_128,
                },
                iv: split8(iv).1,
                key: *key,
                salt: split8(iv).0,
                rec_seq,
            };
            let r = setsockopt_struct(fd, name, &info);
            wipe(&mut info);
            r
        }
        Cipher::Aes256Gcm { key, iv } => {
            let mut info = libc::tls12_crypto_info_aes_gcm_256 {
                info: libc::tls_crypto_info {
                    version,
                    cipher_type: libc::TLS_CIPHER_AES_GCM_256,
                },
                iv: split8(iv).1,
                key: *key,
                salt: split8(iv).0,
                rec_seq,
            };
            let r = setsockopt_struct(fd, name, &info);
            wipe(&mut info);
            r
        }
        Cipher::Chacha20Poly1305 { key, iv } => {
            let mut info = libc::tls12_crypto_info_chacha20_poly1305 {
                info: libc::tls_crypto_info {
                    version,
                    cipher_type: libc::TLS_CIPHER_CHACHA20_POLY1305,
                },
                iv: *iv,
                key: *key,
                salt: [],
                rec_seq,
            };
            let r = setsockopt_struct(fd, name, &info);
            wipe(&mut info);
            r
        }
    }
}

/// TLS record content type of an alert (RFC 8446 5.1).
const CONTENT_TYPE_ALERT: u8 = 21;

/// Sends a close_notify alert (warning level, description 0: RFC 8446 6.1) on a socket whose
/// `TLS_TX` keys the kernel holds: one record of type alert, made by `sendmsg` with a
/// `TLS_SET_RECORD_TYPE` control message (`Documentation/networking/tls.rst`, "Send TLS
/// control messages"). Best effort before the write side closes, as user-space TLS does.
pub fn send_close_notify(fd: impl AsFd) -> io::Result<()> {
    let payload = [1u8, 0u8]; // level warning, close_notify
    // The control buffer: one cmsghdr and one byte of data, aligned as the kernel reads it.
    let space = cmsg_space(1);
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: payload.as_ptr() as *mut libc::c_void,
        iov_len: payload.len(),
    };
    // SAFETY: an all-zero msghdr is a valid empty message; the fields set below point to
    // `iov` (one iovec over `payload`) and `control` (`space` bytes, u64-aligned, so aligned
    // for cmsghdr), all alive until `sendmsg` returns. CMSG_FIRSTHDR of a msghdr whose
    // control length covers one cmsghdr is non-null and points into `control`; the header
    // and its one data byte fit in `space` (CMSG_SPACE(1)).
    let sent = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_TLS;
        (*c).cmsg_type = libc::TLS_SET_RECORD_TYPE;
        (*c).cmsg_len = libc::CMSG_LEN(1) as _;
        *libc::CMSG_DATA(c) = CONTENT_TYPE_ALERT;
        msg.msg_controllen = (*c).cmsg_len;
        libc::sendmsg(fd.as_fd().as_raw_fd(), &msg, libc::MSG_NOSIGNAL)
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn cmsg_space(data: usize) -> usize {
    // SAFETY: CMSG_SPACE only computes a size from its argument.
    unsafe { libc::CMSG_SPACE(data as u32) as usize }
}

/// A 12-byte AES-GCM IV as the kernel's (salt, iv): the implicit 4 bytes, then 8.
fn split8(iv: &[u8; 12]) -> ([u8; 4], [u8; 8]) {
    let mut salt = [0u8; 4];
    let mut rest = [0u8; 8];
    salt.copy_from_slice(&iv[..4]);
    rest.copy_from_slice(&iv[4..]);
    (salt, rest)
}

fn setsockopt_struct<T>(
    fd: std::os::fd::BorrowedFd<'_>,
    name: libc::c_int,
    v: &T,
) -> io::Result<()> {
    // SAFETY: `v` points to a live, initialized `T` (one of libc's `tls12_crypto_info_*`
    // structures, laid out as the kernel's uapi `linux/tls.h` declares them) of exactly
    // `size_of::<T>()` bytes for the duration of the call; the kernel copies it in.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_TLS,
            name,
            (v as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Overwrites a key structure with zeros (volatile, so the write is not optimised away).
fn wipe<T>(v: &mut T) {
    let p = (v as *mut T).cast::<u8>();
    for i in 0..std::mem::size_of::<T>() {
        // SAFETY: `p + i` stays within the `size_of::<T>()` bytes of `*v`, which is
        // exclusively borrowed; the `T`s wiped here are plain byte arrays and integers, for
        // which all-zero bytes are a valid value.
        unsafe { std::ptr::write_volatile(p.add(i), 0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aes_gcm_iv_splits_into_salt_then_explicit_part() {
        let iv = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12];
        assert_eq!(split8(&iv), ([1, 2, 3, 4], [5, 6, 7, 8, 9, 10, 11, 12]));
    }

    #[test]
    fn debug_never_shows_keys() {
        let c = Cipher::Aes128Gcm {
            key: [7; 16],
            iv: [9; 12],
        };
        assert_eq!(format!("{c:?}"), "Aes128Gcm");
    }

    /// Where the kernel has no `tls` module (this VM: `mptcp` only), attaching the ULP fails
    /// and leaves the socket usable; where it has one, it succeeds. Either way it is checked
    /// against what `/proc` says.
    #[test]
    fn attach_ulp_agrees_with_proc() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        let r = attach_ulp(&s);
        assert_eq!(r.is_ok(), ulp_available(), "{r:?}");
        use std::io::{Read, Write};
        s.write_all(b"still plain").unwrap();
        let mut b = [0u8; 11];
        c.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"still plain");
    }
}
