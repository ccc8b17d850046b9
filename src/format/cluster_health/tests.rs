//! The reader on rows in the shapes the tool writes them (key sets as in
//! `core_h2d_matrix.py` and `core_pair_d2d_matrix.py`), one concern per test.

use super::*;

fn parse_ok(text: &str) -> Recording {
    parse(text, "results.json").unwrap_or_else(|e| panic!("{e}"))
}

fn value(rec: &Recording, cpu: u32, device: &str, size_mb: u64) -> Vec<Result<f64, String>> {
    rec.samples
        .iter()
        .filter(|s| s.cpu == cpu && s.device == device && s.size_bytes == size_mb << 20)
        .map(|s| s.outcome.clone().map_err(|f| f.message))
        .collect()
}

/// The seed-era shape chd's first fixtures used: no direction, no pinned, a string pair.
const LEGACY: &str = r#"{
  "meta": {"hostname": "node-a3", "affinity_summary": {"numa_nodes": {
    "0": {"cpus": [0, 1]}, "1": {"cpus": [2, 3]}}}},
  "metrics": [
    {"test": "core_h2d_matrix", "host_cpu": 0, "device_id": 0, "size_mb": 64, "gbps": 12.7, "status": "ok"},
    {"test": "core_h2d_matrix", "host_cpu": 2, "device_id": 1, "size_mb": 64, "gbps": 58.4, "status": "ok"},
    {"test": "core_h2d_matrix", "host_cpu": 3, "device_id": 1, "size_mb": 64, "status": "error", "error": "cudaErrorUnknown"},
    {"test": "core_pair_d2d_matrix", "rank0_cpu": 1, "rank1_cpu": 3, "device_pair": [5, 0], "size_mb": 16, "alg_gbps": 13.7, "status": "ok"},
    {"test": "nccl_allgather", "gbps": 100},
    {"test": "core_h2d_matrix", "device_id": 1, "size_mb": 64, "gbps": 1, "status": "ok"}
  ]}"#;

#[test]
fn legacy_rows_parse_into_samples_with_their_numa_layout() {
    let rec = parse_ok(LEGACY);
    assert_eq!(rec.numa_nodes[&1], vec![2, 3]);
    assert_eq!(rec.samples.len(), 4);
    let slow = &rec.samples[0];
    assert_eq!(slow.size_bytes, 64 << 20);
    assert_eq!(slow.direction, "h2d");
    assert_eq!(slow.outcome, Ok(12.7e9));
    assert_eq!(
        value(&rec, 3, "1", 64),
        vec![Err("error: cudaErrorUnknown".to_string())],
        "an error row is a failed sample, not zero bandwidth"
    );
    let pair = rec
        .samples
        .iter()
        .find(|s| s.matrix == MatrixKind::Pair)
        .unwrap();
    assert_eq!(pair.device, "0,5");
    assert_eq!((pair.cpu, pair.peer_cpu), (1, Some(3)));
    assert_eq!(pair.outcome, Ok(13.7e9));
    let meta: BTreeMap<_, _> = rec.meta.iter().cloned().collect();
    assert_eq!(meta["hostname"], "node-a3");
    assert_eq!(
        rec.rejected,
        vec![Rejected {
            reason: "no host_cpu".into(),
            count: 1,
            first: "results.json metrics[5]".into()
        }]
    );
    assert_eq!(other_tests_text(&rec.other_tests), "nccl_allgather x1");
    assert_eq!(rec.devices, vec!["0", "1"]);
}

/// Rows exactly as `core_h2d_matrix.py` writes them (sorted keys), including its three
/// failure shapes.
const H2D: &str = r#"{
  "meta": {"affinity_summary": {"cpu_count": 4, "host": "a3-180",
      "numa_nodes": {"0": {"cpu_count": 2, "cpus": [0, 1]}, "1": {"cpu_count": 2, "cpus": [2, 3]}}},
    "argv": ["-m", "cluster_health_detect.core_h2d_matrix", "--sizes-mb", "16,64"],
    "cpu_ids": [0, 1, 2, 3], "created_at": "2026-07-08T03:00:00+00:00", "device_ids": [0, 1],
    "device_kind": "npu", "finished_at": "2026-07-08T03:20:00+00:00", "sizes_mb": [16, 64],
    "torch_stack": {"torch_version": "2.1.0", "torch_npu_version": "2.1.0.post6"}},
  "metrics": [
    {"bind_actual_cpus": [0], "bind_actual_cpus_list": "0", "device": "npu:0", "device_id": 0,
     "direction": "host_to_device", "dtype": "float16", "gbps": 58.4, "host_cpu": 0,
     "iterations": 20, "operation": "copy", "pinned": true, "repeat": 0, "seconds": 0.023,
     "size_mb": 64, "status": "ok", "test": "core_h2d_matrix", "ts": "2026-07-08T03:00:01+00:00"},
    {"bind_actual_cpus": [0], "bind_actual_cpus_list": "0", "device": "npu:0", "device_id": 0,
     "direction": "host_to_device", "dtype": "float16", "gbps": 58.0, "host_cpu": 0,
     "iterations": 20, "operation": "copy", "pinned": true, "repeat": 1, "seconds": 0.023,
     "size_mb": 64, "status": "ok", "test": "core_h2d_matrix", "ts": "2026-07-08T03:05:01+00:00"},
    {"bind_actual_cpus": [1], "bind_actual_cpus_list": "1", "device_id": 1, "device_kind": "npu",
     "error": "RuntimeError('ACL stream synchronize failed, error code is 507013')",
     "host_cpu": 1, "operation": "copy", "repeat": 0, "size_mb": 16, "status": "error",
     "test": "core_h2d_matrix", "ts": "2026-07-08T03:00:02+00:00"},
    {"actual_cpus": [0, 1, 2], "device_id": null, "host_cpu": 3, "operation": "bind_cpu",
     "reason": "requested [3], actual [0, 1, 2]", "repeat": 0, "status": "error",
     "test": "core_h2d_matrix", "ts": "2026-07-08T03:00:03+00:00"},
    {"device": "npu:1", "device_id": 1, "direction": "host_to_device", "gbps": 31.2, "host_cpu": 2,
     "operation": "copy", "pinned": false, "repeat": 0, "size_mb": 16, "status": "ok",
     "test": "core_h2d_matrix"}
  ]}"#;

#[test]
fn h2d_rows_speak_chds_vocabulary() {
    let rec = parse_ok(H2D);
    assert!(rec.samples.iter().all(|s| s.direction == "h2d"));
    assert_eq!(
        value(&rec, 0, "0", 64),
        vec![Ok(58.4e9), Ok(58.0e9)],
        "repeats are samples"
    );
    let pinned = rec.samples.iter().find(|s| s.cpu == 0).unwrap();
    assert_eq!(pinned.host_memory, "pinned");
    let pageable = rec.samples.iter().find(|s| s.cpu == 2).unwrap();
    assert_eq!(pageable.host_memory, "pageable");
    assert_eq!(rec.device_kind.as_deref(), Some("npu"));
    let meta: BTreeMap<_, _> = rec.meta.iter().cloned().collect();
    assert_eq!(meta["host"], "a3-180");
    assert_eq!(meta["cpus"], "4 (0-3)");
    assert_eq!(meta["sizes"], "16, 64 MiB");
    assert_eq!(meta["torch"], "torch 2.1.0, torch_npu 2.1.0.post6");
    assert!(rec.rejected.is_empty(), "{:?}", rec.rejected);
    assert!(rec.partial.is_none());
}

#[test]
fn a_failed_copy_fails_its_cell_and_a_failed_bind_fails_every_device_and_size() {
    let rec = parse_ok(H2D);
    let copy = value(&rec, 1, "1", 16);
    assert_eq!(copy.len(), 1);
    assert!(copy[0]
        .as_ref()
        .unwrap_err()
        .starts_with("error (copy): RuntimeError("));
    let failed: Vec<&RecordedSample> = rec.samples.iter().filter(|s| s.cpu == 3).collect();
    assert_eq!(failed.len(), 4, "2 devices x 2 sizes from meta");
    for s in failed {
        let f = s.outcome.as_ref().unwrap_err();
        assert_eq!(f.kind, FailureKind::Bind);
        assert_eq!(
            f.message,
            "error (bind_cpu): requested [3], actual [0, 1, 2]"
        );
    }
}

#[test]
fn an_older_run_without_sizes_in_meta_fails_the_sizes_its_rows_name() {
    // core_h2d_matrix.py before checkpoints: no meta.sizes_mb, error rows without size_mb.
    let rec = parse_ok(
        r#"{"meta": {"device_ids": [0]}, "metrics": [
          {"device_id": 0, "gbps": 20.0, "host_cpu": 0, "size_mb": 16, "status": "ok", "test": "core_h2d_matrix"},
          {"device_id": 0, "gbps": 21.0, "host_cpu": 0, "size_mb": 256, "status": "ok", "test": "core_h2d_matrix"},
          {"device_id": 0, "error": "RuntimeError('x')", "host_cpu": 1, "operation": "copy", "status": "error", "test": "core_h2d_matrix"}]}"#,
    );
    let sizes: Vec<u64> = rec
        .samples
        .iter()
        .filter(|s| s.cpu == 1)
        .map(|s| s.size_bytes >> 20)
        .collect();
    assert_eq!(sizes, vec![16, 256]);
}

#[test]
fn unusable_rows_are_counted_by_reason_with_the_first_place() {
    let rec = parse_ok(
        r#"{"metrics": [
          {"device_id": 0, "gbps": 20.0, "host_cpu": 0, "size_mb": 16, "status": "ok", "test": "core_h2d_matrix"},
          {"device_id": 0, "direction": "device_to_device_same_rank", "gbps": 400.0, "host_cpu": 0, "size_mb": 16, "status": "ok", "test": "core_h2d_matrix"},
          {"device_id": 0, "direction": "device_to_device_same_rank", "gbps": 401.0, "host_cpu": 1, "size_mb": 16, "status": "ok", "test": "core_h2d_matrix"},
          {"device_id": 0, "gbps": null, "host_cpu": 1, "size_mb": 16, "status": "ok", "test": "core_h2d_matrix"},
          {"device_id": 0, "gbps": -1, "host_cpu": 1, "size_mb": 16, "status": "ok", "test": "core_h2d_matrix"},
          {"device_id": 0, "gbps": 1, "host_cpu": 1, "size_mb": 16, "status": "pending", "test": "core_h2d_matrix"},
          {"device_id": 0, "gbps": 1, "host_cpu": 1, "size_mb": 16, "test": "core_h2d_matrix"},
          {"device_id": null, "host_cpu": null, "reason": "torch/device unavailable", "repeat": null, "status": "skip", "test": "core_h2d_matrix"}]}"#,
    );
    let reasons: Vec<(&str, usize, &str)> = rec
        .rejected
        .iter()
        .map(|r| (r.reason.as_str(), r.count, r.first.as_str()))
        .collect();
    assert_eq!(
        reasons,
        vec![
            (
                "direction \"device_to_device_same_rank\" is not host_to_device or device_to_host",
                2,
                "results.json metrics[1]"
            ),
            (
                "gbps is not a positive number",
                1,
                "results.json metrics[4]"
            ),
            (
                "gbps is null (NaN or Infinity)",
                1,
                "results.json metrics[3]"
            ),
            ("no status", 1, "results.json metrics[6]"),
            (
                "skipped by the tool: torch/device unavailable",
                1,
                "results.json metrics[7]"
            ),
            ("unknown status \"pending\"", 1, "results.json metrics[5]"),
        ]
    );
    assert_eq!(rec.samples.len(), 1);
    assert!(rejected_summary(&rec.rejected)
        .unwrap()
        .starts_with("7 rows not used: direction"));
}

/// Found by tests/parsers (fuzz target cluster_health): 1e300 GB/s passed as a positive
/// number and became an infinite bandwidth.
#[test]
fn a_bandwidth_that_overflows_bytes_per_second_is_not_used() {
    let rec = parse_ok(
        r#"{"metrics": [
          {"device_id": 0, "gbps": 20.0, "host_cpu": 0, "size_mb": 16, "status": "ok", "test": "core_h2d_matrix"},
          {"device_id": 0, "gbps": 1e300, "host_cpu": 1, "size_mb": 16, "status": "ok", "test": "core_h2d_matrix"}]}"#,
    );
    assert_eq!(rec.samples.len(), 1);
    assert_eq!(rec.rejected.len(), 1);
    assert_eq!(
        rec.rejected[0].reason,
        "gbps is out of range (bytes/s would overflow)"
    );
}

#[test]
fn a_recording_without_a_usable_row_is_an_error_naming_the_count_and_reason() {
    let e = parse(
        r#"{"meta": {}, "metrics": [{"device_id": null, "host_cpu": null,
            "reason": "ModuleNotFoundError(\"No module named 'torch_npu'\")", "repeat": null,
            "status": "skip", "test": "core_h2d_matrix", "ts": "2026-07-08T03:00:00+00:00"}]}"#,
        "results.json",
    )
    .unwrap_err()
    .to_string();
    assert!(e.starts_with("results.json: no matrix cells: 1 row not used: skipped by the tool: ModuleNotFoundError"), "{e}");
    assert!(e.contains("(first: results.json metrics[0])"), "{e}");
    let e = parse(r#"{"metrics": [{"test": "h2d", "gbps": 3}]}"#, "x.json")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no core_h2d_matrix or core_pair_d2d_matrix rows, only h2d x1"),
        "{e}"
    );
    let e = parse(r#"{"metrics": []}"#, "x.json")
        .unwrap_err()
        .to_string();
    assert!(e.contains("no matrix cells: 0 matrix rows"), "{e}");
}

/// A pair run with `RECORD_RANKS=all`: every row twice, once per rank; error rows without
/// `device_pair` (the tool leaves it to `meta`).
const PAIR_ALL_RANKS: &str = r#"{
  "meta": {"device_kind": "npu", "device_pair": [0, 5], "rank0_cpus": [0, 1], "rank1_cpus": [2],
           "record_ranks": "all", "sizes_mb": [8]},
  "metrics": [
    {"alg_gbps": 13.7, "avg_seconds": 0.0006, "backend": "hccl", "device": "npu:0", "device_kind": "npu",
     "device_pair": [0, 5], "local_rank": 0, "local_world_size": 2, "operation": "all_gather", "rank": 0,
     "rank0_cpu": 0, "rank1_cpu": 2, "rank_exchange_gbps": 13.7, "repeat": 0, "size_mb": 8,
     "status": "ok", "target_cpu": 0, "test": "core_pair_d2d_matrix", "world_size": 2},
    {"actual_cpus": [0, 1], "device": "npu:0", "local_rank": 0, "operation": "bind_cpu", "rank": 0,
     "rank0_cpu": 1, "rank1_cpu": 2, "reason": null, "repeat": 0, "status": "error", "target_cpu": 1,
     "test": "core_pair_d2d_matrix", "world_size": 2},
    {"alg_gbps": 13.1, "avg_seconds": 0.0006, "backend": "hccl", "device": "npu:5", "device_kind": "npu",
     "device_pair": [0, 5], "local_rank": 1, "local_world_size": 2, "operation": "all_gather", "rank": 1,
     "rank0_cpu": 0, "rank1_cpu": 2, "rank_exchange_gbps": 13.1, "repeat": 0, "size_mb": 8,
     "status": "ok", "target_cpu": 2, "test": "core_pair_d2d_matrix", "world_size": 2},
    {"alg_gbps": 12.9, "avg_seconds": 0.0006, "backend": "hccl", "device": "npu:5", "device_kind": "npu",
     "device_pair": [0, 5], "local_rank": 1, "local_world_size": 2, "operation": "all_gather", "rank": 1,
     "rank0_cpu": 1, "rank1_cpu": 2, "rank_exchange_gbps": 12.9, "repeat": 0, "size_mb": 8,
     "status": "ok", "target_cpu": 2, "test": "core_pair_d2d_matrix", "world_size": 2},
    {"local_rank": 0, "rank": 0, "rank0_cpu": null, "rank1_cpu": null, "reason": "run with torchrun --nproc_per_node=2",
     "repeat": null, "status": "error", "test": "core_pair_d2d_matrix", "world_size": 1}
  ]}"#;

#[test]
fn rows_recorded_once_per_rank_are_one_sample() {
    let rec = parse_ok(PAIR_ALL_RANKS);
    let pair: Vec<&RecordedSample> = rec.samples.iter().collect();
    assert_eq!(pair.len(), 2, "two cells, one sample each: {pair:?}");
    assert_eq!((pair[0].cpu, pair[0].peer_cpu), (0, Some(2)));
    assert_eq!(pair[0].outcome, Ok(13.7e9), "rank 0's value");
    assert_eq!(pair[0].device, "0,5");
    assert_eq!(pair[0].size_bytes, 8 << 20);
    let failed = pair[1].outcome.as_ref().unwrap_err();
    assert_eq!(failed.kind, FailureKind::Bind);
    assert_eq!(
        failed.message, "rank 0: error (bind_cpu)",
        "device pair from meta"
    );
    assert_eq!(rec.notes.len(), 1);
    assert!(rec.notes[0].starts_with("2 pair samples were recorded once per rank"));
    assert_eq!(rec.rejected.len(), 1);
    assert_eq!(
        rec.rejected[0].reason,
        "error row names no CPU pair: error: run with torchrun --nproc_per_node=2"
    );
}

#[test]
fn rank_zero_only_repeats_stay_separate_samples() {
    let rec = parse_ok(
        r#"{"meta": {"device_pair": [0, 1]}, "metrics": [
        {"alg_gbps": 10.0, "rank": 0, "rank0_cpu": 0, "rank1_cpu": 1, "repeat": 0, "size_mb": 8, "status": "ok", "test": "core_pair_d2d_matrix"},
        {"alg_gbps": 11.0, "rank": 0, "rank0_cpu": 0, "rank1_cpu": 1, "repeat": 1, "size_mb": 8, "status": "ok", "test": "core_pair_d2d_matrix"},
        {"error": "RuntimeError('HCCL timeout')", "operation": "all_gather", "rank": 0, "rank0_cpu": 0, "rank1_cpu": 1, "repeat": 2, "size_mb": 8, "status": "error", "test": "core_pair_d2d_matrix"}]}"#,
    );
    let outcomes: Vec<_> = rec.samples.iter().map(|s| s.outcome.clone()).collect();
    assert_eq!(outcomes.len(), 3);
    assert_eq!(outcomes[0], Ok(10e9));
    assert_eq!(outcomes[1], Ok(11e9));
    let f = outcomes[2].as_ref().unwrap_err();
    assert_eq!(f.kind, FailureKind::Collective);
    assert_eq!(
        f.message,
        "error (all_gather): RuntimeError('HCCL timeout')"
    );
    assert!(rec.notes.is_empty());
}

#[test]
fn partial_checkpoints_say_how_far_the_run_got() {
    let rec = parse_ok(
        r#"{"meta": {"partial": true, "last_completed_cpu": 17, "updated_at": "2026-07-08T03:10:00+00:00"},
            "metrics": [{"device_id": 0, "gbps": 20.0, "host_cpu": 17, "size_mb": 16, "status": "ok", "test": "core_h2d_matrix"}]}"#,
    );
    assert_eq!(
        rec.partial.as_deref(),
        Some("only the partial checkpoint results.json exists: the run did not finish (last completed CPU 17, updated 2026-07-08T03:10:00+00:00)")
    );
}
