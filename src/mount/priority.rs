//! The idle classes of the CPU and disk schedulers, for a thread whose
//! work must take only what nothing else wants.
//!
//! While the cores are busy such a thread may not run for a long time, so
//! a lock it holds meanwhile is one serving threads would wait on for as
//! long (nothing lends it their priority), and it cannot leave those
//! classes again without `CAP_SYS_NICE`. The clone warmer takes such
//! locks (its queue's, the backing files', the data layer's for a clone's
//! checks), but works only while nothing is being read, when the cores are
//! free to run it; work done while reads go on (the write-behind) stays in
//! the normal class.

/// Puts the calling thread in the idle classes of the CPU and the disk
/// schedulers, for good. Best effort: a kernel or scheduler without them
/// leaves it as it was.
pub fn idle() {
    /// `IOPRIO_PRIO_VALUE(IOPRIO_CLASS_IDLE, 0)`.
    const IOPRIO_IDLE: libc::c_long = 3 << 13;
    const IOPRIO_WHO_PROCESS: libc::c_long = 1;
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: plain syscalls on the calling thread (0 names it); `param`
    // is a valid sched_param that outlives the call.
    unsafe {
        libc::sched_setscheduler(0, libc::SCHED_IDLE, &param);
        libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0, IOPRIO_IDLE);
    }
}
