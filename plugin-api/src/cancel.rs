//! Cancelling a launch in flight. A caller that may give up on a launch (the Python module, on
//! Ctrl-C) makes a [`Token`], runs the launch inside [`Token::scope`] on one thread and calls
//! [`Token::cancel`] from another. A backend that runs programs in host memory takes the calling
//! thread's token with [`current`] as the launch starts, stops starting programs (and `for`
//! iterations) once it is cancelled, and fails the launch with
//! [`crate::launch::LaunchError::Cancelled`]: the outputs are then incomplete. A backend that
//! waits for a device (wgpu) looks at the token while it waits and stops waiting once it is
//! cancelled, failing the launch; the device finishes the work it was given on its own.
//!
//! The token travels with the calling thread, not through [`crate::abi`], so that the boundary
//! is unchanged. The built-in backends share this crate (and so the thread's token) with the
//! host; a plugin library has its own copy of the crate, sees no token, and runs its launches to
//! the end.

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// A flag shared by the thread that runs a launch and whoever may cancel it.
#[derive(Clone, Debug, Default)]
pub struct Token(Arc<AtomicBool>);

thread_local! {
    /// The token of the launch this thread runs, if any.
    static CURRENT: RefCell<Option<Token>> = const { RefCell::new(None) };
}

impl Token {
    /// A token not cancelled.
    pub fn new() -> Token {
        Token::default()
    }

    /// Asks every launch running under this token to stop.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Whether [`Token::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// Runs `f` with this token as the calling thread's ([`current`]); the one before comes back
    /// after, also when `f` panics.
    pub fn scope<T>(&self, f: impl FnOnce() -> T) -> T {
        struct Restore(Option<Token>);
        impl Drop for Restore {
            fn drop(&mut self) {
                let before = self.0.take();
                CURRENT.with(|c| *c.borrow_mut() = before);
            }
        }
        let _restore = Restore(CURRENT.with(|c| c.replace(Some(self.clone()))));
        f()
    }
}

/// The token of the launch the calling thread runs ([`Token::scope`]), if any.
pub fn current() -> Option<Token> {
    CURRENT.with(|c| c.borrow().clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_the_threads_inside_its_scope_only() {
        assert!(current().is_none());
        let t = Token::new();
        t.scope(|| {
            let seen = current().expect("the scope's token");
            t.cancel();
            assert!(seen.is_cancelled());
            let inner = Token::new();
            inner.scope(|| assert!(!current().expect("the inner token").is_cancelled()));
            assert!(current().expect("the outer token again").is_cancelled());
            // Another thread does not see it.
            std::thread::scope(|s| s.spawn(|| assert!(current().is_none())).join().expect("no panic"));
        });
        assert!(current().is_none());
    }
}
