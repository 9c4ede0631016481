//! The panic guard: every exported method runs under [`guard`], which turns a panic into an
//! [`ErrorKind::Panic`] error; while it runs, a quiet panic hook records the message instead of
//! printing it.

use std::cell::{Cell, RefCell};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Once;

use abi_stable::std_types::RResult;

use crate::abi::{BackendBox, BackendError, ErrorKind};

/// Runs `f` as an exported function body: a panic becomes an [`ErrorKind::Panic`] error. Inlined
/// into each adapter method (its own file puts its instances in other codegen units otherwise).
#[inline]
pub fn guard<T>(what: &str, f: impl FnOnce() -> Result<T, BackendError>) -> RResult<T, BackendError> {
    install_quiet_panic_hook();
    GUARDED.with(|g| g.set(g.get() + 1));
    let result = catch_unwind(AssertUnwindSafe(f));
    GUARDED.with(|g| g.set(g.get() - 1));
    match result {
        Ok(r) => r.into(),
        Err(payload) => {
            let msg = LAST_PANIC.with(|p| p.borrow_mut().take()).unwrap_or_else(|| panic_text(&*payload));
            RResult::RErr(BackendError::new(
                ErrorKind::Panic,
                format!(
                    "the backend panicked in `{what}`: {msg}\n  this is a bug in the backend; the host caught it and goes on"
                ),
            ))
        }
    }
}

thread_local! {
    static GUARDED: Cell<u32> = const { Cell::new(0) };
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-text panic payload".to_string())
}

/// Inside [`guard`], panics are recorded instead of printed; elsewhere the previous hook runs.
pub(super) fn install_quiet_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if GUARDED.with(Cell::get) > 0 {
                let where_ = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
                let text = format!("{}{where_}", panic_text(info.payload()));
                LAST_PANIC.with(|p| *p.borrow_mut() = Some(text));
            } else {
                previous(info);
            }
        }));
    });
}

/// Wraps the result of a root-module constructor, catching a panic.
pub fn new_backend_guarded(make: impl FnOnce() -> BackendBox) -> RResult<BackendBox, BackendError> {
    guard("new_backend", || Ok(make()))
}
