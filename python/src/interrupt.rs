//! Ctrl-C during a launch: the launch runs on a thread of rayon's pool under a cancellation token
//! while Python's main thread waits for it, running the signal handlers as it waits.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::thread::ThreadId;
use std::time::Duration;

use pyo3::prelude::*;
use tessel_plugin_api::cancel::Token;

use crate::{Failure, detached, panic_message, raise};

/// How often a thread waiting for a launch runs Python's signal handlers.
const SIGNAL_POLL: Duration = Duration::from_millis(50);

/// Python's main thread, once a call has been made from it.
static MAIN: OnceLock<ThreadId> = OnceLock::new();

/// Whether this is Python's main thread: the one its signal handlers run on.
fn on_main_thread(py: Python<'_>) -> PyResult<bool> {
    let me = std::thread::current().id();
    if let Some(main) = MAIN.get() {
        return Ok(*main == me);
    }
    let threading = py.import("threading")?;
    let main = threading.call_method0("current_thread")?.is(&threading.call_method0("main_thread")?);
    if main {
        let _ = MAIN.set(me);
    }
    Ok(main)
}

/// [`detached`] for a launch that Ctrl-C may interrupt: on Python's main thread `f` runs on
/// rayon's pool (no thread is made for it) under a cancellation token
/// ([`tessel_plugin_api::cancel`]) while this thread waits without the GIL, waking every
/// [`SIGNAL_POLL`] to run the signal handlers. One that raises (`KeyboardInterrupt`) cancels the
/// launch, which is waited for (the interpreter stops before its next program or `for`
/// iteration; wgpu stops waiting for the device within 50 ms and leaves it to finish alone), and
/// is raised; the launch's outputs are dropped. Elsewhere `f` runs as [`detached`] runs it.
/// Mosaic GPU stops waiting for its kernel likewise, and a plugin follows the token through its
/// root module's `follow_cancel`.
pub(crate) fn interruptible<T: Send>(py: Python<'_>, f: impl FnOnce() -> Result<T, Failure> + Send) -> PyResult<T> {
    if !on_main_thread(py)? {
        return detached(py, f);
    }
    let token = Token::new();
    let waiter = std::thread::current();
    let done = AtomicBool::new(false);
    let result = Mutex::new(None);
    let interrupted = rayon::in_place_scope(|s| {
        let (token, done, result) = (&token, &done, &result);
        s.spawn(move |_| {
            let r = token.scope(|| catch_unwind(AssertUnwindSafe(f)));
            *result.lock().unwrap_or_else(PoisonError::into_inner) = Some(r);
            done.store(true, Ordering::Release);
            waiter.unpark();
        });
        let mut interrupted = None;
        while !done.load(Ordering::Acquire) {
            py.detach(|| std::thread::park_timeout(SIGNAL_POLL));
            if interrupted.is_none()
                && !done.load(Ordering::Acquire)
                && let Err(e) = py.check_signals()
            {
                token.cancel();
                interrupted = Some(e);
            }
        }
        interrupted
    });
    if let Some(e) = interrupted {
        return Err(e);
    }
    match result.into_inner().unwrap_or_else(PoisonError::into_inner) {
        Some(Ok(r)) => r,
        Some(Err(p)) => Err(Failure::Panic(panic_message(&*p))),
        None => Err(Failure::Panic("the launch ended without a result".into())),
    }
    .map_err(|f| raise(py, f))
}
