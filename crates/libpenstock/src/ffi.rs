//! The boundary's three rules, once: no panic crosses it ([`guard`]), no pointer is used
//! unchecked ([`str_arg`], [`Registry`]), and every failure leaves a message
//! (`error::set_last`).

use std::collections::BTreeMap;
use std::ffi::{CStr, c_char, c_int};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use crate::error::{
    Error, PENSTOCK_EHANDLE, PENSTOCK_EINVAL, PENSTOCK_ENULL, PENSTOCK_EPANIC, set_last,
};

/// Runs an entry point's body: its value, or on an error (or a caught panic) the error
/// recorded for `penstock_last_error()` and `fail(code)` returned.
pub(crate) fn guard<T>(
    fail: impl FnOnce(c_int) -> T,
    body: impl FnOnce() -> Result<T, Error>,
) -> T {
    // The body's state is not looked at again after a panic (the call fails), so observing
    // it half-updated is not possible through this call.
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => fail(set_last(e)),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".into());
            fail(set_last(Error::new(
                PENSTOCK_EPANIC,
                format!("internal error in libpenstock (please report it): {what}"),
            )))
        }
    }
}

/// [`guard`] for the calls that return a code (and a non-negative value on success).
pub(crate) fn guard_code(body: impl FnOnce() -> Result<c_int, Error>) -> c_int {
    guard(|code| code, body)
}

/// Reads a C string argument: NUL-terminated UTF-8, not NULL.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string that stays valid and unchanged for the
/// call (the C caller's promise for every `const char *` argument).
pub(crate) unsafe fn str_arg<'a>(p: *const c_char, what: &str) -> Result<&'a str, Error> {
    if p.is_null() {
        return Err(Error::new(PENSTOCK_ENULL, format!("{what} is NULL")));
    }
    // SAFETY: not NULL (checked above) and NUL-terminated and live for the call (the caller's
    // promise above).
    let c = unsafe { CStr::from_ptr(p) };
    c.to_str()
        .map_err(|_| Error::new(PENSTOCK_EINVAL, format!("{what} is not UTF-8")))
}

/// Like [`str_arg`], with NULL read as an empty string (an optional options string).
///
/// # Safety
/// As [`str_arg`].
pub(crate) unsafe fn opt_str_arg<'a>(p: *const c_char, what: &str) -> Result<&'a str, Error> {
    if p.is_null() {
        return Ok("");
    }
    // SAFETY: the caller's promise, passed on.
    unsafe { str_arg(p, what) }
}

/// Handle numbers are unique across every registry and never reused, so a stale handle, or
/// one of another type, is never mistaken for a live one. They start well above 0 (never
/// NULL) and step by 16 (they look like aligned pointers, which is all C sees of them).
static NEXT_HANDLE: AtomicU64 = AtomicU64::new(0x1000);

/// The live objects behind one kind of opaque handle (a B-tree rather than a hash map: its
/// nodes are pointed to from their start, so at exit valgrind counts them reachable, not
/// "possibly lost"). C receives a number disguised as a
/// pointer, and every call looks it up here: a handle is never dereferenced, so a closed,
/// freed or invented handle is an error (`PENSTOCK_EHANDLE`), not undefined behaviour.
pub(crate) struct Registry<T> {
    what: &'static str,
    live: LazyLock<Mutex<BTreeMap<u64, Arc<T>>>>,
}

impl<T> Registry<T> {
    pub const fn new(what: &'static str) -> Registry<T> {
        Registry {
            what,
            live: LazyLock::new(|| Mutex::new(BTreeMap::new())),
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<T>>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers `v` and returns its handle.
    pub fn insert(&self, v: Arc<T>) -> u64 {
        let h = NEXT_HANDLE.fetch_add(16, Ordering::Relaxed);
        self.map().insert(h, v);
        h
    }

    fn unknown(&self, h: u64) -> Error {
        if h == 0 {
            Error::new(PENSTOCK_ENULL, format!("the {} is NULL", self.what))
        } else {
            Error::new(
                PENSTOCK_EHANDLE,
                format!(
                    "{h:#x} is not a live {}: closed or freed already, or never returned by \
                     libpenstock",
                    self.what
                ),
            )
        }
    }

    /// The object behind handle `h`.
    pub fn get(&self, h: u64) -> Result<Arc<T>, Error> {
        self.map().get(&h).cloned().ok_or_else(|| self.unknown(h))
    }

    /// Takes handle `h` out of the registry (it is dead from now on).
    pub fn remove(&self, h: u64) -> Result<Arc<T>, Error> {
        self.map().remove(&h).ok_or_else(|| self.unknown(h))
    }
}
