//! Every thread's stack on request, for a process that hangs where no debugger is installed (the
//! device machine has no gdb; 2026-12-06 the table form's uniform-routing hang blocked the host
//! inside ggml-cuda's graph compute, spinning, and /proc could not say in which call).
//!
//! With `POCKETMOE_STACK_DUMP=1` in the environment the binaries install two handlers: SIGUSR1
//! (sent to the process, e.g. `kill -USR1 PID`, as `scripts/device-hang-probe.sh` does) passes a
//! SIGUSR2 to every thread of the process, and each thread's SIGUSR2 handler writes its own
//! backtrace to stderr, headed by its id and name. Frames of ggml, cudart and our code are named;
//! frames inside the driver (a stripped shared library) show as addresses. Should the unwinder
//! stop inside the driver (no unwind tables there), the dump also says which library the thread
//! was in (its program counter) and scans the thread's stack for return addresses into
//! executable mappings, naming those it can: the callers of the blocking call are among them
//! (a scan also finds stale addresses, so it is a list of suspects, read beside the backtrace).
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
        install(libc::SIGUSR1, fan_out as *const () as usize, 0)
            && install(
                libc::SIGUSR2,
                dump_own as *const () as usize,
                libc::SA_SIGINFO,
            )
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

/// `handler`: an `extern "C" fn(c_int)`, or with `SA_SIGINFO` in `flags` an
/// `extern "C" fn(c_int, *mut siginfo_t, *mut c_void)`.
unsafe fn install(sig: libc::c_int, handler: usize, flags: libc::c_int) -> bool {
    let mut act: libc::sigaction = std::mem::zeroed();
    act.sa_sigaction = handler;
    act.sa_flags = libc::SA_RESTART | flags;
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

/// SIGUSR2: this thread's backtrace to stderr, then where it was and its stack's scan.
extern "C" fn dump_own(_: libc::c_int, _: *mut libc::siginfo_t, uctx: *mut libc::c_void) {
    let bt = std::backtrace::Backtrace::force_capture();
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    let name = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")).unwrap_or_default();
    let mut text = format!("== thread {tid} ({}):\n{bt}\n", name.trim());
    // SAFETY: the kernel passes this handler (SA_SIGINFO) the interrupted context.
    if let Some((pc, sp)) = unsafe { interrupted_at(uctx) } {
        text += &scan(pc, sp, &maps());
    }
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

/// The interrupted thread's program counter and stack pointer (x86-64 Linux).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
unsafe fn interrupted_at(uctx: *mut libc::c_void) -> Option<(usize, usize)> {
    let uc = uctx.cast::<libc::ucontext_t>().as_ref()?;
    let g = &uc.uc_mcontext.gregs;
    Some((
        g[libc::REG_RIP as usize] as usize,
        g[libc::REG_RSP as usize] as usize,
    ))
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
unsafe fn interrupted_at(_: *mut libc::c_void) -> Option<(usize, usize)> {
    None
}

/// One line of /proc/self/maps: [start, end), whether executable, file offset, path.
struct Map {
    start: usize,
    end: usize,
    exec: bool,
    offset: usize,
    path: String,
}

fn maps() -> Vec<Map> {
    let text = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (range, perms, offset) = (f.next()?, f.next()?, f.next()?);
            let (a, b) = range.split_once('-')?;
            let path = f.nth(2).unwrap_or("").to_string();
            Some(Map {
                start: usize::from_str_radix(a, 16).ok()?,
                end: usize::from_str_radix(b, 16).ok()?,
                exec: perms.contains('x'),
                offset: usize::from_str_radix(offset, 16).ok()?,
                path,
            })
        })
        .collect()
}

/// `addr` as "library+offset symbol" (the symbol where the binary's tables name it).
fn describe(addr: usize, maps: &[Map]) -> Option<String> {
    let m = maps
        .iter()
        .find(|m| m.exec && (m.start..m.end).contains(&addr))?;
    let file = m.path.rsplit('/').next().unwrap_or("?");
    let mut name = String::new();
    // The return address's call instruction: one byte before it.
    backtrace::resolve(addr.saturating_sub(1) as *mut std::ffi::c_void, |s| {
        if name.is_empty() {
            if let Some(n) = s.name() {
                name = format!("{n:#}");
            }
        }
    });
    Some(format!("{file}+{:#x} {name}", addr - m.start + m.offset))
}

/// Where the thread was, and the words of its stack (from `sp`, at most 256 KiB, within the
/// stack's mapping) that point into executable code, at most 48 of them, named.
fn scan(pc: usize, sp: usize, maps: &[Map]) -> String {
    let mut out = format!(
        "   at pc {pc:#x}: {}\n   stack scan (return addresses into code, innermost first):\n",
        describe(pc, maps).unwrap_or_else(|| "?".into())
    );
    let Some(stack) = maps.iter().find(|m| (m.start..m.end).contains(&sp)) else {
        return out;
    };
    let end = stack.end.min(sp.saturating_add(256 << 10));
    let mut found = 0;
    let mut at = sp & !7;
    while at + 8 <= end && found < 48 {
        // SAFETY: an aligned word inside the readable mapping that holds the stack pointer.
        let word = unsafe { (at as *const usize).read_volatile() };
        if let Some(d) = describe(word, maps) {
            out += &format!("     sp+{:#x}: {d}\n", at - sp);
            found += 1;
        }
        at += 8;
    }
    out
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
        assert!(unsafe {
            install(
                libc::SIGUSR2,
                dump_own as *const () as usize,
                libc::SA_SIGINFO,
            )
        });
        // SAFETY: raise to this thread, handler installed above.
        assert_eq!(unsafe { libc::raise(libc::SIGUSR2) }, 0);
        assert!(!WRITING.load(Ordering::Acquire));
    }

    /// The scan from a stack pointer in this test names return addresses into this binary: the
    /// test harness's frames that called this test are among them.
    #[test]
    fn the_stack_scan_names_the_callers() {
        let here = 0u64;
        let sp = std::hint::black_box(&here) as *const u64 as usize;
        let text = scan(0, sp, &maps());
        assert!(
            text.contains("run_test"),
            "no caller named in the scan:\n{text}"
        );
    }
}
