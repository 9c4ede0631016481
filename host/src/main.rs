//! The `tessel` command. Exit codes: 0 success, 1 user error, 2 bad command line, 141 a closed
//! standard output, 128 + N ended by signal N (SIGINT 130, SIGTERM 143, SIGHUP 129).

// mimalloc for small blocks, huge-page mappings kept for reuse for large arrays: see `tessel::alloc`.
#[global_allocator]
static ALLOCATOR: tessel::alloc::Allocator = tessel::alloc::Allocator;

fn main() -> std::process::ExitCode {
    // SAFETY: the first statement of `main`: no other thread exists yet.
    #[allow(unsafe_code, reason = "setting the environment before any thread exists")]
    unsafe {
        tessel::quiet_headless_mesa();
    }
    // A panic is a bug in tessel, never the user's fault: say so in one line, without a backtrace.
    std::panic::set_hook(Box::new(|info| {
        eprintln!("error: internal error in tessel ({info}); please report it with the command that caused it");
    }));
    // SIGINT, SIGTERM and SIGHUP remove the temporary files of outputs being written, then exit
    // with 128 + the signal. Without the handler (it cannot fail but for want of a thread) the
    // signals keep their default action, which leaves temporaries behind; tessel still runs.
    let _ = tessel::staged::remove_on_signals();
    // TESSEL_LOG=debug shows, among others, abi_stable's full layout report for a plugin refused.
    // Without it, wgpu-hal's errors stay quiet: probing an API the machine lacks (GL without an EGL
    // driver while Vulkan works) is not the user's error, and real failures reach the user through
    // the backend's own messages.
    env_logger::Builder::from_env(env_logger::Env::new().filter_or("TESSEL_LOG", "error,wgpu_hal=off"))
        .format_timestamp(None)
        .init();
    let code = tessel::cli::main(std::env::args_os(), &mut std::io::stdout(), &mut std::io::stderr());
    std::process::ExitCode::from(code)
}
