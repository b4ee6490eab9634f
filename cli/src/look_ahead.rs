//! `memwarden run`, while the target runs: a thread at the lowest scheduling priority that
//! works on the stacks already recorded (`memwarden::report::warm`: symbolizes their words
//! and picks the frames each shows), so the report after the run finds most of that done.
//! It only takes CPU time the target leaves idle; if it cannot start, the report simply
//! does all the work itself.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use memwarden::report::warm::{symbolize_ahead, Ahead, LOOK_INTERVAL};
use memwarden::symbolize::Symbolizer;

/// The running look-ahead thread.
pub struct LookAhead {
    stop: Arc<AtomicBool>,
    symbol_cache: Option<PathBuf>,
    thread: JoinHandle<(Symbolizer, Ahead)>,
}

impl LookAhead {
    /// Starts looking at the profiles written into `out_dir`, with symbols kept across runs
    /// in `symbol_cache` (if any); `None` if no thread can be started.
    pub fn start(out_dir: &Path, symbol_cache: Option<PathBuf>) -> Option<LookAhead> {
        let stop = Arc::new(AtomicBool::new(false));
        let dir = out_dir.to_owned();
        let flag = Arc::clone(&stop);
        let cache = symbol_cache.clone();
        let thread = std::thread::Builder::new()
            .name("memwarden-look-ahead".into())
            .spawn(move || {
                crate::lower_own_priority();
                let symbolizer = Symbolizer::with_disk_cache(cache);
                symbolize_ahead(&dir, symbolizer, &flag, LOOK_INTERVAL)
            })
            .ok()?;
        Some(LookAhead {
            stop,
            symbol_cache,
            thread,
        })
    }

    /// Stops the thread (at its next stack) and returns its symbolizer and what it made
    /// of the stacks; a fresh symbolizer, with the same cache folder, and nothing made, if
    /// the thread failed.
    pub fn finish(self) -> (Symbolizer, Ahead) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.thread().unpark();
        self.thread.join().unwrap_or_else(|_| {
            (
                Symbolizer::with_disk_cache(self.symbol_cache),
                Ahead::default(),
            )
        })
    }
}
