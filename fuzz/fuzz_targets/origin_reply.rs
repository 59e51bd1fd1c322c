#![no_main]
//! Arbitrary bytes as an origin's reply framing (docs/origin.md): a `Content-Range` value,
//! a status and a length checked against a block request, and a credentials file. Nothing
//! panics; a reply that passes is the block asked, no more.
use libfuzzer_sys::fuzz_target;
use penstock_core::origin::block::Geometry;
use penstock_core::origin::credentials::parse_credentials;
use penstock_core::origin::reply::{Asked, check_reply, parse_content_range};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = parse_content_range(text);
    let _ = parse_credentials(text, "default");
    let (head, tail) = data.split_at(data.len().min(6));
    let mut n = [0u8; 8];
    n[..head.len()].copy_from_slice(head);
    let size = u64::from(u16::from_le_bytes([n[0], n[1]])) + 1;
    let block = u64::from(u16::from_le_bytes([n[2], n[3]]).max(1));
    let index = u64::from(n[4] % 8);
    let status = [200u16, 206, 416, 304][usize::from(n[5] % 4)];
    let Some((start, len_bytes)) = Geometry::new(size, block).extent(index) else {
        return;
    };
    let asked = Asked {
        start,
        len_bytes,
        size_bytes: Some(size),
    };
    let cr = std::str::from_utf8(tail).ok();
    if let Ok(shape) = check_reply(asked, status, cr, Some(len_bytes)) {
        assert_eq!(shape.size_bytes, size);
        assert_eq!(shape.body_bytes, len_bytes);
    }
});
