//! Ctrl-C inside `jax.jit`: the handler's launches stop within moments of SIGINT instead of
//! running to their end.
//!
//! While XLA runs a program, Python's main thread waits inside jaxlib, where Python's own SIGINT
//! handler only notes the signal (the `KeyboardInterrupt` comes once the program has ended). So
//! the handler puts a signal handler of its own in front of whatever handles SIGINT (Python's,
//! as a rule): it writes one byte to a pipe, then passes the signal on unchanged. A thread of
//! tessel's reads the pipe and cancels the token of every launch the handler is running
//! ([`tessel_plugin_api::cancel`]); each launch then fails as cancelled (the interpreter before
//! its next program, wgpu once it stops waiting for the device), XLA raises that as an error from
//! the call, and Python's handler raises `KeyboardInterrupt` when the main thread runs Python
//! again.
//!
//! Installed at the first launch, and again at any launch that finds another handler put in its
//! place (`signal.signal` in Python), chaining to that one. Where SIGINT is ignored (a
//! background job), nothing is installed: Ctrl-C means nothing there.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

use tessel_plugin_api::cancel::Token;

/// The pipe's write end, once made.
static PIPE: AtomicI32 = AtomicI32::new(-1);
/// The handler before ours (`sa_sigaction`, which is `sa_handler` without `SA_SIGINFO`), and
/// its flags.
static PREVIOUS: AtomicUsize = AtomicUsize::new(libc::SIG_DFL);
static PREVIOUS_FLAGS: AtomicI32 = AtomicI32::new(0);
/// The tokens of the launches running now.
static RUNNING: Mutex<Vec<Token>> = Mutex::new(Vec::new());
/// The process that made the pipe: a child made by `fork` has the pipe but not its reader, and
/// its SIGINT is not the parent's.
static OWNER: AtomicI32 = AtomicI32::new(0);
/// Set while [`on_sigint`] runs: a handler installed after ours that chains back to it (and
/// which ours then chains to) must not make the two call each other without end.
static INSIDE: AtomicBool = AtomicBool::new(false);
/// Installs take turns (the handler itself never takes this lock).
static INSTALLING: Mutex<()> = Mutex::new(());

/// A launch's token, cancelled by SIGINT while the value lives.
pub(super) struct Watched(Token);

impl Drop for Watched {
    fn drop(&mut self) {
        let mut running = RUNNING.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(at) = running.iter().position(|t| t.same(&self.0)) {
            running.swap_remove(at);
        }
    }
}

/// Watches `token` for SIGINT until the value returned is dropped.
pub(super) fn watch(token: &Token) -> Watched {
    install();
    RUNNING.lock().unwrap_or_else(PoisonError::into_inner).push(token.clone());
    Watched(token.clone())
}

/// Our handler: one byte down the pipe, then the signal to the handler before ours.
extern "C" fn on_sigint(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    if INSIDE.swap(true, Ordering::Acquire) {
        return;
    }
    let saved = errno::get();
    // SAFETY: `getpid` is async-signal-safe.
    #[allow(unsafe_code, reason = "libc::getpid is an FFI call")]
    let here = unsafe { libc::getpid() };
    let fd = PIPE.load(Ordering::Relaxed);
    if fd >= 0 && here == OWNER.load(Ordering::Relaxed) {
        // SAFETY: `write` is async-signal-safe; a full pipe (non-blocking) drops the byte, and
        // the bytes already there cancel the same launches.
        #[allow(unsafe_code, reason = "libc::write is an FFI call")]
        let _ = unsafe { libc::write(fd, [1u8].as_ptr().cast(), 1) };
    }
    // What the interrupted code saw in `errno` is as it was for the handler we pass on to.
    errno::set(saved);
    chain(signal, info, context);
    INSIDE.store(false, Ordering::Release);
}

/// The signal to the handler before ours, as the kernel would have delivered it.
fn chain(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    let previous = PREVIOUS.load(Ordering::Relaxed);
    match previous {
        libc::SIG_IGN => {}
        libc::SIG_DFL => {
            // The default action (the process ends), as it would have been without us.
            // SAFETY: both are async-signal-safe.
            #[allow(unsafe_code, reason = "libc::signal and libc::raise are FFI calls")]
            unsafe {
                libc::signal(signal, libc::SIG_DFL);
                libc::raise(signal);
            }
        }
        f if PREVIOUS_FLAGS.load(Ordering::Relaxed) & libc::SA_SIGINFO != 0 => {
            // SAFETY: the address `sigaction` reported as this signal's handler, of this type
            // since its flags have SA_SIGINFO; called as the kernel would have called it.
            #[allow(unsafe_code, reason = "calling the handler we replaced")]
            unsafe {
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) = std::mem::transmute(f);
                f(signal, info, context);
            }
        }
        f => {
            // SAFETY: as above, a plain `sa_handler`.
            #[allow(unsafe_code, reason = "calling the handler we replaced")]
            unsafe {
                let f: extern "C" fn(libc::c_int) = std::mem::transmute(f);
                f(signal);
            }
        }
    }
}

/// Makes the pipe and its reader once; puts [`on_sigint`] in front of SIGINT's handler where it
/// is not there already and SIGINT is not ignored.
fn install() {
    static READER: OnceLock<bool> = OnceLock::new();
    let ready = *READER.get_or_init(|| {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: `fds` has room for the two descriptors `pipe` writes.
        #[allow(unsafe_code, reason = "libc::pipe is an FFI call")]
        if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
            return false;
        }
        let [read, write] = fds;
        // Neither end goes to a program this process runs; the write end never blocks the signal
        // handler.
        // SAFETY: `fcntl` on descriptors just made.
        #[allow(unsafe_code, reason = "libc::fcntl is an FFI call")]
        unsafe {
            libc::fcntl(read, libc::F_SETFD, libc::FD_CLOEXEC);
            libc::fcntl(write, libc::F_SETFD, libc::FD_CLOEXEC);
            libc::fcntl(write, libc::F_SETFL, libc::O_NONBLOCK);
        }
        let started = std::thread::Builder::new().name("tessel-sigint".into()).spawn(move || {
            let mut byte = [0u8; 64];
            loop {
                // SAFETY: reads into `byte`, at most its length.
                #[allow(unsafe_code, reason = "libc::read is an FFI call")]
                let n = unsafe { libc::read(read, byte.as_mut_ptr().cast(), byte.len()) };
                if n > 0 {
                    RUNNING.lock().unwrap_or_else(PoisonError::into_inner).iter().for_each(Token::cancel);
                } else if n == 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                    return;
                }
            }
        });
        if started.is_err() {
            return false;
        }
        // SAFETY: `getpid` has no preconditions.
        #[allow(unsafe_code, reason = "libc::getpid is an FFI call")]
        OWNER.store(unsafe { libc::getpid() }, Ordering::Relaxed);
        PIPE.store(write, Ordering::Relaxed);
        true
    });
    if !ready {
        return;
    }
    let ours = on_sigint as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) as usize;
    // Where ours is in place (every launch after the first) or SIGINT is ignored: nothing to do,
    // one system call and no lock.
    let settled = |current: &libc::sigaction| current.sa_sigaction == ours || current.sa_sigaction == libc::SIG_IGN;
    if current().is_none_or(|c| settled(&c)) {
        return;
    }
    let _turn = INSTALLING.lock().unwrap_or_else(PoisonError::into_inner);
    let Some(current) = current().filter(|c| !settled(c)) else { return };
    PREVIOUS_FLAGS.store(current.sa_flags, Ordering::Relaxed);
    PREVIOUS.store(current.sa_sigaction, Ordering::Relaxed);
    // SAFETY: a zeroed `sigaction` is a valid value of the C struct, filled in below; `sigaction`
    // only reads the struct given.
    #[allow(unsafe_code, reason = "libc::sigaction is an FFI call")]
    unsafe {
        let mut ourself: libc::sigaction = std::mem::zeroed();
        ourself.sa_sigaction = ours;
        ourself.sa_flags = libc::SA_SIGINFO | (current.sa_flags & (libc::SA_RESTART | libc::SA_ONSTACK));
        ourself.sa_mask = current.sa_mask;
        libc::sigaction(libc::SIGINT, &ourself, std::ptr::null_mut());
    }
}

/// SIGINT's handler now, as `sigaction` reports it.
fn current() -> Option<libc::sigaction> {
    // SAFETY: a zeroed `sigaction` is a valid value of the C struct; `sigaction` writes the
    // current one into it and reads nothing.
    #[allow(unsafe_code, reason = "libc::sigaction is an FFI call")]
    unsafe {
        let mut current: libc::sigaction = std::mem::zeroed();
        (libc::sigaction(libc::SIGINT, std::ptr::null(), &mut current) == 0).then_some(current)
    }
}

/// `errno`, read and restored around the handler's own calls.
mod errno {
    #[cfg(target_os = "linux")]
    fn location() -> *mut libc::c_int {
        // SAFETY: the calling thread's `errno`, always valid.
        #[allow(unsafe_code, reason = "libc::__errno_location is an FFI call")]
        unsafe {
            libc::__errno_location()
        }
    }

    #[cfg(not(target_os = "linux"))]
    fn location() -> *mut libc::c_int {
        // SAFETY: the calling thread's `errno`, always valid.
        #[allow(unsafe_code, reason = "libc::__error is an FFI call")]
        unsafe {
            libc::__error()
        }
    }

    pub(super) fn get() -> libc::c_int {
        // SAFETY: a valid pointer to this thread's `errno`.
        #[allow(unsafe_code, reason = "reading errno")]
        unsafe {
            *location()
        }
    }

    pub(super) fn set(value: libc::c_int) {
        // SAFETY: as above.
        #[allow(unsafe_code, reason = "writing errno")]
        unsafe {
            *location() = value;
        }
    }
}
