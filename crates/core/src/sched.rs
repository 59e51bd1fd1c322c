//! Request and unit schedulers: EDF (deadline order) and DRR (fair shares between classes).
pub mod drr;
pub mod edf;
pub mod policy;
