//! Bounded waits on a runtime's events, and the release of stuck work once it finished: the
//! calls behind `stuck_work`'s deadline. A stream is waited on through an event recorded on it
//! ([`wait_stream`]); an event through `DeviceApi::event_wait` (CUDA: `cudaEventQuery`
//! polled by [`poll_event`]; ACL: `aclrtSynchronizeEventWithTimeout`).

use std::time::{Duration, Instant};

use super::device_api::{ApiError, DeviceApi, Handle};
use super::stuck_work::{interrupted, Deadline, LeakedHost, Stuck, StuckWork};
use super::ProbeError;

/// Wait until `event` completed, by `deadline`: a [`ProbeError::Timeout`] past it, `on_error`
/// for a failed call.
pub(crate) fn wait_event<A: DeviceApi + ?Sized>(
    api: &A,
    event: Handle,
    deadline: &Deadline,
    on_error: &dyn Fn(ApiError) -> ProbeError,
) -> Result<(), ProbeError> {
    if api.event_wait(event, deadline.left()).map_err(on_error)? {
        Ok(())
    } else {
        Err(deadline.timed_out())
    }
}

/// Wait for everything enqueued on `stream` so far, by `deadline`: `event` is recorded on it
/// and waited for ([`wait_event`]).
pub(crate) fn wait_stream<A: DeviceApi + ?Sized>(
    api: &A,
    stream: Handle,
    event: Handle,
    deadline: &Deadline,
    on_error: &dyn Fn(ApiError) -> ProbeError,
) -> Result<(), ProbeError> {
    api.event_record(event, stream).map_err(on_error)?;
    wait_event(api, event, deadline, on_error)
}

/// Poll `query` (whether the event completed) until it says done or `timeout` passes: the
/// `event_wait` of runtimes with an event query. Yields at first, then sleeps up to 1 ms
/// between queries.
pub(crate) fn poll_event(
    timeout: Duration,
    query: &dyn Fn() -> Result<bool, ApiError>,
) -> Result<bool, ApiError> {
    let started = Instant::now();
    let mut pause = Duration::from_micros(20);
    for round in 0u32.. {
        if query()? {
            return Ok(true);
        }
        if started.elapsed() >= timeout || interrupted() {
            return Ok(false);
        }
        if round < 64 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }
    Ok(false)
}

/// Release the stuck entries of `work` whose work has finished (their last event completed):
/// what they kept is freed, their devices answer again.
pub(crate) fn recheck<A: DeviceApi + ?Sized>(api: &A, work: &StuckWork) {
    let done = work.take_finished(|s| {
        s.events
            .first()
            .is_some_and(|&e| matches!(api.event_wait(e as Handle, Duration::ZERO), Ok(true)))
    });
    for stuck in done {
        tracing::info!(devices = ?stuck.devices, "a stuck copy cell finished: its memory is freed");
        release(api, stuck);
    }
}

/// Release everything `stuck` kept, its work being done.
fn release<A: DeviceApi + ?Sized>(api: &A, stuck: Stuck) {
    let h = |a: usize| a as Handle;
    let warn = |what: &str, r: Result<(), ApiError>| {
        if let Err(e) = r {
            tracing::warn!("releasing a stuck cell's {what}: {e}");
        }
    };
    warn("stream", api.stream_synchronize(h(stuck.stream)));
    warn("stream", api.stream_destroy(h(stuck.stream)));
    for e in &stuck.events {
        warn("event", api.event_destroy(h(*e)));
    }
    for (p, _) in &stuck.device_memory {
        warn("device memory", api.device_free(h(*p)));
    }
    for m in &stuck.host_memory {
        if let LeakedHost::Pinned(p, _) = m {
            warn("pinned memory", api.host_free_pinned(h(*p)));
        }
    }
    for (dev, peer) in &stuck.peer_access {
        warn(
            "peer access",
            api.set_device(*dev)
                .and_then(|()| api.disable_peer_access(*peer)),
        );
    }
}
