//! penstock's one unsafe layer: the io_uring ring, its registered buffer pool, the operation
//! slab, and the few raw system calls rustix lacks.
//!
//! Modules mirror kernel concepts. Every `unsafe` block carries a `// SAFETY:` comment; the
//! rule they all serve: a buffer handed to the kernel stays the kernel's until the operation's
//! last completion arrives, whatever became of the stream that asked for it.

pub mod ktls;
pub mod pool;
pub mod ring;
pub mod sys;

pub use pool::{BUFFER_ALIGN, BufId, BufferPool, PoolError};
pub use ring::{Completion, Features, QueueError, Registration, Ring, RingConfig, RingError};
