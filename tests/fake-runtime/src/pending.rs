//! Work enqueued on ACL streams and not yet synchronized.
//!
//! The fake runs every `aclrtMemcpyAsync` at once, but on a real NPU the copy runs later: until
//! the stream is synchronized (`aclrtSynchronizeStream`, or `aclrtSynchronizeEvent` on an event
//! recorded after the copy) the stream is busy and the copy's buffers are in use. CANN's
//! `aclrtDestroyStream` wants the stream synchronized first, and `aclrtFree` / `aclrtFreeHost`
//! free at once, without any implicit synchronization, so freeing memory a queued copy still
//! uses is a use after free on the device. The fake keeps the book a real device would keep
//! implicitly: every successful `aclrtMemcpyAsync` is *pending* on its stream, with the
//! allocations it touches, until a synchronization covers it. `acl.rs` refuses to destroy a
//! stream with pending work or to free an allocation pending work uses, and counts each
//! refusal (`chd_fake_unsynchronized_releases`).

use std::collections::HashMap;
use std::sync::Mutex;

use crate::timing::StreamRef;

/// One enqueued copy: its sequence number and the allocation bases it uses.
#[derive(Debug)]
struct Work {
    seq: u64,
    buffers: Vec<usize>,
}

#[derive(Default)]
struct Book {
    next_seq: u64,
    streams: HashMap<StreamRef, Vec<Work>>,
    /// Event handle -> (stream it was recorded on, last sequence number enqueued before).
    events: HashMap<usize, (StreamRef, u64)>,
    refused: u64,
}

static BOOK: Mutex<Option<Book>> = Mutex::new(None);

fn with<R>(f: impl FnOnce(&mut Book) -> R) -> R {
    let mut guard = BOOK.lock().unwrap_or_else(|e| e.into_inner());
    f(guard.get_or_insert_with(Book::default))
}

/// Records a copy enqueued on `stream` that uses the allocations at `buffers`.
pub fn enqueue(stream: StreamRef, buffers: Vec<usize>) {
    with(|b| {
        b.next_seq += 1;
        let seq = b.next_seq;
        b.streams
            .entry(stream)
            .or_default()
            .push(Work { seq, buffers });
    });
}

/// `aclrtSynchronizeStream`: everything on `stream` has completed.
pub fn synchronize_stream(stream: StreamRef) {
    with(|b| {
        b.streams.remove(&stream);
    });
}

/// `aclrtRecordEvent`: `event` completes once the work enqueued on `stream` so far has.
pub fn record(event: usize, stream: StreamRef) {
    with(|b| {
        let seq = b.next_seq;
        b.events.insert(event, (stream, seq));
    });
}

/// `aclrtSynchronizeEvent`: the work enqueued before the event's last record has completed.
pub fn synchronize_event(event: usize) {
    with(|b| {
        if let Some(&(stream, seq)) = b.events.get(&event) {
            if let Some(work) = b.streams.get_mut(&stream) {
                work.retain(|w| w.seq > seq);
            }
        }
    });
}

/// `aclrtDestroyEvent`.
pub fn forget_event(event: usize) {
    with(|b| {
        b.events.remove(&event);
    });
}

/// Copies enqueued on `stream` and not yet synchronized.
pub fn pending_on(stream: StreamRef) -> usize {
    with(|b| b.streams.get(&stream).map_or(0, Vec::len))
}

/// Whether pending work on any stream uses the allocation at `base`.
pub fn in_use(base: usize) -> bool {
    with(|b| {
        b.streams
            .values()
            .flatten()
            .any(|w| w.buffers.contains(&base))
    })
}

/// Counts one refused release (a destroy or free with pending work).
pub fn refuse() {
    with(|b| b.refused += 1);
}

/// Releases refused so far.
pub fn refused() -> u64 {
    with(|b| b.refused)
}
