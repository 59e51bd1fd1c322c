//! The one unsafe layer (see ARCHITECTURE.md).
