//! crc32c (the `crc32c` crate, as penstock uses it: one call per 4 KiB unit) against memcpy,
//! on buffers that fit the cache (256 KiB) and that do not (256 MiB), one thread.
use std::hint::black_box;
use std::time::Instant;

fn rate(bytes: usize, reps: usize, f: &mut dyn FnMut()) -> f64 {
    f(); // warm
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..reps { f(); }
        best = best.min(t.elapsed().as_secs_f64());
    }
    (bytes * reps) as f64 / best / 1e9
}

fn main() {
    for &size in &[256usize << 10, 1 << 20, 256 << 20] {
        let reps = ((1usize << 30) / size).max(2);
        let src: Vec<u8> = (0..size).map(|i| (i * 2654435761usize >> 13) as u8).collect();
        let mut dst = vec![0u8; size];
        let memcpy = rate(size, reps, &mut || { dst.copy_from_slice(black_box(&src)); black_box(&dst); });
        let crc_units = rate(size, reps, &mut || {
            let mut x = 0u32;
            for u in black_box(&src).chunks(4096) { x ^= crc32c::crc32c(u); }
            black_box(x);
        });
        let crc_whole = rate(size, reps, &mut || { black_box(crc32c::crc32c(black_box(&src))); });
        // What a verified read does per byte after the kernel's copy: copy then crc.
        let copy_then_crc = rate(size, reps, &mut || {
            dst.copy_from_slice(black_box(&src));
            let mut x = 0u32;
            for u in dst.chunks(4096) { x ^= crc32c::crc32c(u); }
            black_box(x);
        });
        println!("buffer {:>9} B: memcpy {memcpy:6.2} GB/s; crc32c per 4 KiB unit {crc_units:6.2} GB/s ({:.3} ns/B); crc32c whole {crc_whole:6.2} GB/s; memcpy+crc {copy_then_crc:6.2} GB/s (x{:.3} of memcpy)",
            size, 1.0 / crc_units, copy_then_crc / memcpy);
    }
}
