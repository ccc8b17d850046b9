//! NVML role: init reference counting, count, handles, PCI ids, names, utilization, memory
//! and running processes (with `NVML_ERROR_INSUFFICIENT_SIZE` semantics).

mod common;

use std::ffi::{c_char, c_uint, c_void, CStr};
use std::ptr::null_mut;

use chd_fake_runtime::cuda::{cudaFree, cudaMalloc, cudaSetDevice, CUDA_SUCCESS};
use chd_fake_runtime::nvml::*;

const ENV: &[(&str, &str)] = &[
    ("CHD_FAKE_DEVICE_COUNT", "4"),
    ("CHD_FAKE_BUSY_DEVICES", "2"),
    ("CHD_FAKE_PCI_BUS_IDS", "0000:1a:00.0,0000:1b:00.0"),
    ("CHD_FAKE_DEVICE_NAME", "NVIDIA H200"),
    ("CHD_FAKE_MEMORY_BYTES", "1000000000000"),
];

/// Takes the test lock and initializes NVML; `Init` shuts it down again on drop.
struct Init(#[allow(dead_code, reason = "held for its Drop")] std::sync::MutexGuard<'static, ()>);

impl Init {
    fn new() -> Self {
        let g = common::setup(ENV);
        // SAFETY: no arguments.
        assert_eq!(unsafe { nvmlInit_v2() }, NVML_SUCCESS);
        Init(g)
    }
}

impl Drop for Init {
    fn drop(&mut self) {
        // SAFETY: no arguments.
        let rc = unsafe { nvmlShutdown() };
        if !std::thread::panicking() {
            assert_eq!(rc, NVML_SUCCESS);
        }
    }
}

fn handle(index: c_uint) -> nvmlDevice_t {
    let mut h = null_mut();
    // SAFETY: `h` is a live local the call writes one handle to.
    let rc = unsafe { nvmlDeviceGetHandleByIndex_v2(index, &mut h) };
    assert_eq!(rc, NVML_SUCCESS);
    h
}

fn text(buf: &[c_char]) -> String {
    // SAFETY: the fake NUL-terminates within the buffer.
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_str()
        .unwrap()
        .to_owned()
}

#[test]
fn init_is_reference_counted_and_required() {
    let _g = common::setup(ENV);
    let mut n = 0;
    // SAFETY: valid out-pointers.
    unsafe {
        assert_eq!(nvmlDeviceGetCount_v2(&mut n), NVML_ERROR_UNINITIALIZED);
        assert_eq!(nvmlShutdown(), NVML_ERROR_UNINITIALIZED);
        assert_eq!(nvmlInit_v2(), NVML_SUCCESS);
        assert_eq!(nvmlInitWithFlags(0), NVML_SUCCESS);
        assert_eq!(nvmlShutdown(), NVML_SUCCESS);
        assert_eq!(nvmlDeviceGetCount_v2(&mut n), NVML_SUCCESS);
        assert_eq!(n, 4);
        assert_eq!(nvmlShutdown(), NVML_SUCCESS);
        assert_eq!(nvmlDeviceGetCount_v2(&mut n), NVML_ERROR_UNINITIALIZED);
        assert_eq!(
            CStr::from_ptr(nvmlErrorString(7)).to_str().unwrap(),
            "Insufficient Size"
        );
        assert_eq!(
            CStr::from_ptr(nvmlErrorString(1)).to_str().unwrap(),
            "Uninitialized"
        );
    }
}

#[test]
fn count_handles_names_and_pci_ids() {
    let _i = Init::new();
    let mut n = 0;
    let mut buf = [0 as c_char; 96];
    // SAFETY: nvmlPciInfo_t is plain integers and chars; all-zero is valid.
    let mut pci: nvmlPciInfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid buffers of the stated sizes.
    unsafe {
        assert_eq!(nvmlDeviceGetCount_v2(&mut n), NVML_SUCCESS);
        assert_eq!(n, 4);
        let mut h = null_mut();
        assert_eq!(
            nvmlDeviceGetHandleByIndex_v2(4, &mut h),
            NVML_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            nvmlDeviceGetHandleByIndex_v2(0, null_mut()),
            NVML_ERROR_INVALID_ARGUMENT
        );

        assert_eq!(
            nvmlSystemGetDriverVersion(buf.as_mut_ptr(), 80),
            NVML_SUCCESS
        );
        assert_eq!(text(&buf), "550.54.15");
        assert_eq!(
            nvmlSystemGetDriverVersion(buf.as_mut_ptr(), 5),
            NVML_ERROR_INSUFFICIENT_SIZE
        );

        assert_eq!(
            nvmlDeviceGetName(handle(3), buf.as_mut_ptr(), 96),
            NVML_SUCCESS
        );
        assert_eq!(text(&buf), "NVIDIA H200");
        assert_eq!(
            nvmlDeviceGetName(handle(3), buf.as_mut_ptr(), 11),
            NVML_ERROR_INSUFFICIENT_SIZE
        );
        let bogus = 77usize as nvmlDevice_t;
        assert_eq!(
            nvmlDeviceGetName(bogus, buf.as_mut_ptr(), 96),
            NVML_ERROR_INVALID_ARGUMENT
        );

        let expect = [
            ("0000:1A:00.0", "00000000:1A:00.0", 0x1a),
            ("0000:1B:00.0", "00000000:1B:00.0", 0x1b),
            ("0000:12:00.0", "00000000:12:00.0", 0x12),
            ("0000:13:00.0", "00000000:13:00.0", 0x13),
        ];
        for (i, (legacy, full, bus)) in expect.into_iter().enumerate() {
            assert_eq!(
                nvmlDeviceGetPciInfo_v3(handle(i as c_uint), &mut pci),
                NVML_SUCCESS
            );
            assert_eq!(text(&pci.busIdLegacy), legacy);
            assert_eq!(text(&pci.busId), full);
            assert_eq!((pci.domain, pci.bus, pci.device), (0, bus, 0));
            assert_eq!(pci.pciDeviceId, PCI_DEVICE_ID);
        }
        for id in [c"00000000:1B:00.0", c"0000:1b:00.0", c"1b:00.0"] {
            assert_eq!(
                nvmlDeviceGetHandleByPciBusId_v2(id.as_ptr(), &mut h),
                NVML_SUCCESS
            );
            assert_eq!(h, handle(1));
        }
        assert_eq!(
            nvmlDeviceGetHandleByPciBusId_v2(c"0000:99:00.0".as_ptr(), &mut h),
            NVML_ERROR_NOT_FOUND
        );
        assert_eq!(
            nvmlDeviceGetHandleByPciBusId_v2(c"nonsense".as_ptr(), &mut h),
            NVML_ERROR_INVALID_ARGUMENT
        );
    }
}

#[test]
fn utilization_and_memory() {
    let _i = Init::new();
    let mut util = nvmlUtilization_t::default();
    let mut mem = nvmlMemory_t::default();
    let mut mem2 = nvmlMemory_v2_t::default();
    // SAFETY: valid out-structs.
    unsafe {
        assert_eq!(
            nvmlDeviceGetUtilizationRates(handle(2), &mut util),
            NVML_SUCCESS
        );
        assert_eq!((util.gpu, util.memory), (100, 100));
        assert_eq!(
            nvmlDeviceGetUtilizationRates(handle(1), &mut util),
            NVML_SUCCESS
        );
        assert_eq!((util.gpu, util.memory), (0, 0));
        assert_eq!(
            nvmlDeviceGetUtilizationRates(handle(1), null_mut()),
            NVML_ERROR_INVALID_ARGUMENT
        );

        assert_eq!(nvmlDeviceGetMemoryInfo(handle(2), &mut mem), NVML_SUCCESS);
        assert_eq!(
            mem,
            nvmlMemory_t {
                total: 1_000_000_000_000,
                used: 1 << 30,
                free: 1_000_000_000_000 - (1 << 30)
            }
        );
        assert_eq!(nvmlDeviceGetMemoryInfo(handle(0), &mut mem), NVML_SUCCESS);
        assert_eq!((mem.used, mem.free), (0, mem.total));

        assert_eq!(
            nvmlDeviceGetMemoryInfo_v2(handle(0), &mut mem2),
            NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        );
        mem2.version = NVML_MEMORY_V2;
        assert_eq!(NVML_MEMORY_V2, 0x0200_0028);
        assert_eq!(cudaSetDevice(0), CUDA_SUCCESS);
        let mut p: *mut c_void = null_mut();
        assert_eq!(cudaMalloc(&mut p, 12345), CUDA_SUCCESS);
        assert_eq!(
            nvmlDeviceGetMemoryInfo_v2(handle(0), &mut mem2),
            NVML_SUCCESS
        );
        assert_eq!(
            (mem2.total, mem2.reserved, mem2.used),
            (1_000_000_000_000, 0, 12345)
        );
        assert_eq!(mem2.free, mem2.total - 12345);
        assert_eq!(cudaFree(p), CUDA_SUCCESS);
    }
}

fn processes(index: c_uint) -> Vec<nvmlProcessInfo_t> {
    let h = handle(index);
    let mut count: c_uint = 0;
    // SAFETY: count 0 with a dangling-but-unused pointer is how nvml-wrapper asks for the size.
    let rc = unsafe {
        nvmlDeviceGetComputeRunningProcesses_v3(
            h,
            &mut count,
            std::ptr::NonNull::dangling().as_ptr(),
        )
    };
    if count == 0 {
        assert_eq!(rc, NVML_SUCCESS);
        return Vec::new();
    }
    assert_eq!(rc, NVML_ERROR_INSUFFICIENT_SIZE);
    let mut infos = vec![nvmlProcessInfo_t::default(); count as usize + 5];
    let mut cap = infos.len() as c_uint;
    // SAFETY: `infos` has `cap` entries.
    let rc = unsafe { nvmlDeviceGetComputeRunningProcesses_v3(h, &mut cap, infos.as_mut_ptr()) };
    assert_eq!(rc, NVML_SUCCESS);
    infos.truncate(cap as usize);
    infos
}

#[test]
fn running_processes() {
    let _i = Init::new();
    let mut count: c_uint = 0;
    // SAFETY: valid pointers (NULL infos with count 0 is allowed).
    unsafe {
        assert_eq!(
            nvmlDeviceGetComputeRunningProcesses_v3(handle(0), &mut count, null_mut()),
            NVML_SUCCESS
        );
        assert_eq!(count, 0);
        assert_eq!(
            nvmlDeviceGetComputeRunningProcesses_v3(handle(2), &mut count, null_mut()),
            NVML_ERROR_INSUFFICIENT_SIZE
        );
        assert_eq!(count, 1);
        assert_eq!(
            nvmlDeviceGetComputeRunningProcesses_v3(handle(2), null_mut(), null_mut()),
            NVML_ERROR_INVALID_ARGUMENT
        );
    }
    let busy = processes(2);
    assert_eq!(busy.len(), 1);
    assert_eq!((busy[0].pid, busy[0].usedGpuMemory), (4242, 1 << 30));
    assert!(processes(3).is_empty());

    // Our own allocations make our pid show up, next to the foreign one on a busy device.
    let mut p3: *mut c_void = null_mut();
    let mut p2: *mut c_void = null_mut();
    // SAFETY: valid out-pointers.
    unsafe {
        assert_eq!(cudaSetDevice(3), CUDA_SUCCESS);
        assert_eq!(cudaMalloc(&mut p3, 4096), CUDA_SUCCESS);
        assert_eq!(cudaSetDevice(2), CUDA_SUCCESS);
        assert_eq!(cudaMalloc(&mut p2, 8192), CUDA_SUCCESS);
    }
    let me = std::process::id();
    let on3 = processes(3);
    assert_eq!(on3.len(), 1);
    assert_eq!((on3[0].pid, on3[0].usedGpuMemory), (me, 4096));
    let on2: Vec<_> = processes(2)
        .iter()
        .map(|p| (p.pid, p.usedGpuMemory))
        .collect();
    assert_eq!(on2, vec![(4242, 1 << 30), (me, 8192)]);
    // SAFETY: both allocated above.
    unsafe {
        assert_eq!(cudaFree(p3), CUDA_SUCCESS);
        assert_eq!(cudaFree(p2), CUDA_SUCCESS);
    }
    assert!(processes(3).is_empty());
}

#[test]
fn memory_bus_width_and_maximum_memory_clock_answer_as_an_h200() {
    let _i = Init::new();
    let (mut bits, mut mhz) = (0, 0);
    // SAFETY: valid out-pointers.
    unsafe {
        assert_eq!(
            nvmlDeviceGetMemoryBusWidth(handle(1), &mut bits),
            NVML_SUCCESS
        );
        assert_eq!(
            nvmlDeviceGetMaxClockInfo(handle(1), NVML_CLOCK_MEM, &mut mhz),
            NVML_SUCCESS
        );
        assert_eq!((bits, mhz), (6144, 3201));
        assert_eq!(
            nvmlDeviceGetMaxClockInfo(handle(1), 7, &mut mhz),
            NVML_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            nvmlDeviceGetMemoryBusWidth(null_mut(), &mut bits),
            NVML_ERROR_INVALID_ARGUMENT
        );
    }
}
