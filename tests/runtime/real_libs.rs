//! chd's loaders and CLI against the real NVIDIA libraries (pinned PyPI wheels fetched by
//! `scripts/real-libs.sh`) on a machine without a GPU or driver: every symbol each loader asks
//! for resolves in the real library, and each library's own error (libcudart:
//! `cudaErrorInsufficientDriver`, code 35; NCCL: `ncclUnhandledCudaError`; cuBLAS:
//! `CUBLAS_STATUS_NOT_INITIALIZED`) reaches the user. `--backend auto` falls back to the host
//! backend with one line naming the reason. NCCL and cuBLAS are reached past the CUDA runtime by
//! pairing them with the fake CUDA runtime, which has devices.

use crate::fake;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::chd_process::{chd_bin, run_chd as chd, text, Chd};
use crate::real::{assert_no_driver, real_lib, RealLib};
use chd::runtime::collective::Nccl;
use chd::runtime::cuda::{CudaBackend, CudaLoadError, CudaRuntime};
use chd::runtime::gemm::Cublas;
use chd::runtime::library::{record_lookups, Lookup};

const INSUFFICIENT_DRIVER: &str =
    "cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime version";

/// Every lookup the loader made found its symbol, except the `(missing, fallback)` pairs given,
/// where the loader asked for `fallback` right after `missing` and found it; at least `min`
/// lookups (a loader that asked for nothing proves nothing).
fn assert_all_found(
    lib: &RealLib,
    lookups: &[Lookup],
    min: usize,
    fallbacks: &[(&str, &'static str)],
) {
    let missing: Vec<&str> = lookups
        .iter()
        .filter(|l| !l.found)
        .map(|l| l.symbol)
        .collect();
    let expected: Vec<&str> = fallbacks.iter().map(|(m, _)| *m).collect();
    assert_eq!(missing, expected, "{lib} lacks symbols chd declares");
    for (gone, fallback) in fallbacks {
        let at = lookups.iter().position(|l| l.symbol == *gone).unwrap();
        assert_eq!(
            lookups.get(at + 1),
            Some(&Lookup {
                symbol: fallback,
                found: true
            }),
            "{lib}: chd does not fall back from {gone} to {fallback}: {lookups:?}"
        );
    }
    assert!(
        lookups.len() >= min,
        "chd's loader asked {lib} for only {} symbols: {lookups:?}",
        lookups.len()
    );
}

/// A CPU this process may run on (the probes below measure one CPU only).
/// `--backend auto` over a runtime without a driver: exactly one line gives libcudart's own
/// reason, it says the cuda backend was skipped (`line_starts_with` it, for the CLI's notes;
/// anywhere in the line, for the log's formatted lines when `None`), and the host backend
/// took over.
fn assert_fell_back_once(
    lib: &impl std::fmt::Display,
    output: &str,
    line_starts_with: Option<&str>,
) {
    let reasons: Vec<&str> = output
        .lines()
        .filter(|l| l.contains("cudaErrorInsufficientDriver"))
        .collect();
    assert_eq!(reasons.len(), 1, "{lib}: {output}");
    let placed = match line_starts_with {
        Some(prefix) => reasons[0].starts_with(prefix),
        None => reasons[0].contains("cuda skipped: "),
    };
    assert!(
        placed && reasons[0].contains(INSUFFICIENT_DRIVER),
        "{lib}: {output}"
    );
    assert!(output.contains("backend: host backend"), "{lib}: {output}");
}

fn one_cpu() -> String {
    chd::topology::Topology::read(&chd::topology::Roots::default())
        .unwrap()
        .allowed_cpus()
        .next()
        .expect("an allowed CPU")
        .id
        .to_string()
}

fn check_cudart(
    name: &'static str,
    package: &str,
    version: i32,
    fallbacks: &[(&str, &'static str)],
) {
    assert_no_driver();
    let lib = real_lib(name, package);
    let (runtime, lookups) = record_lookups(|| CudaRuntime::load(Some(&lib.path)));
    let runtime = runtime.unwrap_or_else(|e| panic!("chd cannot load {lib}: {e}"));
    assert_all_found(&lib, &lookups, 20, fallbacks);
    assert_eq!(runtime.runtime_version().unwrap(), version, "{lib}");
    // No driver: the runtime's own answer, through chd's error mapping.
    let err = runtime.device_count().unwrap_err();
    assert_eq!(
        (err.call, err.code, err.text.as_str()),
        ("cudaGetDeviceCount", 35, INSUFFICIENT_DRIVER),
        "{lib}"
    );
    match CudaBackend::open(Some(&lib.path), Path::new("/sys")) {
        Err(CudaLoadError::Call(e)) => assert_eq!(e.code, 35, "{lib}: {e}"),
        other => panic!("{lib}: the CUDA backend opened without a driver: {other:?}"),
    }
}

#[test]
fn real_cudart_12_9_79_resolves_every_declared_symbol_and_reports_insufficient_driver() {
    alone!(real_cudart_12_9_79_resolves_every_declared_symbol_and_reports_insufficient_driver);
    // cuda_runtime_api.h 12.9: `#define cudaGetDeviceProperties cudaGetDeviceProperties_v2`.
    check_cudart("cudart12", "nvidia-cuda-runtime-cu12==12.9.79", 12090, &[]);
}

#[test]
fn real_cudart_13_0_96_resolves_every_declared_symbol_and_reports_insufficient_driver() {
    alone!(real_cudart_13_0_96_resolves_every_declared_symbol_and_reports_insufficient_driver);
    // CUDA 13 dropped the _v2 alias: its cuda_runtime_api.h declares cudaGetDeviceProperties
    // with the current struct, and libcudart.so.13 exports only that name.
    check_cudart(
        "cudart13",
        "nvidia-cuda-runtime==13.0.96",
        13000,
        &[("cudaGetDeviceProperties_v2", "cudaGetDeviceProperties")],
    );
}

#[test]
fn real_nccl_2_32_3_resolves_every_declared_symbol() {
    alone!(real_nccl_2_32_3_resolves_every_declared_symbol);
    let lib = real_lib("nccl", "nvidia-nccl-cu12==2.32.3");
    let (nccl, lookups) = record_lookups(|| Nccl::load(Some(&lib.path)));
    nccl.unwrap_or_else(|e| panic!("chd cannot load {lib}: {e}"));
    // The pair probe's 8 and the fabric probe's 5 (ncclGetUniqueId, ncclCommInitRank,
    // ncclAllReduce, ncclSend, ncclRecv).
    assert_all_found(&lib, &lookups, 13, &[]);
}

#[test]
fn real_cublas_12_9_3_13_resolves_every_declared_symbol() {
    alone!(real_cublas_12_9_3_13_resolves_every_declared_symbol);
    let lib = real_lib("cublas", "nvidia-cublas-cu12==12.9.3.13");
    let (cublas, lookups) = record_lookups(|| Cublas::load(Some(&lib.path), ""));
    cublas.unwrap_or_else(|e| panic!("chd cannot load {lib}: {e}"));
    assert_all_found(&lib, &lookups, 6, &[]);
}

#[test]
fn probe_h2d_on_real_cudart_12_9_79_fails_with_its_error_and_auto_falls_back_to_host_once() {
    assert_no_driver();
    let lib = real_lib("cudart12", "nvidia-cuda-runtime-cu12==12.9.79");
    let cpu = one_cpu();
    let probe = |backend: &str| {
        chd(
            &[
                "probe",
                "h2d",
                "--backend",
                backend,
                "--cuda-runtime",
                lib.arg(),
                "--cpus",
                &cpu,
                "--sizes",
                "1MiB",
                "--iters",
                "1",
                "--repeats",
                "1",
            ],
            &[],
        )
    };
    let out = probe("cuda");
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{lib}: cuda backend ran: {stderr}");
    assert!(
        stderr.contains(INSUFFICIENT_DRIVER) && stderr.contains("cudaGetDeviceCount"),
        "{lib}: {stderr}"
    );
    assert!(!stderr.contains("progress:"), "{lib}: measured: {stderr}");

    let out = probe("auto");
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{lib}: auto failed: {stderr}");
    assert_fell_back_once(&lib, &stderr, Some("note: cuda skipped: "));
}

#[test]
fn serve_on_real_cudart_12_9_79_fails_with_its_error_and_auto_falls_back_to_host_once() {
    assert_no_driver();
    let lib = real_lib("cudart12", "nvidia-cuda-runtime-cu12==12.9.79");
    let state = tempfile::tempdir().unwrap();
    let mut child = Command::new(chd_bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--backend", "cuda"])
        .arg("--cuda-runtime")
        .arg(&lib.path)
        .arg("--state-dir")
        .arg(state.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn chd serve");
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("{lib}: chd serve --backend cuda did not exit within 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stderr = text(&child.wait_with_output().unwrap().stderr);
    assert!(!status.success(), "{lib}: {stderr}");
    assert!(stderr.contains(INSUFFICIENT_DRIVER), "{lib}: {stderr}");

    let chd = Chd::serve(
        state.path(),
        &["--backend", "auto", "--cuda-runtime", lib.arg()],
    );
    let (_, log) = chd.terminate();
    assert_fell_back_once(&lib, &log, None);
}

#[test]
fn probe_pair_with_real_nccl_2_32_3_reports_ncclcomminitall_own_error() {
    assert_no_driver();
    let lib = real_lib("nccl", "nvidia-nccl-cu12==2.32.3");
    let fake = fake::fake_runtime_path();
    let cpu = one_cpu();
    let out = chd(
        &[
            "probe",
            "pair",
            "--backend",
            "cuda",
            "--cuda-runtime",
            fake,
            "--nvml",
            fake,
            "--nccl",
            lib.arg(),
            "--collective",
            "nccl",
            "--pair",
            "0,1",
            "--cpus",
            &cpu,
            "--sizes",
            "1",
            "--repeats",
            "1",
            "--format",
            "table",
        ],
        &[("CHD_FAKE_DEVICE_COUNT", "2")],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(!out.status.success(), "{lib}: {stdout}{stderr}");
    let all = format!("{stdout}{stderr}");
    // NCCL links its own CUDA runtime, which finds no driver: the code's text, then what
    // ncclGetLastError adds.
    assert!(
        all.contains("ncclCommInitAll failed: unhandled cuda error")
            && all.contains("CUDA driver version is insufficient for CUDA runtime version"),
        "{lib}: {all}"
    );
}

/// `chd probe fabric --backend cuda` on loopback over the fake CUDA runtime (which has
/// devices) and the real NCCL: the receiving side's rank process makes the rendezvous with
/// the real `ncclGetUniqueId` (it needs no GPU), rank 0 relays its 128 bytes to the sending
/// side, and both rank processes reach the real `ncclCommInitRank`, whose own error (its CUDA
/// runtime finds no driver) is each rail's recorded error; the collectives' rank processes
/// likewise. Both ranks finish and record the run.
#[test]
fn probe_fabric_with_real_nccl_2_32_3_relays_its_unique_id_and_reports_ncclcomminitrank_own_error()
{
    assert_no_driver();
    let lib = real_lib("nccl", "nvidia-nccl-cu12==2.32.3");
    let fake = fake::fake_runtime_path();
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let ranks: Vec<_> = (0..2)
        .map(|r| {
            Command::new(chd_bin())
                .args([
                    "probe",
                    "fabric",
                    "--backend",
                    "cuda",
                    "--cuda-runtime",
                    fake,
                ])
                .args(["--nccl", lib.arg(), "--rails", "^lo$", "--world-size", "2"])
                .args(["--rank", &r.to_string(), "--node", &format!("node-{r}")])
                .args(["--rendezvous", &format!("127.0.0.1:{port}")])
                .args(["--bytes", "1MiB", "--collective-sizes", "1MiB"])
                .args(["--transfer-timeout", "60", "--format", "json"])
                .arg("--state-dir")
                .arg(dir.path().join(format!("node-{r}")))
                .env("CHD_FABRIC_TOKEN", "real-nccl-fabric-token-0123")
                .env("CHD_FAKE_DEVICE_COUNT", "1")
                .env("NCCL_DEBUG", "WARN")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outs: Vec<_> = ranks
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    for (r, out) in outs.iter().enumerate() {
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "{lib}: rank {r}: {stdout}{stderr}");
        assert!(
            !stderr.contains("ncclGetUniqueId failed"),
            "{lib}: {stderr}"
        );
        let printed: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        let rails = printed["results"][0]["rails"].as_array().unwrap();
        assert_eq!(rails.len(), 2, "{stdout}");
        for rail in rails {
            let e = rail["error"].as_str().unwrap_or_else(|| panic!("{rail}"));
            // Both sides got as far as joining: the sender with the relayed id.
            for rank in [0, 1] {
                let joined =
                    format!("joining the communicator as rank {rank}: ncclCommInitRank failed");
                assert!(e.contains(&joined), "{lib}: {rail}");
            }
            assert!(
                e.contains("unhandled cuda error")
                    && e.contains("CUDA driver version is insufficient for CUDA runtime version"),
                "{lib}: {rail}"
            );
        }
        for c in printed["results"][0]["collectives"].as_array().unwrap() {
            let e = c["error"].as_str().unwrap_or_else(|| panic!("{c}"));
            assert!(
                e.contains("ncclCommInitRank failed: unhandled cuda error"),
                "{lib}: {c}"
            );
        }
    }
}

#[test]
fn device_load_with_real_cublas_12_9_3_13_reports_cublascreate_own_error() {
    assert_no_driver();
    let lib = real_lib("cublas", "nvidia-cublas-cu12==12.9.3.13");
    // chd looks for cuBLAS beside the CUDA runtime first: the fake runtime and the real cuBLAS
    // (with the libcublasLt it links) side by side.
    let dir = tempfile::tempdir().unwrap();
    let runtime = dir.path().join("libcudart.so.12");
    std::os::unix::fs::symlink(fake::fake_runtime(), &runtime).unwrap();
    for name in ["libcublas.so.12", "libcublasLt.so.12"] {
        std::os::unix::fs::symlink(lib.path.with_file_name(name), dir.path().join(name)).unwrap();
    }
    let cpu = one_cpu();
    let out = chd(
        &[
            "probe",
            "h2d",
            "--backend",
            "cuda",
            "--cuda-runtime",
            runtime.to_str().unwrap(),
            "--nvml",
            fake::fake_runtime_path(),
            "--cpus",
            &cpu,
            "--sizes",
            "1MiB",
            "--iters",
            "1",
            "--repeats",
            "1",
            "--load",
            "device",
        ],
        &[("CHD_FAKE_DEVICE_COUNT", "1")],
    );
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{lib}: {stderr}");
    let cublas = dir.path().join("libcublas.so.12");
    assert!(
        stderr.contains(&format!("device load: cuBLAS from {}", cublas.display())),
        "{lib}: {stderr}"
    );
    assert!(
        stderr.contains(
            "cublasCreate_v2 failed: CUBLAS_STATUS_NOT_INITIALIZED: the library was not initialized"
        ),
        "{lib}: {stderr}"
    );
}
