//! One Ctrl-C rule for every command (README, "Exit status"): the first SIGINT (or SIGTERM,
//! SIGHUP) asks the running command to stop — commands that can end early and report what
//! they measured register a hook — and the process then exits 130; a command without a hook,
//! or a second Ctrl-C, exits 130 at once.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

/// How many times the signal arrived.
static PRESSES: AtomicU32 = AtomicU32::new(0);

/// What the running command does on an interruption; called with the press number (1, 2, …).
type Hook = Box<dyn Fn(u32) + Send>;

static HOOKS: Mutex<Vec<Hook>> = Mutex::new(Vec::new());

/// The exit status of an interrupted run (128 + SIGINT, as a shell reports it).
pub const EXIT_INTERRUPTED: u8 = 130;

/// Installs the process's one handler. Called once, from `main` (from `agent` after it
/// gives up its capabilities).
pub fn install() {
    let _ = ctrlc::set_handler(|| {
        let n = PRESSES.fetch_add(1, Ordering::SeqCst) + 1;
        let hooks = HOOKS.lock().unwrap_or_else(|e| e.into_inner());
        for h in hooks.iter() {
            h(n);
        }
        if hooks.is_empty() || n >= 2 {
            std::process::exit(i32::from(EXIT_INTERRUPTED));
        }
    });
}

/// The running command stops by itself on an interruption: `hook` asks it to (it runs on
/// the handler's thread, not in signal context). The process still exits 130 afterwards.
pub fn on_interrupt(hook: impl Fn(u32) + Send + 'static) {
    HOOKS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(Box::new(hook));
}

/// Whether an interruption arrived.
pub fn interrupted() -> bool {
    PRESSES.load(Ordering::SeqCst) > 0
}
