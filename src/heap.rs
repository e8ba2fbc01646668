//! The allocator's side of long-running work: glibc keeps the pages a
//! large piece of work freed, so a process that idles or goes on to other
//! work hands them back here.

/// Hands the heap pages freed after a large piece of work (a device list
/// built, encoded and dropped; a generation of slices sent; a tree's
/// resolutions dropped) back to the OS, so a process holds near what its
/// state needs: glibc keeps them otherwise.
pub fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointers; it only walks the allocator's
    // own free lists and may be called from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}
