//! Which device a read lands on, and what sysfs says of it: the name the engine's disk
//! queues, calibration files and self-calibration's cache give a device.

use std::os::fd::AsFd;
use std::path::PathBuf;

/// The device a read of `fd` lands on: a block device's own number, else its file system's
/// (the disk queue's device, `uring_path`); 0 when fstat fails.
pub fn device_of(fd: impl AsFd) -> u64 {
    match rustix::fs::fstat(fd) {
        Ok(st)
            if rustix::fs::FileType::from_raw_mode(st.st_mode)
                == rustix::fs::FileType::BlockDevice =>
        {
            st.st_rdev
        }
        Ok(st) => st.st_dev,
        Err(_) => 0,
    }
}

pub(crate) fn major_minor(dev: u64) -> (u64, u64) {
    let major = ((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0xfff);
    let minor = ((dev >> 12) & 0xffff_ff00) | (dev & 0xff);
    (major, minor)
}

/// A device's identity as sysfs tells it: size in sectors and model. `None` when the
/// device has no sysfs entry (a virtual file system: nothing to calibrate).
pub(crate) fn identity(dev: u64) -> Option<(u64, String)> {
    let (major, minor) = major_minor(dev);
    let base = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    let size = std::fs::read_to_string(base.join("size"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    // A partition's model is its disk's.
    let model = std::fs::read_to_string(base.join("device/model"))
        .or_else(|_| std::fs::read_to_string(base.join("../device/model")))
        .unwrap_or_default()
        .trim()
        .to_string();
    Some((size, model))
}

/// `/dev/NAME` of device `dev`, from its sysfs `uevent`, when it is that block device.
pub(crate) fn device_node(dev: u64) -> Option<PathBuf> {
    let (major, minor) = major_minor(dev);
    let uevent = std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/uevent")).ok()?;
    let name = uevent.lines().find_map(|l| l.strip_prefix("DEVNAME="))?;
    if name.contains("..") {
        return None;
    }
    let path = PathBuf::from("/dev").join(name);
    let st = rustix::fs::stat(&path).ok()?;
    (rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::BlockDevice
        && st.st_rdev == dev)
        .then_some(path)
}
