//! The Linux driver.
#![forbid(unsafe_code)]
