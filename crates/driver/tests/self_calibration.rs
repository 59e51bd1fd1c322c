//! Self-calibration on first use: a device is measured once, every block read at most once
//! (a re-read is answered by a cache below the device), cached by its identity, used again
//! from the cache, measured again when the cache says another device or another probe.

use std::os::fd::AsFd;
use std::time::Duration;

use penstock_driver::calibration::{SelfCalibration, device_figures};

#[test]
fn a_device_is_measured_once_cached_and_measured_again_when_it_changed() {
    let dir = tempfile::tempdir().unwrap();
    // A file on the device under the build directory (a real disk, not tmpfs).
    let file_path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("self-cal.bin");
    std::fs::write(&file_path, vec![7u8; 64 << 20]).unwrap();
    let file = std::fs::File::open(&file_path).unwrap();
    let dev = penstock_driver::device::device_of(file.as_fd());
    let cfg = SelfCalibration {
        enabled: true,
        cache_dir: Some(dir.path().to_path_buf()),
        time: Duration::from_millis(300),
    };
    let Some(first) = penstock_testreq::require_ok(
        "a measurable device under the build directory",
        device_figures(dev, Some(file.as_fd()), &cfg),
    ) else {
        return;
    };
    println!("measured {first:?}");
    assert!(first.seq_read_bytes_per_s > 0 && first.random_iops > 0);
    assert_eq!(first.probe, penstock_driver::calibration::DEVICE_PROBE);
    // Read through the file (its device node is not readable here, or it is and the file
    // is not needed): no block twice, so never more than the file (or the device) holds.
    match first.data_age_s {
        Some(age) => {
            assert!(
                first.bytes_read > 0 && first.bytes_read <= 64 << 20,
                "{first:?}"
            );
            // Just written: its age is that of this test, minutes at most.
            assert!(age < 3600, "{first:?}");
        }
        None => assert!(first.bytes_read <= first.size_sectors * 512, "{first:?}"),
    }
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
    // A record of the probe before (no `probe`: it read the file over and over) is measured
    // again.
    let now = std::fs::read_to_string(&cached).unwrap();
    let old_probe: String = now
        .lines()
        .filter(|l| !l.starts_with("probe = "))
        .map(|l| format!("{l}\n"))
        .collect();
    let old_probe = old_probe.replace("measured_unix_s = ", "measured_unix_s = 1");
    std::fs::write(&cached, &old_probe).unwrap();
    let fourth = device_figures(dev, Some(file.as_fd()), &cfg).unwrap();
    assert_eq!(fourth.probe, penstock_driver::calibration::DEVICE_PROBE);
    assert_ne!(std::fs::read_to_string(&cached).unwrap(), old_probe);
    assert_ne!(
        std::fs::read_to_string(&cached).unwrap(),
        text.replace("measured_unix_s = ", "measured_unix_s = 1")
    );
    let _ = std::fs::remove_file(&file_path);
}
