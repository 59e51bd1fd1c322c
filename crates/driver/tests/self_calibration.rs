//! Self-calibration on first use: a device is measured once (under 3 s at 300 ms a measurement), cached by its
//! identity, used again from the cache, measured again when the cache says another device.

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use penstock_driver::calibration::{SelfCalibration, device_figures};

#[test]
fn a_device_is_measured_once_cached_and_measured_again_when_it_changed() {
    let dir = tempfile::tempdir().unwrap();
    // A file on the device under the build directory (a real disk, not tmpfs).
    let file_path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("self-cal.bin");
    std::fs::write(&file_path, vec![7u8; 64 << 20]).unwrap();
    let file = std::fs::File::open(&file_path).unwrap();
    let dev = penstock_driver::calibration::device_of(file.as_fd());
    let cfg = SelfCalibration {
        enabled: true,
        cache_dir: Some(dir.path().to_path_buf()),
        time: Duration::from_millis(300),
    };
    let t0 = Instant::now();
    let first = match device_figures(dev, Some(file.as_fd()), &cfg) {
        Ok(r) => r,
        Err(e) => {
            println!("SKIPPED: this file system's device cannot be measured: {e}");
            return;
        }
    };
    let took = t0.elapsed();
    println!("measured {first:?} in {took:?}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert!(first.seq_read_bytes_per_s > 0 && first.random_iops > 0);
    // The read depth: one of the depths swept, the shallowest within 5% of the best.
    let depth = first.read_depth.expect("a read depth is measured");
    assert_eq!(
        first
            .seq_read_by_depth
            .iter()
            .map(|f| f.depth)
            .collect::<Vec<_>>(),
        penstock_driver::calibration::READ_DEPTHS
    );
    assert_eq!(
        penstock_driver::calibration::best_read_depth(&first.seq_read_by_depth),
        Some(depth)
    );
    let cached = std::fs::read_dir(dir.path().join("devices"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    // From the cache: the same record, not a new measurement.
    let again = device_figures(dev, Some(file.as_fd()), &cfg).unwrap();
    assert_eq!(again, first);
    // The cache names another device identity (a replaced disk): measured anew.
    let text = std::fs::read_to_string(&cached).unwrap();
    let edited = text.replace(
        &format!("size_sectors = {}", first.size_sectors),
        &format!("size_sectors = {}", first.size_sectors + 1),
    );
    assert_ne!(edited, text);
    std::fs::write(
        &cached,
        edited.replace("measured_unix_s = ", "measured_unix_s = 1"),
    )
    .unwrap();
    let third = device_figures(dev, Some(file.as_fd()), &cfg).unwrap();
    assert_eq!(third.size_sectors, first.size_sectors);
    assert_ne!(
        std::fs::read_to_string(&cached).unwrap(),
        text.replace("measured_unix_s = ", "measured_unix_s = 1")
    );
    let _ = std::fs::remove_file(&file_path);
}
