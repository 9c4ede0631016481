//! The `tessel` command. Exit codes: 0 success, 1 user error, 2 bad command line.

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
