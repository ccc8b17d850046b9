//! Ctrl-C for one-shot runs: while an [`InterruptGuard`] lives, SIGINT and SIGTERM only set a
//! flag that the probe loop checks between cells, so the cell in flight completes, what was
//! measured is kept and the run can be resumed. A second signal gets the default action
//! (the handler is installed with `SA_RESETHAND`), so a stuck run can still be killed.

// sigaction: installing a signal handler is unsafe (it must be async-signal-safe).
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering};

use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    STOP.store(true, Ordering::SeqCst);
}

/// Installed SIGINT/SIGTERM handlers; the previous ones come back on drop.
pub struct InterruptGuard {
    previous: Vec<(Signal, SigAction)>,
}

impl InterruptGuard {
    /// Install the handlers and clear the flag.
    pub fn install() -> Result<InterruptGuard, nix::Error> {
        STOP.store(false, Ordering::SeqCst);
        let action = SigAction::new(
            SigHandler::Handler(on_signal),
            SaFlags::SA_RESETHAND | SaFlags::SA_RESTART,
            SigSet::empty(),
        );
        let mut previous = Vec::new();
        for signal in [Signal::SIGINT, Signal::SIGTERM] {
            // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
            let old = unsafe { sigaction(signal, &action) }?;
            previous.push((signal, old));
        }
        Ok(InterruptGuard { previous })
    }

    /// The flag the handlers set.
    pub fn flag(&self) -> &'static AtomicBool {
        &STOP
    }

    /// Whether a signal arrived.
    pub fn interrupted(&self) -> bool {
        STOP.load(Ordering::SeqCst)
    }
}

impl Drop for InterruptGuard {
    fn drop(&mut self) {
        for (signal, old) in self.previous.drain(..) {
            // SAFETY: restoring the action that was in place before `install`.
            let _ = unsafe { sigaction(signal, &old) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sigint_sets_the_flag_instead_of_killing() {
        let guard = InterruptGuard::install().unwrap();
        assert!(!guard.interrupted());
        nix::sys::signal::raise(Signal::SIGINT).unwrap();
        assert!(guard.interrupted());
        assert!(guard.flag().load(Ordering::SeqCst));
    }
}
