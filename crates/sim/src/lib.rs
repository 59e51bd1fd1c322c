//! Seeded simulation of the core (fake disk, network, clock).
#![forbid(unsafe_code)]
