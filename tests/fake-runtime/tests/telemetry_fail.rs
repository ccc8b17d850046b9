//! `CHD_FAKE_TELEMETRY_FAIL_DEVICES`: the listed devices' utilization and process queries fail
//! (NVML and ACL), the others answer, and copies are unaffected.

mod common;

use std::ffi::c_uint;
use std::ptr::null_mut;

use chd_fake_runtime::acl::*;
use chd_fake_runtime::nvml::*;

fn nvml_codes(index: c_uint) -> (NvmlReturn, NvmlReturn, NvmlReturn) {
    let mut h = null_mut();
    let mut util = nvmlUtilization_t::default();
    let mut count: c_uint = 0;
    let mut memory = nvmlMemory_t::default();
    // SAFETY: valid out-pointers.
    unsafe {
        assert_eq!(nvmlDeviceGetHandleByIndex_v2(index, &mut h), NVML_SUCCESS);
        (
            nvmlDeviceGetUtilizationRates(h, &mut util),
            nvmlDeviceGetComputeRunningProcesses_v3(h, &mut count, null_mut()),
            nvmlDeviceGetMemoryInfo(h, &mut memory),
        )
    }
}

fn acl_code(device: i32) -> AclError {
    let mut info = aclrtUtilizationInfo {
        cubeUtilization: -1,
        vectorUtilization: -1,
        aicpuUtilization: -1,
        memoryUtilization: -1,
        utilizationExtend: null_mut(),
    };
    // SAFETY: valid out-struct.
    unsafe { aclrtGetDeviceUtilizationRate(device, &mut info) }
}

#[test]
fn listed_devices_cannot_report_utilization_or_processes() {
    let _g = common::setup(&[
        ("CHD_FAKE_DEVICE_COUNT", "2"),
        ("CHD_FAKE_TELEMETRY_FAIL_DEVICES", "1"),
    ]);
    // SAFETY: no arguments.
    assert_eq!(unsafe { nvmlInit_v2() }, NVML_SUCCESS);
    assert_eq!(nvml_codes(0), (NVML_SUCCESS, NVML_SUCCESS, NVML_SUCCESS));
    // Memory still answers: only what the idle gate reads fails.
    assert_eq!(
        nvml_codes(1),
        (NVML_ERROR_UNKNOWN, NVML_ERROR_UNKNOWN, NVML_SUCCESS)
    );
    assert_eq!(acl_code(0), ACL_SUCCESS);
    assert_eq!(acl_code(1), ACL_ERROR_RT_INTERNAL_ERROR);
}
