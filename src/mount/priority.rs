//! The idle classes of the CPU and disk schedulers, for work that must
//! take only what nothing else wants.
//!
//! A thread in them must not hold a lock that serving threads take: while
//! the cores are busy it may not run for a long time, and they would wait
//! for it (nothing lends it their priority). So a thread that needs such
//! locks lowers its priority only around the work that takes none
//! ([`with_idle_cpu`]).

/// Puts the calling thread in the idle classes of the CPU and the disk
/// schedulers, for good. Best effort: a kernel or scheduler without them
/// leaves it as it was.
pub fn idle() {
    /// `IOPRIO_PRIO_VALUE(IOPRIO_CLASS_IDLE, 0)`.
    const IOPRIO_IDLE: libc::c_long = 3 << 13;
    const IOPRIO_WHO_PROCESS: libc::c_long = 1;
    set_cpu_class(libc::SCHED_IDLE);
    // SAFETY: a plain syscall on the calling thread (0 names it).
    unsafe {
        libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0, IOPRIO_IDLE);
    }
}

/// Runs `f` with the calling thread in the idle class of the CPU
/// scheduler, then back in the normal one (a thread that may take locks
/// serving threads wait on: see the module's comment). Best effort, as
/// [`idle`]; going back to the normal class needs the privilege to raise a
/// priority (root, which passthrough needs anyway).
pub fn with_idle_cpu<T>(f: impl FnOnce() -> T) -> T {
    set_cpu_class(libc::SCHED_IDLE);
    let r = f();
    set_cpu_class(libc::SCHED_OTHER);
    r
}

fn set_cpu_class(policy: libc::c_int) {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: a plain syscall on the calling thread (0 names it); `param`
    // is a valid sched_param that outlives the call.
    unsafe {
        libc::sched_setscheduler(0, policy, &param);
    }
}
