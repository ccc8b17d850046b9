//! What the core-pair probe holds, in-process against the fake runtime: communicators and
//! peer access live for a window and go at `release_idle`; NCCL's are destroyed grouped (the
//! fake refuses a one-by-one teardown from one thread after its 1.5 s rendezvous timeout, as
//! real NCCL would hang); HCCL's are counted at 2 x `HCCL_BUFFSIZE`; peer copies enable peer
//! access first and measure the link, or report `copy-staged` where the devices cannot map
//! each other (CUDA), or fail the cell with the reason (ACL, which cannot stage).

use crate::fixture;

use std::time::{Duration, Instant};

use crate::fixture::{cpus, held, hook, params, probe};
use chd::runtime::pair::CommState;

const ENV: &[(&str, &str)] = &[
    ("CHD_FAKE_DEVICE_COUNT", "3"),
    ("CHD_FAKE_PAIR_GBPS", "13.7"),
    ("CHD_FAKE_STAGED_GBPS", "2.5"),
    ("CHD_FAKE_NO_PEER", "0,2"),
    ("CHD_FAKE_PAIR_TIMEOUT_MS", "1500"),
    ("HCCL_BUFFSIZE", "64"),
];

const T: Duration = Duration::from_secs(20);

fn close_to(got: f64, want: f64) -> bool {
    (got - want).abs() < 0.005 * want
}

#[test]
fn nccl_communicators_live_for_the_window_and_go_grouped_at_its_end() {
    alone!(nccl_communicators_live_for_the_window_and_go_grouped_at_its_end);
    let _g = fixture::setup(ENV);
    let live = hook("chd_fake_live_communicators");
    let p = probe("cuda", "nccl");
    assert_eq!(p.pair_method(["0", "1"]).unwrap(), "nccl");
    for _ in 0..2 {
        let bw = p.measure(["0", "1"], cpus(), &params(T)).unwrap();
        assert!(close_to(bw, 13.7e9), "{bw}");
    }
    // Created once for the pair and cached for its cells.
    assert_eq!(hook("chd_fake_live_communicators"), live + 2);
    let h = p.holdings();
    assert_eq!(h.library, Some("nccl"));
    assert_eq!(held(&h, CommState::InUse), 2);
    assert_eq!(h.device_memory, None, "NCCL does not document its buffers");
    let t = Instant::now();
    p.release_idle();
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    assert_eq!(hook("chd_fake_live_communicators"), live);
    let h = p.holdings();
    for state in CommState::ALL {
        assert_eq!(held(&h, state), 0, "{state:?}");
    }
    // The next window creates them again.
    p.measure(["0", "1"], cpus(), &params(T)).unwrap();
    assert_eq!(hook("chd_fake_live_communicators"), live + 2);
    drop(p);
    assert_eq!(
        hook("chd_fake_live_communicators"),
        live,
        "dropping releases"
    );
}

#[test]
fn hccl_communicators_count_two_buffers_of_hccl_buffsize_on_their_device() {
    alone!(hccl_communicators_count_two_buffers_of_hccl_buffsize_on_their_device);
    let _g = fixture::setup(ENV);
    let live = hook("chd_fake_live_communicators");
    let p = probe("acl", "hccl");
    let bw = p.measure(["0", "1"], cpus(), &params(T)).unwrap();
    assert!(close_to(bw, 13.7e9), "{bw}");
    let h = p.holdings();
    assert_eq!(h.library, Some("hccl"));
    assert_eq!(held(&h, CommState::InUse), 2);
    let per = 2 * (64u64 << 20);
    assert_eq!(
        h.device_memory,
        Some(vec![("0".into(), per), ("1".into(), per), ("2".into(), 0)])
    );
    p.release_idle();
    assert_eq!(hook("chd_fake_live_communicators"), live);
    let h = p.holdings();
    assert_eq!(held(&h, CommState::InUse), 0);
    assert_eq!(
        h.device_memory,
        Some(vec![("0".into(), 0), ("1".into(), 0), ("2".into(), 0)])
    );
}

#[test]
fn cuda_peer_copies_enable_peer_access_for_the_window_and_measure_the_link() {
    alone!(cuda_peer_copies_enable_peer_access_for_the_window_and_measure_the_link);
    let _g = fixture::setup(ENV);
    let enabled = hook("chd_fake_peer_access_enabled");
    let p = probe("cuda", "copy");
    assert_eq!(p.pair_method(["0", "1"]).unwrap(), "copy");
    // Asking changes nothing.
    assert_eq!(hook("chd_fake_peer_access_enabled"), enabled);
    let bw = p.measure(["0", "1"], cpus(), &params(T)).unwrap();
    assert!(
        close_to(bw, 13.7e9),
        "over the link, not staged (2.5): {bw}"
    );
    assert_eq!(
        hook("chd_fake_peer_access_enabled"),
        enabled + 2,
        "both ways"
    );
    let h = p.holdings();
    assert_eq!(h.library, None);
    assert!(h.communicators.is_empty());
    assert_eq!(h.methods, vec![("0,1".to_string(), "copy")]);
    p.release_idle();
    assert_eq!(
        hook("chd_fake_peer_access_enabled"),
        enabled,
        "disabled again"
    );
}

#[test]
fn cuda_pairs_without_peer_access_are_measured_host_staged_as_copy_staged() {
    alone!(cuda_pairs_without_peer_access_are_measured_host_staged_as_copy_staged);
    let _g = fixture::setup(ENV);
    let enabled = hook("chd_fake_peer_access_enabled");
    let p = probe("cuda", "copy");
    assert_eq!(p.pair_method(["0", "2"]).unwrap(), "copy-staged");
    let bw = p.measure(["0", "2"], cpus(), &params(T)).unwrap();
    assert!(close_to(bw, 2.5e9), "host-staged rate: {bw}");
    assert_eq!(hook("chd_fake_peer_access_enabled"), enabled);
    // Pairs keep their own method.
    p.measure(["0", "1"], cpus(), &params(T)).unwrap();
    assert_eq!(
        p.holdings().methods,
        vec![
            ("0,1".to_string(), "copy"),
            ("0,2".to_string(), "copy-staged")
        ]
    );
    p.release_idle();
    assert_eq!(hook("chd_fake_peer_access_enabled"), enabled);
}

#[test]
fn acl_peer_copies_need_peer_access_and_fail_loudly_without_it() {
    alone!(acl_peer_copies_need_peer_access_and_fail_loudly_without_it);
    let _g = fixture::setup(ENV);
    let enabled = hook("chd_fake_peer_access_enabled");
    let p = probe("acl", "copy");
    let bw = p.measure(["0", "1"], cpus(), &params(T)).unwrap();
    assert!(close_to(bw, 13.7e9), "{bw}");
    assert_eq!(hook("chd_fake_peer_access_enabled"), enabled + 2);
    // ACL cannot stage: the pair's cells fail, with why.
    let err = p.measure(["0", "2"], cpus(), &params(T)).unwrap_err();
    assert_eq!(err.reason(), "device", "{err}");
    let text = err.to_string();
    assert!(
        text.contains("peer access refused") && text.contains("device 0 cannot access device 2"),
        "{text}"
    );
    assert_eq!(p.pair_method(["0", "2"]).unwrap(), "copy");
    // CANN enables peer access per device and cannot say whether it already was: chd
    // leaves it enabled rather than cut off another process (runtime/acl.rs).
    p.release_idle();
    assert_eq!(hook("chd_fake_peer_access_enabled"), enabled + 2);
}
