//! The CPU priority of rill's processing threads (`worker.threads.nice`).
//!
//! On a machine whose cores the processing saturates, the HTTP endpoint's threads (queries,
//! probes, scrapes) wait for a core behind the workers. Raising the workers' niceness lets the
//! kernel run the endpoint first, at the cost of processing time the queries take. A thread may
//! always lower its own priority, so no privilege is needed. librdkafka's threads keep theirs.

/// Adds `nice` (0 to 19) to the calling thread's niceness; a failure is logged, not fatal (the
/// thread runs at its old priority).
pub(crate) fn lower_this_thread(nice: i32) {
    if nice <= 0 {
        return;
    }
    // SAFETY: gettid has no preconditions and returns the calling thread's id; setpriority
    // with PRIO_PROCESS and a thread id changes that thread only (Linux), and reads no memory
    // of ours.
    let result = unsafe {
        let tid = libc::gettid();
        let current = libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t);
        libc::setpriority(
            libc::PRIO_PROCESS,
            tid as libc::id_t,
            (current + nice).min(19),
        )
    };
    if result != 0 {
        tracing::warn!(nice, error = %std::io::Error::last_os_error(), "could not lower a processing thread's priority (worker.threads.nice)");
    }
}

/// The calling thread's niceness, from `/proc` (for tests).
#[cfg(test)]
pub(crate) fn this_thread_niceness() -> Option<i32> {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    // The fields after the command name (in parentheses, may hold spaces) start at field 3;
    // nice is field 19.
    let after = &stat[stat.rfind(')')? + 2..];
    after.split_whitespace().nth(16)?.parse().ok()
}
