//! The host's side of virtual time: how long the calling thread has spent enqueueing work.
//!
//! On a real GPU or NPU every enqueue call (a copy, an event record, a stream wait) costs the
//! calling CPU a few microseconds, and an idle stream runs what it gets at once: an event
//! recorded on an idle stream completes while the host is still enqueueing the copies behind
//! it, so events around copies shorter than one enqueue call measure the CPU's submission
//! rate, not the link (nvbandwidth's "Measurement Details"). `CHD_FAKE_ENQUEUE_US` models it:
//! each enqueue call advances the calling thread's host clock by that many microseconds, and
//! an operation starts on its stream no earlier than the host time its enqueue call ended
//! (see `timing`). A blocking wait (stream or event synchronize) moves the thread's host clock
//! up to the time the stream got there.
//!
//! With `CHD_FAKE_ENQUEUE_US` at 0 (the default) the host clock stays at 0 and nothing here
//! changes any timing: stream clocks behave as they always did.

use std::cell::Cell;

use crate::config;

thread_local! {
    static NOW_NS: Cell<f64> = const { Cell::new(0.0) };
}

fn enabled() -> bool {
    config::get().enqueue_us > 0.0
}

/// One enqueue call on this thread: the host clock moves on by `CHD_FAKE_ENQUEUE_US`; returns
/// the host time the call ended (0 when the cost is off).
pub fn enqueue() -> f64 {
    if !enabled() {
        return 0.0;
    }
    let cost = config::get().enqueue_us * 1e3;
    NOW_NS.with(|c| {
        c.set(c.get() + cost);
        c.get()
    })
}

/// This thread's host time now, nanoseconds (0 when the cost is off).
pub fn now() -> f64 {
    if !enabled() {
        return 0.0;
    }
    NOW_NS.with(Cell::get)
}

/// The thread waited until a stream reached `ns` (a synchronize returned).
pub fn waited_until(ns: f64) {
    if enabled() {
        NOW_NS.with(|c| c.set(c.get().max(ns)));
    }
}
