//! crc-fast (as penstock uses it since e2607ee: core::crc, one call per 4 KiB unit) against crc32c 0.6
//! and memcpy; checks both give the same values first. `cargo run --release --bin fast`.
use std::hint::black_box;
use std::time::Instant;
fn rate(bytes: usize, reps: usize, f: &mut dyn FnMut()) -> f64 {
    f();
    let mut best = f64::MAX;
    for _ in 0..5 { let t = Instant::now(); for _ in 0..reps { f(); } best = best.min(t.elapsed().as_secs_f64()); }
    (bytes * reps) as f64 / best / 1e9
}
fn main() {
    let probe: Vec<u8> = (0..10000u32).map(|i| (i * 7 + 3) as u8).collect();
    for n in [0usize, 1, 7, 64, 4096, 10000] {
        assert_eq!(crc32c::crc32c(&probe[..n]) as u64, crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, &probe[..n]), "len {n}");
    }
    for &size in &[256usize << 10, 1 << 20, 256 << 20] {
        let reps = ((1usize << 30) / size).max(2);
        let src: Vec<u8> = (0..size).map(|i| (i * 2654435761usize >> 13) as u8).collect();
        let mut dst = vec![0u8; size];
        let memcpy = rate(size, reps, &mut || { dst.copy_from_slice(black_box(&src)); black_box(&dst); });
        let a = rate(size, reps, &mut || { let mut x = 0u32; for u in black_box(&src).chunks(4096) { x ^= crc32c::crc32c(u); } black_box(x); });
        let b = rate(size, reps, &mut || { let mut x = 0u64; for u in black_box(&src).chunks(4096) { x ^= crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, u); } black_box(x); });
        let b1 = rate(size, reps, &mut || { let mut x = 0u64; for u in black_box(&src).chunks(1316) { x ^= crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, u); } black_box(x); });
        println!("{size:>9} B: memcpy {memcpy:6.2} GB/s; crc32c 4K {a:6.2}; crc-fast 4K {b:6.2} ({:.2}x); crc-fast 1316 {b1:6.2}", b / a);
    }
    println!("{}", crc_fast::get_calculator_target(crc_fast::CrcAlgorithm::Crc32Iscsi));
}
