//! A fake disk: one head, requests served one at a time in the order the device received
//! them (its own queue is FIFO: the scheduler's in-flight bound decides how deep it gets).
//! Service time = positioning + len / bandwidth, with no positioning when a request starts
//! where the previous one ended (sequential). That is exactly the model admission uses, so a
//! simulated miss is a scheduler or admission bug, not a model mismatch.

use std::collections::VecDeque;
use std::time::Duration;

use penstock_core::admission::Capacity;
use penstock_core::sched::drr::{Request, RequestId};
use penstock_core::time::Instant;

#[derive(Clone, Copy, Debug)]
pub struct DiskModel {
    pub bandwidth_bytes_per_s: u64,
    pub positioning_ns: u64,
}

impl DiskModel {
    pub fn service_ns(&self, len_bytes: u64, sequential: bool) -> u64 {
        let transfer_ns = (u128::from(len_bytes) * 1_000_000_000)
            .div_ceil(u128::from(self.bandwidth_bytes_per_s)) as u64;
        if sequential {
            transfer_ns
        } else {
            self.positioning_ns + transfer_ns
        }
    }

    /// What `penstock calibrate` would measure on this disk (random reads at 4 KiB).
    pub fn capacity(&self, net_bytes_per_s: u64, buffer_count: u32, buffer_bytes: u64) -> Capacity {
        let random_request_bytes = 4096;
        let per_request_ns = self.service_ns(random_request_bytes, false);
        Capacity {
            disk_seq_bytes_per_s: self.bandwidth_bytes_per_s,
            disk_random_iops: 1_000_000_000 / per_request_ns,
            disk_random_request_bytes: random_request_bytes,
            net_bytes_per_s,
            buffer_count,
            buffer_bytes,
            // The simulation models the disk: sends cost no CPU, datagrams no framing here.
            cpu_send_ns: 0,
            ..Capacity::CONSERVATIVE
        }
    }
}

#[derive(Debug)]
pub struct FakeDisk {
    model: DiskModel,
    /// Where the head is after the last accepted request.
    head_bytes: u64,
    /// When the last accepted request finishes.
    busy_until: Instant,
    /// Accepted requests and their completion instants, in completion order.
    queue: VecDeque<(RequestId, Instant)>,
    busy_ns: u64,
}

impl FakeDisk {
    pub fn new(model: DiskModel) -> FakeDisk {
        FakeDisk {
            model,
            head_bytes: 0,
            busy_until: Instant::ZERO,
            queue: VecDeque::new(),
            busy_ns: 0,
        }
    }

    /// The device accepts a request at `now`; it completes after everything before it.
    pub fn start(&mut self, now: Instant, r: &Request) {
        let start = self.busy_until.max(now);
        let service_ns = self
            .model
            .service_ns(r.len_bytes, r.offset_bytes == self.head_bytes);
        self.busy_ns += service_ns;
        self.busy_until = start + Duration::from_nanos(service_ns);
        self.head_bytes = r.offset_bytes + r.len_bytes;
        self.queue.push_back((r.id, self.busy_until));
    }

    /// When the next completion happens, if anything is in the device.
    pub fn next_completion(&self) -> Option<Instant> {
        self.queue.front().map(|&(_, at)| at)
    }

    /// The request completing at or before `now`, if any.
    pub fn pop_completed(&mut self, now: Instant) -> Option<RequestId> {
        match self.queue.front() {
            Some(&(id, at)) if at <= now => {
                self.queue.pop_front();
                Some(id)
            }
            _ => None,
        }
    }

    pub fn busy_ns(&self) -> u64 {
        self.busy_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use penstock_core::sched::drr::{ClassId, DeviceId};

    #[test]
    fn service_is_positioning_plus_transfer_and_queues_fifo() {
        let m = DiskModel {
            bandwidth_bytes_per_s: 100_000_000,
            positioning_ns: 5_000_000,
        };
        let mut d = FakeDisk::new(m);
        let r = |id, offset_bytes| Request {
            id: RequestId(id),
            class: ClassId::from_index(0),
            device: DeviceId(0),
            offset_bytes,
            len_bytes: 1_000_000,
            deadline: None,
        };
        d.start(Instant::ZERO, &r(1, 0)); // sequential from 0: 10 ms
        d.start(Instant::ZERO, &r(2, 5_000_000)); // seek: 15 ms more
        assert_eq!(d.next_completion(), Some(Instant::from_nanos(10_000_000)));
        assert_eq!(d.pop_completed(Instant::from_nanos(9_999_999)), None);
        assert_eq!(
            d.pop_completed(Instant::from_nanos(10_000_000)),
            Some(RequestId(1))
        );
        assert_eq!(d.next_completion(), Some(Instant::from_nanos(25_000_000)));
        let cap = m.capacity(1, 1, 1);
        assert_eq!(cap.disk_random_iops, 1_000_000_000 / 5_040_960);
    }
}
