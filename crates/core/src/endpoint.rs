//! Endpoint names in one namespace (to be written).
