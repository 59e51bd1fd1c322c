//! CRC-32C (Castagnoli, iSCSI): the checksum of the volume metadata, the block checksums and the
//! index tracks' records, and the benches' byte-identity sums. One place, so every format agrees.
//!
//! `crc-fast` picks the CPU's fastest kernel at run time (AVX-512 VPCLMULQDQ, PCLMULQDQ, SSE 4.2,
//! or a table); on a verified read this pass over every byte is the whole added cost
//! (`bench stripe --checksums`), 2.9–3.1× faster per 4 KiB unit than `crc32c`'s SSE 4.2 lanes on
//! an AVX-512 machine (`bench/results/2026-11-27-vm-2vcpu/crc-vs-memcpy/output-fast-quiet.txt`;
//! what that does to a verified read: `…/crc-fast.md`).

use crc_fast::{CrcAlgorithm, Digest};

/// CRC-32C of `bytes`.
#[inline]
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc_fast::crc32_iscsi(bytes)
}

/// CRC-32C of the bytes `crc` covered followed by `bytes`: `crc32c_append(crc32c(a), b)` is
/// `crc32c(a ++ b)`.
pub fn crc32c_append(crc: u32, bytes: &[u8]) -> u32 {
    // The register is the finished value's complement (CRC-32C's xorout is all ones).
    let mut d = Digest::new_with_init_state(CrcAlgorithm::Crc32Iscsi, u64::from(!crc));
    d.update(bytes);
    d.finalize() as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_standard_check_value() {
        // RFC 3720 B.4 / the CRC catalogue's check value for "123456789".
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c(b""), 0);
        // RFC 3720 B.4: 32 bytes of zeros.
        assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62a8_ab43);
    }

    proptest! {
        #[test]
        fn append_is_the_crc_of_the_concatenation(a in proptest::collection::vec(any::<u8>(), 0..5000),
                                                  b in proptest::collection::vec(any::<u8>(), 0..5000)) {
            let whole: Vec<u8> = a.iter().chain(b.iter()).copied().collect();
            prop_assert_eq!(crc32c_append(crc32c(&a), &b), crc32c(&whole));
            prop_assert_eq!(crc32c_append(0, &whole), crc32c(&whole));
        }
    }
}
