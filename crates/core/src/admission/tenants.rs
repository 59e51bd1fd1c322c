//! Tenants' shares of the rt capacity (issue 35 item 4, `[tenants.NAME] rt_share`): a
//! partition of admission, not a second admission test. Each tenant holds `share` of every
//! rt resource (disk time, network, buffers, CPU) for the streams admitted for it; the rest
//! of the rt capacity is for streams of no tenant. A stream passes the server's test
//! (`Admission::test`) *and* its partition's: so one tenant never takes another's part,
//! whatever it asks, and a tenant within its share is never refused for what another did.
//!
//! The disk is charged by each reservation's busiest device (`Reservation::disk_ns_per_s`)
//! against the share of one device's rt time: exact for streams on one device, on the
//! safe side for a volume's.

use super::{CapacityError, Refusal, Reservation, Resource, Shortage, Usage};

/// The most tenants.
pub const TENANTS_MAX: usize = 64;
/// A share is in parts per million.
const PPM: u64 = 1_000_000;

/// A tenant, by its index in [`super::Admission::set_tenants`]'s list.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct TenantId(pub u16);

/// What the streams of one partition hold.
#[derive(Clone, Copy, PartialEq, Eq, Default, Debug)]
pub struct PartitionUsage {
    /// The sum of the reservations' busiest-device time per second.
    pub disk_ns_per_s: u64,
    pub net_bytes_per_s: u64,
    pub buffers: u64,
    pub cpu_ns_per_s: u64,
    pub streams: u32,
}

#[derive(Clone, Debug)]
struct Partition {
    /// The tenant's name; `""` for the part of no tenant.
    name: String,
    share_ppm: u32,
    used: PartitionUsage,
}

/// The tenants' partitions, then the rest's; empty when no tenant is set (no partition
/// test at all).
#[derive(Clone, Debug, Default)]
pub(super) struct Partitions {
    parts: Vec<Partition>,
}

impl Partitions {
    pub(super) fn new(shares: &[(String, u32)]) -> Result<Partitions, CapacityError> {
        if shares.len() > TENANTS_MAX {
            return Err(CapacityError::Tenants(format!(
                "at most {TENANTS_MAX} tenants"
            )));
        }
        let mut total = 0u64;
        let mut parts = Vec::with_capacity(shares.len() + 1);
        for (i, (name, ppm)) in shares.iter().enumerate() {
            if name.is_empty() || shares[..i].iter().any(|(n, _)| n == name) {
                return Err(CapacityError::Tenants(format!(
                    "tenant names are distinct and not empty: {name:?}"
                )));
            }
            if *ppm == 0 {
                return Err(CapacityError::Tenants(format!(
                    "tenant {name}: rt_share above 0"
                )));
            }
            total += u64::from(*ppm);
            parts.push(Partition {
                name: name.clone(),
                share_ppm: *ppm,
                used: PartitionUsage::default(),
            });
        }
        if total > PPM {
            return Err(CapacityError::Tenants(format!(
                "the rt_shares add up to {:.3}, above 1",
                total as f64 / PPM as f64
            )));
        }
        if !parts.is_empty() {
            parts.push(Partition {
                name: String::new(),
                share_ppm: (PPM - total) as u32,
                used: PartitionUsage::default(),
            });
        }
        Ok(Partitions { parts })
    }

    /// `tenant` if it names a partition (or is `None`); with no tenants set, `None` whatever
    /// was asked.
    pub(super) fn check_id(&self, tenant: Option<TenantId>) -> Result<Option<TenantId>, Refusal> {
        if self.parts.is_empty() {
            return Ok(None);
        }
        match tenant {
            Some(TenantId(i)) if usize::from(i) + 1 >= self.parts.len() => {
                Err(Refusal::InvalidQos {
                    reason: format!("no tenant #{i}"),
                })
            }
            t => Ok(t),
        }
    }

    pub(super) fn id(&self, name: &str) -> Option<TenantId> {
        let n = self.parts.len().saturating_sub(1);
        self.parts[..n]
            .iter()
            .position(|p| p.name == name)
            .map(|i| TenantId(i as u16))
    }

    fn index(&self, tenant: Option<TenantId>) -> usize {
        match tenant {
            Some(TenantId(i)) => usize::from(i),
            None => self.parts.len() - 1,
        }
    }

    /// Whether `r` fits its partition (less `instead`, which it would replace).
    pub(super) fn test(
        &self,
        r: &Reservation,
        instead: Option<&Reservation>,
        cap: &Usage,
    ) -> Result<(), Refusal> {
        if self.parts.is_empty() || r.qos.class == super::QosClass::Bulk {
            return Ok(());
        }
        let p = &self.parts[self.index(r.tenant)];
        let share = |v: u64| (u128::from(v) * u128::from(p.share_ppm) / u128::from(PPM)) as u64;
        let back = |f: &dyn Fn(&Reservation) -> u64| instead.map_or(0, f);
        let checks = [
            (
                Resource::Disk(super::DeviceId::UNKNOWN),
                r.disk_ns_per_s,
                p.used.disk_ns_per_s - back(&|o| o.disk_ns_per_s),
                cap.disk_ns_per_s,
            ),
            (
                Resource::Network,
                r.net_bytes_per_s,
                p.used.net_bytes_per_s - back(&|o| o.net_bytes_per_s),
                cap.net_bytes_per_s,
            ),
            (
                Resource::Buffers,
                u64::from(r.buffers),
                p.used.buffers - back(&|o| u64::from(o.buffers)),
                u64::from(cap.buffers),
            ),
            (
                Resource::Cpu,
                r.cpu_ns_per_s,
                p.used.cpu_ns_per_s - back(&|o| o.cpu_ns_per_s),
                cap.cpu_ns_per_s,
            ),
        ];
        let seq = r
            .disk_charges()
            .next()
            .map_or(0, |c| c.figures.disk.seq_bytes_per_s);
        let shortages: Vec<Shortage> = checks
            .iter()
            .filter_map(|&(resource, need, used, total)| {
                let capacity = share(total);
                let left = capacity.saturating_sub(used);
                (need > left).then_some(Shortage {
                    resource,
                    need,
                    left,
                    capacity,
                    disk_seq_bytes_per_s: seq,
                    reserved: false,
                })
            })
            .collect();
        if shortages.is_empty() {
            return Ok(());
        }
        Err(Refusal::Tenant {
            tenant: if p.name.is_empty() {
                "(none)".into()
            } else {
                p.name.clone()
            },
            share_percent: p.share_ppm / 10_000,
            shortages,
        })
    }

    pub(super) fn book(&mut self, r: &Reservation) {
        if self.parts.is_empty() {
            return;
        }
        let i = self.index(r.tenant);
        let u = &mut self.parts[i].used;
        u.disk_ns_per_s += r.disk_ns_per_s;
        u.net_bytes_per_s += r.net_bytes_per_s;
        u.buffers += u64::from(r.buffers);
        u.cpu_ns_per_s += r.cpu_ns_per_s;
        u.streams += 1;
    }

    pub(super) fn release(&mut self, r: &Reservation) {
        if self.parts.is_empty() {
            return;
        }
        let i = self.index(r.tenant);
        let u = &mut self.parts[i].used;
        u.disk_ns_per_s -= r.disk_ns_per_s;
        u.net_bytes_per_s -= r.net_bytes_per_s;
        u.buffers -= u64::from(r.buffers);
        u.cpu_ns_per_s -= r.cpu_ns_per_s;
        assert!(u.streams > 0, "a partition releases what it booked");
        u.streams -= 1;
    }

    pub(super) fn usage(&self) -> Vec<(String, u32, PartitionUsage)> {
        self.parts
            .iter()
            .map(|p| (p.name.clone(), p.share_ppm, p.used))
            .collect()
    }
}
