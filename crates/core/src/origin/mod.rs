//! Origin reads (issue 18, item 1), the pure half: a path missing beneath the root is read
//! from an origin (an HTTP server with `Range`, or S3) by aligned range GETs into a local
//! cache of blocks. Nothing here does I/O or reads a clock; the server's `origin` module
//! executes what these types decide (docs/origin.md).
//!
//! - [`block`]: an object's block geometry — which blocks and which bytes of each serve a
//!   byte range, the `Range` header of a block, the read-ahead window.
//! - [`reply`]: an origin's answer to a block request checked against what was asked
//!   (`Content-Range`, lengths): a short or garbled range is an error, never a block.
//! - [`table`]: the cache's bookkeeping — one fetch per block however many readers want it
//!   (the others wait: coalescing), an LRU byte limit evicting whole blocks.
//! - [`credentials`]: the AWS shared credentials file (`aws_access_key_id`, …).

pub mod block;
pub mod credentials;
pub mod reply;
pub mod table;
