//! The `tessel` command. Exit codes: 0 success, 1 user error, 2 bad command line.

// Launches move large arrays through several buffers; mimalloc reuses their memory instead of
// returning it to the kernel and faulting it in again (a third of a large run's time with glibc).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    quiet_headless_mesa();
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

/// On a machine without a desktop session, Mesa's Vulkan and GL drivers (the software adapter
/// wgpu finds there) print `error: XDG_RUNTIME_DIR is invalid or not set in the environment.`
/// at every start, from libwayland, although nothing is wrong. Any absolute path quiets it;
/// nothing here opens a window.
fn quiet_headless_mesa() {
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        #[allow(unsafe_code, reason = "setting the environment before any thread exists")]
        // SAFETY: the first statement of `main`: no other thread exists yet that could read the
        // environment concurrently.
        unsafe {
            std::env::set_var("XDG_RUNTIME_DIR", std::env::temp_dir());
        }
    }
}
