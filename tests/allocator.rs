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
