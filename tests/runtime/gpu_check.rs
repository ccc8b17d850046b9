//! `scripts/gpu-check.sh` cannot rot while no GPU is at hand: shellcheck passes on every
//! script of the project, and the whole check runs on the fake CUDA runtime
//! (`GPU_CHECK_FAKE=1`) with its reference, `scripts/gpu-check/h2d_ref.cu`, built by the pinned
//! PyPI nvcc 13.0.88 and run on the fake through a libcudart symlink: one table that passes
//! when chd and the reference agree, fails on the rows where they do not, and clear messages
//! for what is missing. `--bundle` (what a GPU machine without cargo, nvcc or network gets) is
//! built and used too.

use crate::fake;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::chd_process::chd_bin;
use crate::real::{real_lib, RealLib};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn nvcc() -> RealLib {
    real_lib("nvcc", "nvidia-cuda-nvcc==13.0.88")
}

/// Run `scripts/gpu-check.sh ARGS` in fake mode with chd under test and `env` on top.
fn gpu_check(args: &[&str], env: &[(&str, &str)]) -> Output {
    let nvcc = nvcc();
    Command::new("bash")
        .arg(repo().join("scripts/gpu-check.sh"))
        .args(args)
        .env("GPU_CHECK_FAKE", "1")
        .env("GPU_CHECK_FAKE_LIB", fake::fake_runtime())
        .env("GPU_CHECK_BUNDLE", "/nonexistent/gpu-check-bundle")
        .env("NVCC", &nvcc.path)
        .env("CHD_BIN", chd_bin())
        .env("SIZES", "1,4")
        .env("PAIR_SIZE", "1")
        .env("SWEEP_FROM", "1MiB")
        .env("SWEEP_TO", "4MiB")
        .env("BASICS_SIZE", "1")
        .env("MATRIX_SIDE", "256")
        .env("TIME_LIMIT", "120")
        .env("RUST_LOG", "warn")
        .envs(env.iter().copied())
        .output()
        .expect("run scripts/gpu-check.sh")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The table's rows (after its header), each split on whitespace.
fn rows(out: &str) -> Vec<Vec<&str>> {
    let mut lines = out.lines().skip_while(|l| !l.starts_with("path "));
    let header = lines
        .next()
        .unwrap_or_else(|| panic!("no table in:\n{out}"));
    assert_eq!(
        header.split_whitespace().collect::<Vec<_>>(),
        [
            "path", "gpu", "MiB", "memory", "cells", "chd", "GB/s", "ref", "GB/s", "ratio",
            "ratio", "range", "verdict"
        ],
        "{out}"
    );
    lines
        .take_while(|l| !l.is_empty())
        .map(|l| l.split_whitespace().collect())
        .collect()
}

/// Up to two CPUs this process may use, as a `--cpus` list, and how many.
fn two_cpus() -> (String, usize) {
    let cpus: Vec<String> = chd::topology::Topology::read(&chd::topology::Roots::default())
        .unwrap()
        .allowed_cpus()
        .take(2)
        .map(|c| c.id.to_string())
        .collect();
    (cpus.join(","), cpus.len())
}

/// The h2d/d2h rows expected for `gpus` x 1 and 4 MiB.
fn host_rows(gpus: &[&str]) -> Vec<[String; 4]> {
    let mut want = Vec::new();
    for path in ["h2d", "d2h"] {
        for gpu in gpus {
            for mib in ["1", "4"] {
                for memory in ["pinned", "pageable"] {
                    want.push([path, gpu, mib, memory].map(String::from));
                }
            }
        }
    }
    want
}

/// The same-device copy rows expected for `gpus` x 1 and 4 MiB.
fn d2d_rows(gpus: &[&str]) -> Vec<[String; 4]> {
    let mut want = Vec::new();
    for gpu in gpus {
        for mib in ["1", "4"] {
            want.push(["d2d", gpu, mib, "device"].map(String::from));
        }
    }
    want
}

#[test]
fn shellcheck_passes_on_every_script() {
    let scripts = [
        ".ci/run",
        "scripts/test.sh",
        "scripts/test-suites.sh",
        "scripts/gpu-check.sh",
        "scripts/real-libs.sh",
        "scripts/bench.sh",
        "scripts/fuzz.sh",
        "scripts/memcheck.sh",
        "deploy/kubernetes/gen-prometheusrule.sh",
    ];
    let out = Command::new("shellcheck")
        .current_dir(repo())
        .args(scripts)
        .output()
        .unwrap_or_else(|e| {
            panic!("shellcheck is required for this test (apt-get install shellcheck): {e}")
        });
    assert!(out.status.success(), "shellcheck:\n{}", text(&out));
}

#[test]
fn gpu_check_on_the_fake_with_nvcc_13_0_88_prints_one_table_and_passes() {
    let (cpus, n) = two_cpus();
    let out = gpu_check(&[], &[("CHD_FAKE_DEVICE_COUNT", "2"), ("CPUS", &cpus)]);
    let all = text(&out);
    assert!(out.status.success(), "{}: {all}", nvcc());
    // The reference was built by nvcc and ran on the fake runtime (version 12.4, 2 devices).
    assert!(
        all.contains("reference: building scripts/gpu-check/h2d_ref.cu with ")
            && all.contains("(Build cuda_13.0.")
            && all.contains("reference: CUDA runtime 12.4, driver 12.4, 2 device(s)"),
        "{all}"
    );
    let rows = rows(&all);
    let mut want: Vec<Vec<&str>> = Vec::new();
    let host = host_rows(&["0", "1"]);
    let cells = n.to_string();
    for [path, gpu, mib, memory] in &host {
        want.push(vec![
            path,
            gpu,
            mib,
            memory,
            &cells,
            "58.90",
            "58.90",
            "1.000",
            "1.000-1.000",
            "ok",
        ]);
    }
    let d2d = d2d_rows(&["0", "1"]);
    for [path, gpu, mib, memory] in &d2d {
        want.push(vec![
            path,
            gpu,
            mib,
            memory,
            "1",
            "400.00",
            "400.00",
            "1.000",
            "1.000-1.000",
            "ok",
        ]);
    }
    want.push(vec![
        "p2p",
        "0,1",
        "1",
        "device",
        "1",
        "13.70",
        "13.70",
        "1.000",
        "1.000-1.000",
        "ok",
        "(reference:",
        "peer",
        "access)",
    ]);
    for pair in ["0>1", "1>0"] {
        want.push(vec![
            "peer",
            pair,
            "1",
            "device",
            "1",
            "13.70",
            "13.70",
            "1.000",
            "1.000-1.000",
            "ok",
            "(reference:",
            "peer",
            "access)",
        ]);
    }
    want.push(vec![
        "allgather",
        "0,1",
        "1",
        "device",
        "1",
        "13.70",
        "-",
        "-",
        "-",
        "no",
        "reference",
        "(NCCL)",
    ]);
    assert_eq!(rows, want, "{all}");
    assert!(
        all.lines()
            .any(|l| l.starts_with("gpu-check: PASS: every row within 5% of the reference")),
        "{all}"
    );
    // The sweep and the basic validation table follow, without a reference.
    for line in [
        "size sweep (chd probe sweep, 1MiB..4MiB, no reference):",
        "basic validation (chd probe basics, no reference):",
    ] {
        assert!(all.contains(line), "{line}: {all}");
    }
    let sweep_rows = all
        .lines()
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() >= 4
                && ["h2d", "d2h", "d2d", "allgather"].contains(&f[0])
                && f[2].ends_with("MiB")
        })
        .count();
    // 4 operations x 2 devices x 1, 2, 4 MiB.
    assert_eq!(sweep_rows, 4 * 2 * 3, "{all}");
    assert!(
        all.lines()
            .any(|l| l.starts_with("matmul (SGEMM)") && l.contains("50.0 (dev 0)")),
        "{all}"
    );
}

/// Issue 25: at 128 KiB one copy (6.55 us at 20 GB/s) is shorter than one enqueue call (the
/// fake charges 10 us): chd and the reference both hold their streams until every timed copy
/// is enqueued, so both read the link on pinned memory and agree; pageable copies are held by
/// neither (host-synchronous) and agree too.
#[test]
fn gpu_check_compares_small_sizes_with_the_enqueue_excluded_on_both_sides() {
    let out = gpu_check(
        &[],
        &[
            ("CHD_FAKE_DEVICE_COUNT", "1"),
            ("CHD_FAKE_H2D_GBPS", "20"),
            ("CHD_FAKE_ENQUEUE_US", "10"),
            ("CPUS", "per-node:1"),
            ("SIZES", "128KiB,4"),
        ],
    );
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    let rows = rows(&all);
    let small: Vec<&Vec<&str>> = rows.iter().filter(|r| r[2] == "0.125").collect();
    // h2d and d2h, pinned and pageable, and d2d.
    assert_eq!(small.len(), 5, "{all}");
    for r in &small {
        assert_eq!((r[7], r[9]), ("1.000", "ok"), "{all}");
        if r[3] == "pinned" {
            assert_eq!(
                (r[5], r[6]),
                ("20.00", "20.00"),
                "the link, not the enqueue: {all}"
            );
        }
    }
}

#[test]
fn gpu_check_fails_on_the_rows_where_chd_and_the_reference_disagree() {
    // The reference alone sees device 1 (its copies to and from the host and within it) and
    // the pair link at half the rate chd sees.
    let out = gpu_check(
        &[],
        &[
            ("CHD_FAKE_DEVICE_COUNT", "2"),
            (
                "GPU_CHECK_REF_ENV",
                "CHD_FAKE_H2D_GBPS=58.9;1=29.45 CHD_FAKE_D2D_GBPS=400;1=200 CHD_FAKE_PAIR_GBPS=6.85",
            ),
        ],
    );
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    for row in rows(&all) {
        let verdict = row[9..].join(" ");
        match (row[0], row[1]) {
            ("allgather", _) => assert_eq!(verdict, "no reference (NCCL)", "{all}"),
            ("p2p" | "peer", _) | (_, "1") => {
                assert_eq!(row[7], "2.000", "{all}");
                assert!(verdict.starts_with("FAIL: off by more than 5%"), "{all}");
            }
            _ => assert_eq!((row[7], verdict.as_str()), ("1.000", "ok"), "{all}"),
        }
    }
    assert!(
        all.lines().any(|l| l.starts_with("gpu-check: FAIL")),
        "{all}"
    );
}

#[test]
fn gpu_check_on_one_gpu_says_there_is_no_pair_path() {
    let out = gpu_check(
        &[],
        &[("CHD_FAKE_DEVICE_COUNT", "1"), ("CPUS", "per-node:1")],
    );
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    assert!(
        all.contains("pair: this machine has 1 GPU; the pair path needs two: no pair rows"),
        "{all}"
    );
    let got: Vec<[String; 4]> = rows(&all)
        .iter()
        .map(|r| [r[0], r[1], r[2], r[3]].map(String::from))
        .collect();
    let mut want = host_rows(&["0"]);
    want.extend(d2d_rows(&["0"]));
    assert_eq!(got, want, "{all}");
}

#[test]
fn a_hung_step_is_cut_at_the_time_limit_and_fails_the_check() {
    // Every peer copy of the fake blocks a minute: the pair step runs out of TIME_LIMIT.
    let start = std::time::Instant::now();
    let out = gpu_check(
        &[],
        &[
            ("CHD_FAKE_DEVICE_COUNT", "2"),
            ("CHD_FAKE_PAIR_HANG_MS", "60000"),
            ("CPUS", "per-node:1"),
            ("SIZES", "1"),
            ("TIME_LIMIT", "24"),
        ],
    );
    let all = text(&out);
    assert!(
        start.elapsed().as_secs() < 34,
        "took {:?}: {all}",
        start.elapsed()
    );
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(
        all.contains("gpu-check: chd probe pair (copy) timed out after ")
            && all.contains("gpu-check: out of time (TIME_LIMIT=24s): skipped ")
            && all.contains("expected a p2p row (this machine has two or more GPUs), got none"),
        "{all}"
    );
    // What was measured before is still in the table.
    let measured = rows(&all)
        .iter()
        .filter(|r| r[0] == "h2d" || r[0] == "d2h")
        .filter(|r| r.last() == Some(&"ok"))
        .count();
    assert_eq!(measured, 8, "{all}");
}

#[test]
fn gpu_check_says_what_is_missing() {
    let no_tools = "/usr/bin:/bin";
    for (env, want) in [
        (
            vec![("NVCC", ""), ("PATH", no_tools)],
            "gpu-check: no nvcc to build the reference (looked at $NVCC, PATH, \
             /usr/local/cuda/bin/nvcc): fake mode builds it with nvcc",
        ),
        (
            vec![("CHD_BIN", ""), ("PATH", no_tools)],
            "gpu-check: no chd: set CHD_BIN, or carry a bundle made by 'scripts/gpu-check.sh \
             --bundle' to /nonexistent/gpu-check-bundle (this machine has no cargo)",
        ),
        (
            vec![("GPU_CHECK_FAKE", "")],
            "gpu-check: no nvidia-smi: this check needs an NVIDIA GPU and its driver",
        ),
        (
            vec![("TIME_LIMIT", "3")],
            "gpu-check: out of time (TIME_LIMIT=3s): skipped nvcc",
        ),
    ] {
        let out = gpu_check(&[], &env);
        let all = text(&out);
        assert_eq!(out.status.code(), Some(1), "{env:?}: {all}");
        assert!(all.contains(want), "{env:?}: {all}");
    }
}

#[test]
fn a_bundle_holds_chd_a_static_reference_and_libcudart_13_and_is_used_when_carried() {
    let dir = tempfile::tempdir().unwrap();
    let bundle: PathBuf = dir.path().join("bundle");
    let out = gpu_check(&["--bundle", bundle.to_str().unwrap()], &[]);
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    for file in ["chd", "h2d_ref", "libcudart.so.13", "BUILD"] {
        assert!(bundle.join(file).is_file(), "{file} missing: {all}");
    }
    let build = std::fs::read_to_string(bundle.join("BUILD")).unwrap();
    assert!(
        build.contains(
            "reference built by nvidia-cuda-nvcc==13.0.88 with the static \
             nvidia-cuda-runtime==13.0.96"
        ),
        "{build}"
    );
    // The reference carries its own CUDA 13 runtime (no libcudart to find on the GPU
    // machine), which here finds no driver.
    let ldd = Command::new("ldd")
        .arg(bundle.join("h2d_ref"))
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&ldd.stdout).contains("libcudart"),
        "{}",
        String::from_utf8_lossy(&ldd.stdout)
    );
    let out = Command::new(bundle.join("h2d_ref")).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out).contains("CUDA driver version is insufficient for CUDA runtime version"),
        "{}",
        text(&out)
    );
    // Carried to a machine: its chd is used, and it matches these sources.
    let out = gpu_check(
        &[],
        &[
            ("GPU_CHECK_BUNDLE", bundle.to_str().unwrap()),
            ("CHD_BIN", ""),
            ("CHD_FAKE_DEVICE_COUNT", "1"),
            ("CPUS", "per-node:1"),
            ("SIZES", "1"),
        ],
    );
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    assert!(
        all.contains(&format!("chd: prebuilt in {}: sources ", bundle.display())),
        "{all}"
    );
    assert!(!all.contains("WARNING"), "{all}");

    // The real (not fake) path as far as it goes without a GPU: a stand-in nvidia-smi lists one
    // GPU, chd runs on the fake runtime given as CUDA_RUNTIME, and the bundle's reference, on
    // the real CUDA 13 runtime, finds no driver: every row fails for want of a reference.
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let smi = bin.join("nvidia-smi");
    std::fs::write(
        &smi,
        "#!/bin/sh\necho '0, Stand-in H200, 00000000:1A:00.0, 580.159.04, 5, 16'\n",
    )
    .unwrap();
    std::fs::set_permissions(&smi, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let path = format!("{}:/usr/bin:/bin", bin.display());
    let out = gpu_check(
        &[],
        &[
            ("GPU_CHECK_FAKE", ""),
            ("GPU_CHECK_BUNDLE", bundle.to_str().unwrap()),
            ("CHD_BIN", ""),
            ("NVCC", ""),
            ("PATH", &path),
            ("CUDA_RUNTIME", fake::fake_runtime_path()),
            ("CHD_FAKE_DEVICE_COUNT", "1"),
            ("CPUS", "per-node:1"),
            ("SIZES", "1"),
        ],
    );
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(
        all.contains("gpu: 0, Stand-in H200")
            && all.contains(&format!("reference: prebuilt {}/h2d_ref", bundle.display()))
            && all.contains("CUDA driver version is insufficient for CUDA runtime version"),
        "{all}"
    );
    let rows = rows(&all);
    assert_eq!(
        rows.len(),
        4 + 1,
        "h2d/d2h x pinned/pageable and d2d: {all}"
    );
    for r in rows {
        assert_eq!(
            r[5],
            if r[0] == "d2d" { "400.00" } else { "58.90" },
            "{all}"
        );
        assert_eq!(r[9..].join(" "), "FAIL: 1 cells without reference", "{all}");
    }
}
