//! Every thread's stack on request, for a process that hangs where no debugger is installed (the
//! device machine has no gdb; 2026-12-06 the table form's uniform-routing hang blocked the host
//! inside ggml-cuda's graph compute, spinning, and /proc could not say in which call).
//!
//! With `POCKETMOE_STACK_DUMP=1` in the environment the binaries install two handlers: SIGUSR1
//! (sent to the process, e.g. `kill -USR1 PID`, as `scripts/device-hang-probe.sh` does) passes a
//! SIGUSR2 to every thread of the process, and each thread's SIGUSR2 handler writes its own
//! backtrace to stderr, headed by its id and name. Frames of ggml, cudart and our code are named;
//! frames inside the driver (a stripped shared library) show as addresses.
//!
//! Diagnosis only, never on by default: the handlers allocate and symbolize, which is not
//! async-signal-safe (a thread interrupted inside the allocator could deadlock in its handler);
//! a hung process, whose threads spin in a driver call or sleep in a futex, is the case it is for.

use std::sync::atomic::{AtomicBool, Ordering};

/// The environment variable that installs the handlers.
pub const ENV: &str = "POCKETMOE_STACK_DUMP";

/// One thread writes at a time, so the dumps do not interleave.
static WRITING: AtomicBool = AtomicBool::new(false);

/// Installs the handlers when [`ENV`] is `1`; says so on stderr. Returns whether it did.
pub fn install_from_env() -> bool {
    if std::env::var(ENV).as_deref() != Ok("1") {
        return false;
    }
    // SAFETY: sigaction with handlers of the right signature; SA_RESTART keeps interrupted
    // syscalls (reads, futex waits) going once a handler returns.
    let ok = unsafe {
        install(libc::SIGUSR1, fan_out as extern "C" fn(libc::c_int))
            && install(libc::SIGUSR2, dump_own as extern "C" fn(libc::c_int))
    };
    eprintln!(
        "{ENV}=1: {} (kill -USR1 {} writes every thread's stack here)",
        if ok {
            "stack dumps on SIGUSR1"
        } else {
            "could not install the signal handlers"
        },
        std::process::id()
    );
    ok
}

unsafe fn install(sig: libc::c_int, handler: extern "C" fn(libc::c_int)) -> bool {
    let mut act: libc::sigaction = std::mem::zeroed();
    act.sa_sigaction = handler as usize;
    act.sa_flags = libc::SA_RESTART;
    libc::sigemptyset(&mut act.sa_mask);
    libc::sigaction(sig, &act, std::ptr::null_mut()) == 0
}

/// SIGUSR1: a SIGUSR2 to every thread of the process (this one included).
extern "C" fn fan_out(_: libc::c_int) {
    let pid = std::process::id() as libc::pid_t;
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return;
    };
    for tid in tasks
        .flatten()
        .filter_map(|t| t.file_name().to_str()?.parse().ok())
    {
        let tid: libc::pid_t = tid;
        // SAFETY: tgkill to a thread of this process, with a signal whose handler is installed.
        unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, libc::SIGUSR2) };
    }
}

/// SIGUSR2: this thread's backtrace to stderr.
extern "C" fn dump_own(_: libc::c_int) {
    let bt = std::backtrace::Backtrace::force_capture();
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    let name = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")).unwrap_or_default();
    let text = format!("== thread {tid} ({}):\n{bt}\n", name.trim());
    while WRITING.swap(true, Ordering::Acquire) {
        std::hint::spin_loop();
    }
    // Straight to fd 2: stderr's lock may be held by the thread this handler interrupted.
    let mut rest = text.as_bytes();
    while !rest.is_empty() {
        // SAFETY: a valid buffer of rest.len() bytes.
        let n = unsafe { libc::write(2, rest.as_ptr().cast(), rest.len()) };
        if n <= 0 {
            break;
        }
        rest = &rest[n as usize..];
    }
    WRITING.store(false, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A SIGUSR2 to this thread runs the dump and returns (the handler neither deadlocks nor
    /// kills the process); the write lock is free again afterwards. (The output itself goes to
    /// fd 2; what it names is checked by hand on the device.)
    #[test]
    fn a_thread_dumps_its_stack_and_goes_on() {
        // SAFETY: as in install_from_env.
        assert!(unsafe { install(libc::SIGUSR2, dump_own as extern "C" fn(libc::c_int)) });
        // SAFETY: raise to this thread, handler installed above.
        assert_eq!(unsafe { libc::raise(libc::SIGUSR2) }, 0);
        assert!(!WRITING.load(Ordering::Acquire));
    }
}
