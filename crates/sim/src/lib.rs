//! Seeded simulation of the core: a fake disk and clock, seeded workloads, invariant checks.
//!
//! Every scenario is a pure function of its seed: the same seed replays the same run, event
//! for event. A failure is a [`Violation`] that names the seed; [`replay`] re-runs every
//! scenario for one seed (set `PENSTOCK_SIM_SEED` and run `cargo test -p penstock-sim
//! replay_from_env -- --nocapture`).
//!
//! Scenarios (each checks the properties in its module docs):
//! - [`fairness::run`]: DRR shares with every class backlogged.
//! - [`mixed::run`]: random arrivals, quanta and in-flight bound changed at run time.
//! - [`periodic::run`]: admitted periodic rt streams under a bulk flood, on a fake disk, in
//!   DRR mode (no miss allowed) and FIFO mode (misses expected);
//!   [`periodic::run_synchronous`]: the same with every stream released at once.
//! - [`buffers::run`]: buffer lending and repossession.
#![forbid(unsafe_code)]

pub mod buffers;
pub mod disk;
pub mod fairness;
pub mod mixed;
pub mod periodic;
pub mod rng;

use std::fmt;

/// A broken property, with what is needed to replay it.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Violation {
    pub seed: u64,
    pub scenario: &'static str,
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "seed {} ({:#x}): {}: {} — replay with penstock_sim::replay({}) or \
             PENSTOCK_SIM_SEED={} cargo test -p penstock-sim replay_from_env",
            self.seed, self.seed, self.scenario, self.message, self.seed, self.seed
        )
    }
}

impl std::error::Error for Violation {}

/// Fails the current scenario with a formatted message (used inside scenario functions that
/// return `Result<_, String>`).
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($arg:tt)+) => {
        if !$cond {
            return Err(format!($($arg)+));
        }
    };
}

pub(crate) fn tag<T>(
    seed: u64,
    scenario: &'static str,
    r: Result<T, String>,
) -> Result<T, Violation> {
    r.map_err(|message| Violation {
        seed,
        scenario,
        message,
    })
}

/// Runs every scenario for `seed`; the first violation, if any.
pub fn replay(seed: u64) -> Result<(), Violation> {
    fairness::run(seed)?;
    mixed::run(seed)?;
    periodic::run(seed, penstock_core::sched::drr::SchedMode::Drr)?;
    periodic::run(seed, penstock_core::sched::drr::SchedMode::Fifo)?;
    periodic::run_synchronous(seed, penstock_core::sched::drr::SchedMode::Drr)?;
    buffers::run(seed)?;
    Ok(())
}
