//! Cancelling a launch in flight. A caller that may give up on a launch (the Python module, on
//! Ctrl-C) makes a [`Token`], runs the launch inside [`Token::scope`] on one thread and calls
//! [`Token::cancel`] from another. A backend that runs programs in host memory takes the calling
//! thread's token with [`current`] as the launch starts, stops starting programs (and `for`
//! iterations) once it is cancelled, and fails the launch with
//! [`crate::launch::LaunchError::Cancelled`]: the outputs are then incomplete. A backend that
//! waits for a device (wgpu, Mosaic GPU: [`wait_until`]) looks at the token while it waits and
//! stops waiting once it is cancelled, failing the launch; the device finishes the work it was
//! given on its own.
//!
//! The token travels with the calling thread. The built-in backends share this crate (and so the
//! thread's token) with the host. A plugin library has its own copy of the crate, and so its own
//! thread-local: the host hands each plugin it loads [`host_token`] through the root module's
//! `follow_cancel` ([`crate::abi::TesselPlugin`], plugin-api 0.4), and the plugin's [`current`]
//! asks it when the thread has no token of the plugin's own. The flag itself is an
//! `RArc<AtomicBool>`, one allocation both sides read.

use std::cell::RefCell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use abi_stable::std_types::{RArc, ROption};

use crate::abi::TokenSource;

/// A flag shared by the thread that runs a launch and whoever may cancel it.
#[derive(Clone, Debug, Default)]
pub struct Token(RArc<AtomicBool>);

thread_local! {
    /// The token of the launch this thread runs, if any.
    static CURRENT: RefCell<Option<Token>> = const { RefCell::new(None) };
}

/// Where a plugin's [`current`] finds the host's token: the host's [`host_token`].
static HOST: OnceLock<TokenSource> = OnceLock::new();

impl Token {
    /// A token not cancelled.
    pub fn new() -> Token {
        Token(RArc::new(AtomicBool::new(false)))
    }

    /// Asks every launch running under this token to stop.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Whether `other` is this token (a clone of it), not another with the same state.
    pub fn same(&self, other: &Token) -> bool {
        std::ptr::eq(&*self.0, &*other.0)
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

/// The token of the launch the calling thread runs ([`Token::scope`]), if any; in a plugin, the
/// host's ([`follow_host`]) when the plugin set none itself.
pub fn current() -> Option<Token> {
    CURRENT.with(|c| c.borrow().clone()).or_else(|| HOST.get().and_then(|host| (host.token)().into_option().map(Token)))
}

/// The calling thread's token as the host hands it to plugins (`follow_cancel`). Cannot unwind.
pub extern "C" fn host_token() -> ROption<RArc<AtomicBool>> {
    CURRENT.try_with(|c| c.try_borrow().ok().and_then(|t| t.as_ref().map(|t| t.0.clone()))).ok().flatten().into()
}

/// In a plugin: from now on, [`current`] also asks `host` (the host's [`host_token`]) for the
/// calling thread's token. The first call wins. Cannot unwind.
pub extern "C" fn follow_host(host: TokenSource) {
    let _ = HOST.set(host);
}

/// Waits until `done` says the work is finished (`Ok(true)`), or until `token` is cancelled:
/// then `Ok(false)`, the work left to finish on its own. It asks without pausing for the first
/// [`SPIN`] (a short kernel is seen done at once), then sleeps between questions, at most
/// [`POLL_MAX`] (a longer one is seen done at most that late). Without a token it asks until
/// done. An error of `done` ends the wait.
pub fn wait_until<E>(token: Option<&Token>, mut done: impl FnMut() -> Result<bool, E>) -> Result<bool, E> {
    let start = std::time::Instant::now();
    let mut pause = Duration::from_micros(5);
    loop {
        if done()? {
            return Ok(true);
        }
        if token.is_some_and(Token::is_cancelled) {
            return Ok(false);
        }
        if start.elapsed() < SPIN {
            std::thread::yield_now();
        } else {
            std::thread::sleep(pause);
            pause = (pause * 2).min(POLL_MAX);
        }
    }
}

/// How long [`wait_until`] asks without sleeping.
pub const SPIN: Duration = Duration::from_micros(200);

/// The error of a launch whose wait for the device a cancelled token ended.
pub fn cancelled() -> crate::abi::BackendError {
    crate::abi::BackendError::new(
        crate::abi::ErrorKind::Device,
        "the launch was cancelled before the device finished it\n  its outputs are incomplete; launch it again",
    )
}

/// The longest [`wait_until`] sleeps between two questions.
pub const POLL_MAX: Duration = Duration::from_micros(100);

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

    thread_local! {
        /// The flag of the stand-in host below, per test thread.
        static HOSTS: RefCell<Option<Token>> = const { RefCell::new(None) };
    }

    /// A host's `host_token` for the test: this crate plays the plugin, so the host's
    /// thread-local must be another one than [`CURRENT`].
    extern "C" fn stand_in_host() -> ROption<RArc<AtomicBool>> {
        HOSTS.with(|h| h.borrow().as_ref().map(|t| t.0.clone())).into()
    }

    #[test]
    fn a_plugin_follows_the_hosts_token_where_it_has_none_of_its_own() {
        follow_host(TokenSource { token: stand_in_host });
        assert!(current().is_none(), "the host's thread runs no launch yet");
        let host = Token::new();
        HOSTS.with(|h| *h.borrow_mut() = Some(host.clone()));
        let seen = current().expect("the host's token, through follow_host");
        host.cancel();
        assert!(seen.is_cancelled(), "one flag, both sides");
        // A token of the plugin's own comes first.
        let own = Token::new();
        own.scope(|| assert!(!current().expect("the plugin's own").is_cancelled()));
        HOSTS.with(|h| *h.borrow_mut() = None);
        assert!(current().is_none());
        // What a host hands over: its thread's token while a launch runs under it.
        own.scope(|| assert!(host_token().into_option().is_some()));
        assert!(host_token().into_option().is_none());
    }

    #[test]
    fn wait_until_stops_when_done_or_cancelled_and_passes_errors_on() {
        let mut asked = 0;
        assert_eq!(wait_until::<()>(None, || { asked += 1; Ok(asked == 100) }), Ok(true));
        assert_eq!(asked, 100);
        let t = Token::new();
        let canceller = t.clone();
        let started = std::time::Instant::now();
        let waited = std::thread::scope(|s| {
            s.spawn(move || { std::thread::sleep(Duration::from_millis(30)); canceller.cancel(); });
            wait_until::<()>(Some(&t), || Ok(false))
        });
        assert_eq!(waited, Ok(false));
        assert!(started.elapsed() >= Duration::from_millis(30));
        assert_eq!(wait_until(Some(&Token::new()), || Err("device lost")), Err("device lost"));
    }
}
