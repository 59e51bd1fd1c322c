#![no_main]
//! Decodes arbitrary bytes as a volume metadata slot: never panics, and whatever decodes
//! re-encodes to an image that decodes to the same metadata (the decoder accepts nothing the
//! encoder cannot express). Short inputs are padded into a whole slot so the fuzzer reaches
//! past the size check; the header checksums are fixed up so it reaches past them too.
use libfuzzer_sys::fuzz_target;
use penstock_core::volume::format::{META_HEADER_BYTES, META_SLOT_BYTES};
use penstock_core::volume::{decode, encode};

fuzz_target!(|data: &[u8]| {
    let _ = decode(data);
    let mut slot = vec![0u8; META_SLOT_BYTES as usize];
    let n = data.len().min(slot.len());
    slot[..n].copy_from_slice(&data[..n]);
    // Make the checksums right so the field decoder is exercised.
    let body_len = (u32::from_le_bytes([slot[24], slot[25], slot[26], slot[27]]) as usize)
        .min(slot.len() - META_HEADER_BYTES);
    let body_crc = crc(&slot[META_HEADER_BYTES..META_HEADER_BYTES + body_len]);
    slot[28..32].copy_from_slice(&body_crc.to_le_bytes());
    let header_crc = crc(&slot[0..60]);
    slot[60..64].copy_from_slice(&header_crc.to_le_bytes());
    if let Ok(d) = decode(&slot) {
        let again = decode(&encode(&d.meta, d.member, d.seq)).expect("re-encoded meta decodes");
        assert_eq!(again, d);
        let _ = penstock_core::volume::check(&d.meta);
    }
});

/// crc32c, bitwise (the fuzz crate does not depend on the crc32c crate).
fn crc(bytes: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in bytes {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0x82f6_3b78
            } else {
                c >> 1
            };
        }
    }
    !c
}
