//! The allocator's setup for a long-running daemon.
//!
//! glibc gives each thread that meets contention its own malloc arena, up
//! to eight per core. The daemon's state is built by several threads at
//! once (the file source's parse threads, the async workers, the syncer)
//! and then lives for the process's lifetime: spread over many arenas, the
//! holes the parsing leaves between long-lived objects cannot be reused by
//! the other arenas, and the resident set ends up far above the heap in
//! use (50,000 Services: 212 MiB resident with the default, 195 MiB with
//! two arenas, for the same heap and no slower start).
//!
//! Large short-lived buffers (a manifest file's text, an API list's body)
//! are better mapped on their own and unmapped when freed than carved out
//! of an arena: glibc does so above a threshold, but raises the threshold
//! to the size of each such buffer freed (up to 32 MiB), after which the
//! next ones leave holes in the arenas. A fixed threshold keeps them out.

/// Arenas glibc may create; an explicit `MALLOC_ARENA_MAX` wins.
const MALLOC_ARENAS: i32 = 2;
/// Allocations from this size on get their own mapping; an explicit
/// `MALLOC_MMAP_THRESHOLD_` wins.
const MMAP_THRESHOLD: i32 = 1 << 20;

/// Caps glibc's malloc arenas at [`MALLOC_ARENAS`] and fixes the mmap
/// threshold at [`MMAP_THRESHOLD`]. Call before any thread is started.
/// Does nothing with another C library.
pub fn tune_malloc() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    for (env, param, value) in [
        ("MALLOC_ARENA_MAX", libc::M_ARENA_MAX, MALLOC_ARENAS),
        (
            "MALLOC_MMAP_THRESHOLD_",
            libc::M_MMAP_THRESHOLD,
            MMAP_THRESHOLD,
        ),
    ] {
        if std::env::var_os(env).is_none() {
            // SAFETY: mallopt only sets a malloc tunable, both take these
            // values, and no other thread allocates yet. A refusal (it
            // returns 0) leaves glibc's default, which is only less frugal.
            unsafe {
                libc::mallopt(param, value);
            }
        }
    }
}
