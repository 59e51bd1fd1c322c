//! RLIMIT_NOFILE, raised at the start of every command that may hold many descriptors
//! (`serve`, `stream`, `record`, `demo`, the benchmarks): the usual soft limit (1,024, or 4,096
//! under some service managers) is far below the hard one (often 524,288, here 20,000), and a
//! stream holds a socket or two. Raising the soft limit up to the hard one needs no privilege;
//! the hard limit is the administrator's (systemd `LimitNOFILE=`, `ulimit -Hn`,
//! /etc/security/limits.conf) and is left alone.

/// RLIMIT_NOFILE before and after [`raise_nofile`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nofile {
    /// The soft limit found at start.
    pub before: u64,
    /// The soft limit now: descriptors this process may hold.
    pub soft: u64,
    /// The hard limit (`u64::MAX`: unlimited, then the kernel's `fs.nr_open` caps the soft).
    pub hard: u64,
}

/// The most the soft limit may be raised to: the hard limit, and never above the kernel's
/// `fs.nr_open` (setrlimit refuses a NOFILE limit beyond it, unlimited included).
fn ceiling(hard: u64) -> u64 {
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(1 << 20);
    hard.min(nr_open)
}

/// Raises the soft RLIMIT_NOFILE to the hard limit (once per process is enough; again is a
/// no-op) and says so at info level ("RLIMIT_NOFILE soft raised from X to Y"), or at warn
/// level why it could not. Child processes inherit the raised limit.
pub fn raise_nofile() -> Nofile {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let cur = getrlimit(Resource::Nofile);
    let before = cur.current.unwrap_or(u64::MAX);
    let hard = cur.maximum.unwrap_or(u64::MAX);
    let target = ceiling(hard);
    let mut soft = before;
    if before < target {
        match setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(target),
                maximum: cur.maximum,
            },
        ) {
            Ok(()) => {
                soft = target;
                tracing::info!(
                    "RLIMIT_NOFILE soft raised from {before} to {target} (the hard limit)"
                );
            }
            Err(e) => {
                tracing::warn!("RLIMIT_NOFILE soft {before} could not be raised to {target}: {e}");
            }
        }
    }
    Nofile { before, soft, hard }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_ends_at_the_hard_one() {
        // Lowering the soft limit of the test process would starve the tests that run beside
        // this one; lowering it in a child process is what `penstock`'s tests do. Here: the
        // result is consistent, and a second call finds nothing left to raise.
        let n = raise_nofile();
        assert_eq!(n.soft, ceiling(n.hard));
        let again = raise_nofile();
        assert_eq!(again.before, n.soft);
        assert_eq!(again.soft, n.soft);
        let now = rustix::process::getrlimit(rustix::process::Resource::Nofile);
        assert_eq!(now.current, Some(n.soft));
    }
}
