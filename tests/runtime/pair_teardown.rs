//! Hung cells, in-process against the fake runtime (`CHD_FAKE_PAIR_HANG_MS` = 2.5 s, every
//! NCCL abort taking `CHD_FAKE_ABORT_HANG_MS` = 3 s): a cell returns its timeout error
//! within the timeout plus a bounded grace however long the cleanup takes; NCCL
//! communicators are aborted on the side (counted `releasing` until the abort returns, then
//! gone); HCCL, which has no abort and answers `HCCL_E_AGAIN` while the allgather is in
//! flight, keeps them `quarantined` until a later release finds the allgather returned. A
//! probe told to stop (chd shutting down) gives up a hung cell at once, as on its timeout.

use crate::fixture;

use std::time::{Duration, Instant};

use crate::fixture::{cpus, eventually, held, hook, params, probe};
use chd::runtime::pair::CommState;

const ENV: &[(&str, &str)] = &[
    ("CHD_FAKE_DEVICE_COUNT", "2"),
    ("CHD_FAKE_PAIR_HANG_MS", "2500"),
    ("CHD_FAKE_ABORT_HANG_MS", "3000"),
    ("HCCL_BUFFSIZE", "32"),
];

const TIMEOUT: Duration = Duration::from_millis(300);
/// The timeout, the grace for the cleanup (at most the timeout) and scheduling slack.
const BOUND: Duration = Duration::from_millis(300 + 300 + 500);

#[test]
fn a_hung_nccl_cell_returns_in_time_and_its_slow_abort_finishes_on_the_side() {
    alone!(a_hung_nccl_cell_returns_in_time_and_its_slow_abort_finishes_on_the_side);
    let _g = fixture::setup(ENV);
    let live = hook("chd_fake_live_communicators");
    let p = probe("cuda", "nccl");
    let t = Instant::now();
    let err = p.measure(["0", "1"], cpus(), &params(TIMEOUT)).unwrap_err();
    let took = t.elapsed();
    assert_eq!(err.reason(), "timeout", "{err}");
    assert!(took < BOUND, "the cell took {took:?}");
    // The abort call has not returned (3 s): chd counts them until it does.
    let h = p.holdings();
    assert_eq!(held(&h, CommState::Releasing), 2, "{h:?}");
    eventually(Duration::from_secs(10), "the abort returned", || {
        hook("chd_fake_live_communicators") == live
            && held(&p.holdings(), CommState::Releasing) == 0
    });
    assert_eq!(held(&p.holdings(), CommState::Leaked), 0);
    // The pair works again once the hang setting is the only thing in the way: a new
    // communicator set is created for the next cell.
    let t = Instant::now();
    let err = p.measure(["0", "1"], cpus(), &params(TIMEOUT)).unwrap_err();
    assert_eq!(err.reason(), "timeout", "{err}");
    assert!(t.elapsed() < BOUND, "{:?}", t.elapsed());
    drop(p);
    eventually(Duration::from_secs(10), "the second abort returned", || {
        hook("chd_fake_live_communicators") == live
    });
}

#[test]
fn a_hung_hccl_cell_quarantines_its_communicators_until_the_allgather_returns() {
    alone!(a_hung_hccl_cell_quarantines_its_communicators_until_the_allgather_returns);
    let _g = fixture::setup(ENV);
    let live = hook("chd_fake_live_communicators");
    let p = probe("acl", "hccl");
    let t = Instant::now();
    let err = p.measure(["0", "1"], cpus(), &params(TIMEOUT)).unwrap_err();
    assert_eq!(err.reason(), "timeout", "{err}");
    assert!(t.elapsed() < BOUND, "the cell took {:?}", t.elapsed());
    // HcclCommDestroy said HCCL_E_AGAIN: kept, counted, and still holding their memory.
    let h = p.holdings();
    assert_eq!(held(&h, CommState::Quarantined), 2, "{h:?}");
    let per = 2 * (32u64 << 20);
    assert_eq!(
        h.device_memory,
        Some(vec![("0".into(), per), ("1".into(), per)])
    );
    assert_eq!(hook("chd_fake_live_communicators"), live + 2);
    // A release while the allgather still hangs keeps them quarantined.
    p.release_idle();
    assert_eq!(held(&p.holdings(), CommState::Quarantined), 2);
    // Once it returned, the next release destroys them.
    std::thread::sleep(Duration::from_millis(2600).saturating_sub(t.elapsed()));
    eventually(
        Duration::from_secs(10),
        "quarantined HCCL communicators released",
        || {
            p.release_idle();
            hook("chd_fake_live_communicators") == live
        },
    );
    let h = p.holdings();
    for state in CommState::ALL {
        assert_eq!(held(&h, state), 0, "{state:?}");
    }
    assert_eq!(
        h.device_memory,
        Some(vec![("0".into(), 0), ("1".into(), 0)])
    );
}

#[test]
fn a_stopped_probe_gives_up_a_hung_cell_at_once_and_starts_no_other() {
    alone!(a_stopped_probe_gives_up_a_hung_cell_at_once_and_starts_no_other);
    let _g = fixture::setup(ENV);
    let live = hook("chd_fake_live_communicators");
    let p = probe("cuda", "nccl");
    // A timeout far past the hang: only stop() can end the cell early.
    let long = params(Duration::from_secs(30));
    let stopper = {
        let p = p.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            p.stop();
        })
    };
    let t = Instant::now();
    let err = p.measure(["0", "1"], cpus(), &long).unwrap_err();
    let took = t.elapsed();
    stopper.join().unwrap();
    assert!(err.to_string().contains("chd is stopping"), "{err}");
    // The stop, then the abort's grace (its 3 s hang is waited for 1 s at most), and slack.
    assert!(took < Duration::from_millis(300 + 1000 + 500), "{took:?}");
    // Stopped for good: the next cell fails at once.
    let t = Instant::now();
    assert!(p.measure(["0", "1"], cpus(), &long).is_err());
    assert!(t.elapsed() < Duration::from_millis(100));
    drop(p);
    eventually(Duration::from_secs(10), "the abort returned", || {
        hook("chd_fake_live_communicators") == live
    });
}
