//! Ctrl-C during a launch: the launch runs on a thread of its own under a cancellation token
//! while Python's main thread waits for it, running the signal handlers as it waits.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use pyo3::prelude::*;
use tessel_plugin_api::cancel::Token;

use crate::{Failure, detached, panic_message, raise};

/// How often a thread waiting for a launch runs Python's signal handlers.
const SIGNAL_POLL: Duration = Duration::from_millis(50);

/// [`detached`] for a launch that Ctrl-C may interrupt: on Python's main thread (the one signal
/// handlers run on) `f` runs on a thread of its own under a cancellation token
/// ([`tessel_plugin_api::cancel`]) while this one waits without the GIL, waking every
/// [`SIGNAL_POLL`] to run the signal handlers. One that raises (`KeyboardInterrupt`) cancels the
/// launch, waits for its thread (the interpreter stops before its next program or `for`
/// iteration) and is raised; the launch's outputs are dropped. Elsewhere `f` runs as
/// [`detached`] runs it. A plugin's launch is not cancelled: it runs to its end first.
pub(crate) fn interruptible<T: Send>(py: Python<'_>, f: impl FnOnce() -> Result<T, Failure> + Send) -> PyResult<T> {
    let threading = py.import("threading")?;
    if !threading.call_method0("current_thread")?.is(&threading.call_method0("main_thread")?) {
        return detached(py, f);
    }
    let token = Token::new();
    let waiter = std::thread::current();
    let outcome = std::thread::scope(|s| {
        let worker = s.spawn(|| {
            let r = token.scope(|| catch_unwind(AssertUnwindSafe(f)));
            waiter.unpark();
            r
        });
        loop {
            py.detach(|| std::thread::park_timeout(SIGNAL_POLL));
            if worker.is_finished() {
                return Ok(worker.join());
            }
            if let Err(interrupt) = py.check_signals() {
                token.cancel();
                let _ = py.detach(|| worker.join());
                return Err(interrupt);
            }
        }
    })?;
    match outcome {
        Ok(Ok(r)) => r,
        Ok(Err(p)) | Err(p) => Err(Failure::Panic(panic_message(&*p))),
    }
    .map_err(|f| raise(py, f))
}
