//! The allocator the `rill` crate installs (feature `mimalloc`) serves C's `malloc` too: RocksDB's
//! and librdkafka's memory (glibc kept what they freed in per-thread arenas).

#![cfg(all(feature = "mimalloc", target_os = "linux"))]

// Linking the crate is what installs the allocator.
use rill as _;

extern "C" {
    fn malloc(size: usize) -> *mut std::ffi::c_void;
    fn free(ptr: *mut std::ffi::c_void);
}

#[test]
fn c_malloc_is_mimalloc() {
    // SAFETY: a plain allocation, checked and freed.
    unsafe {
        let p = malloc(1000);
        assert!(!p.is_null());
        assert!(
            libmimalloc_sys::mi_is_in_heap_region(p),
            "C's malloc did not come from mimalloc"
        );
        free(p);
    }
}

/// The crate shortens mimalloc's purge delay (unless the environment sets one): freed memory
/// goes back to the system within tens of milliseconds, not seconds.
#[test]
fn freed_memory_is_purged_soon() {
    // SAFETY: reads an option.
    let delay = unsafe { libmimalloc_sys::mi_option_get(rill::MI_OPTION_PURGE_DELAY as _) };
    match std::env::var("MIMALLOC_PURGE_DELAY") {
        Ok(set) => assert_eq!(delay.to_string(), set.trim(), "the environment wins"),
        Err(_) => assert_eq!(delay as i64, rill::PURGE_DELAY_MS),
    }
}

/// `rill::MI_OPTION_PURGE_DELAY` is the option `MIMALLOC_PURGE_DELAY` sets: this test binary,
/// run again with the variable, must read it back through that number (a renumbering in a
/// mimalloc upgrade would read another option).
#[test]
fn the_option_number_is_the_purge_delay() {
    let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", "freed_memory_is_purged_soon", "--test-threads=1"])
        .env("MIMALLOC_PURGE_DELAY", "37")
        .output()
        .expect("run the test binary");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "with MIMALLOC_PURGE_DELAY=37 option {} did not read 37:\n{stdout}{}",
        rill::MI_OPTION_PURGE_DELAY,
        String::from_utf8_lossy(&out.stderr)
    );
}
