//! The ring against the real kernel: reads, sends, timeouts, zero-copy notifications.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::time::Duration;

use penstock_uring::{Ring, RingConfig, RingError};

fn ring() -> Option<Ring> {
    match Ring::new(&RingConfig {
        buffers: 4,
        buffer_bytes: 8192,
        ..RingConfig::default()
    }) {
        Ok((r, _)) => penstock_testreq::require_ok("io_uring", Ok::<_, String>(r)),
        Err(RingError::Unavailable(e)) => penstock_testreq::require_ok("io_uring", Err(e)),
        Err(e) => panic!("{e}"),
    }
}

fn wait_for(r: &mut Ring, n: usize) -> Vec<penstock_uring::Completion> {
    let mut out = Vec::new();
    for _ in 0..500 {
        r.submit_and_wait(1, Some(Duration::from_millis(10)))
            .unwrap();
        r.reap(&mut out);
        if out.len() >= n {
            break;
        }
    }
    out
}

#[test]
fn read_then_send_the_same_buffer() {
    let Some(mut r) = ring() else { return };
    let mut f = tempfile::tempfile().unwrap();
    let data: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
    f.write_all(&data).unwrap();
    let b = r.pool_mut().alloc().unwrap();
    r.read(f.as_raw_fd(), b, 0, 8192, 0, 0, 0, 7).unwrap();
    let c = wait_for(&mut r, 1);
    assert_eq!((c[0].token, c[0].result), (7, 5000));
    assert_eq!(&r.pool().bytes(b)[..5000], &data[..]);

    let (mut a, s) = std::os::unix::net::UnixStream::pair().unwrap();
    r.send(s.as_raw_fd(), b, 100, 4900, 0, false, 8).unwrap();
    let c = wait_for(&mut r, 1);
    assert_eq!((c[0].token, c[0].result), (8, 4900));
    let mut got = vec![0; 4900];
    a.read_exact(&mut got).unwrap();
    assert_eq!(got, &data[100..]);
    r.pool_mut().free(b);
}

#[test]
fn zero_copy_send_holds_the_buffer_until_notification() {
    let Some(mut r) = ring() else { return };
    if !penstock_testreq::require_that(
        "io_uring SEND_ZC",
        (!r.features().send_zc).then(|| "the kernel's ring has no SEND_ZC".to_string()),
    ) {
        return;
    }
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let s = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (mut peer, _) = l.accept().unwrap();
    let b = r.pool_mut().alloc().unwrap();
    r.pool_mut().bytes_mut(b).fill(9);
    r.send(s.as_raw_fd(), b, 0, 8192, 0, true, 1).unwrap();
    let c = wait_for(&mut r, 2);
    assert_eq!(c[0].result, 8192);
    assert!(
        c[0].more,
        "first SEND_ZC completion announces the notification"
    );
    assert!(c.iter().any(|c| c.notification));
    assert!(!r.pool().in_flight(b));
    let mut got = vec![0; 8192];
    peer.read_exact(&mut got).unwrap();
    assert!(got.iter().all(|&x| x == 9));
    r.pool_mut().free(b);
}

#[test]
fn absolute_timeout_fires_after_its_deadline() {
    let Some(mut r) = ring() else { return };
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let now_ns = now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64;
    r.timeout_at(now_ns + 2_000_000, 3).unwrap();
    let c = wait_for(&mut r, 1);
    assert_eq!(c[0].token, 3);
    assert_eq!(c[0].result, -libc::ETIME);
    let after = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let after_ns = after.tv_sec as u64 * 1_000_000_000 + after.tv_nsec as u64;
    assert!(after_ns >= now_ns + 2_000_000, "woke before the deadline");
}

#[test]
fn dropping_a_ring_with_a_pending_poll_cancels_it() {
    let Some(mut r) = ring() else { return };
    let (_a, s) = std::os::unix::net::UnixStream::pair().unwrap();
    r.poll(s.as_raw_fd(), libc::POLLIN as u32, 1).unwrap();
    r.submit().unwrap();
    assert_eq!(r.in_flight(), 1);
    drop(r); // must not hang or leak: Drop cancels and reaps
}

/// A pool that grows: a buffer added after start is put in the ring's sparse table
/// (READ_FIXED reads into it by index), taken out again when the pool shrinks, and its slot is
/// mapped and registered again when the pool grows once more.
#[test]
fn a_grown_buffer_is_registered_read_into_and_shrunk_away() {
    let r = match Ring::new(&RingConfig {
        buffers: 1,
        buffers_max: 3,
        buffer_bytes: 8192,
        ..RingConfig::default()
    }) {
        Ok(r) => penstock_testreq::require_ok("io_uring", Ok::<_, String>(r)),
        Err(RingError::Unavailable(e)) => penstock_testreq::require_ok("io_uring", Err(e)),
        Err(e) => panic!("{e}"),
    };
    let Some((mut r, reg)) = r else { return };
    let mut f = tempfile::tempfile().unwrap();
    let data: Vec<u8> = (0..8192u32).map(|i| (i % 241) as u8).collect();
    f.write_all(&data).unwrap();
    let first = r.pool_mut().alloc().unwrap();
    assert!(
        r.pool_mut().alloc().is_none(),
        "the start pool is one buffer"
    );
    let g = r.grow_pool().unwrap();
    assert_eq!(r.pool().count(), 2);
    if reg == penstock_uring::Registration::Registered {
        assert!(r.pool().registered(first));
        assert!(
            r.pool().registered(g),
            "a grown buffer joins the sparse table"
        );
    }
    let b = r.pool_mut().alloc().unwrap();
    assert_eq!(b, g);
    r.read(f.as_raw_fd(), b, 0, 8192, 0, 0, 0, 3).unwrap();
    let c = wait_for(&mut r, 1);
    assert_eq!((c[0].token, c[0].result), (3, 8192));
    assert_eq!(r.pool().bytes(b), &data[..]);
    assert!(!r.shrink_pool(), "a held buffer stays");
    r.pool_mut().free(b);
    assert!(r.shrink_pool());
    assert_eq!(r.pool().count(), 1);
    assert!(!r.shrink_pool(), "the start buffers stay");
    let g2 = r.grow_pool().unwrap();
    let b = r.pool_mut().alloc().unwrap();
    assert_eq!(b, g2);
    r.read(f.as_raw_fd(), b, 0, 4096, 4096, 0, 0, 4).unwrap();
    let c = wait_for(&mut r, 1);
    assert_eq!((c[0].token, c[0].result), (4, 4096));
    assert_eq!(&r.pool().bytes(b)[..4096], &data[4096..]);
    r.pool_mut().free(b);
    r.pool_mut().free(first);
}
