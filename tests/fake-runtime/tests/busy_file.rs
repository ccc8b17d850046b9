//! `CHD_FAKE_BUSY_FILE`: the busy list is re-read on every NVML/ACL query, so a device can
//! become busy (or idle) mid-run; an unreadable file falls back to `CHD_FAKE_BUSY_DEVICES`.

mod common;

use std::ffi::c_uint;
use std::path::PathBuf;
use std::ptr::null_mut;

use chd_fake_runtime::acl::*;
use chd_fake_runtime::nvml::*;

fn nvml_busy(index: c_uint) -> (c_uint, c_uint) {
    let mut h = null_mut();
    let mut util = nvmlUtilization_t::default();
    let mut count: c_uint = 0;
    // SAFETY: valid out-pointers.
    unsafe {
        assert_eq!(nvmlDeviceGetHandleByIndex_v2(index, &mut h), NVML_SUCCESS);
        assert_eq!(nvmlDeviceGetUtilizationRates(h, &mut util), NVML_SUCCESS);
        nvmlDeviceGetComputeRunningProcesses_v3(h, &mut count, null_mut());
    }
    (util.gpu, count)
}

fn acl_busy(device: i32) -> i32 {
    let mut info = aclrtUtilizationInfo {
        cubeUtilization: -1,
        vectorUtilization: -1,
        aicpuUtilization: -1,
        memoryUtilization: -1,
        utilizationExtend: null_mut(),
    };
    // SAFETY: valid out-struct.
    let rc = unsafe { aclrtGetDeviceUtilizationRate(device, &mut info) };
    assert_eq!(rc, ACL_SUCCESS);
    info.cubeUtilization
}

#[test]
fn busy_file_is_reread_on_every_query() {
    let path: PathBuf = std::env::temp_dir().join(format!("chd-fake-busy-{}", std::process::id()));
    std::fs::write(&path, "").unwrap();
    let path_str = path.to_str().unwrap().to_owned();
    let _g = common::setup(&[
        ("CHD_FAKE_DEVICE_COUNT", "4"),
        ("CHD_FAKE_BUSY_FILE", path_str.as_str()),
        ("CHD_FAKE_BUSY_DEVICES", "1"),
    ]);
    // SAFETY: no arguments.
    assert_eq!(unsafe { nvmlInit_v2() }, NVML_SUCCESS);

    // Empty file: nothing busy (the env list is ignored while the file is readable).
    for d in 0..4 {
        assert_eq!(nvml_busy(d), (0, 0));
        assert_eq!(acl_busy(d as i32), 0);
    }
    std::fs::write(&path, "3\n").unwrap();
    assert_eq!(nvml_busy(3), (100, 1));
    assert_eq!(acl_busy(3), 100);
    assert_eq!(nvml_busy(0), (0, 0));

    std::fs::write(&path, "0, 3").unwrap();
    assert_eq!(nvml_busy(0), (100, 1));
    assert_eq!(acl_busy(0), 100);
    assert_eq!(nvml_busy(3), (100, 1));

    std::fs::write(&path, "").unwrap();
    assert_eq!(nvml_busy(3), (0, 0));
    assert_eq!(acl_busy(3), 0);

    // Gone: fall back to CHD_FAKE_BUSY_DEVICES (with one warning on stderr).
    std::fs::remove_file(&path).unwrap();
    assert_eq!(nvml_busy(1), (100, 1));
    assert_eq!(acl_busy(1), 100);
    assert_eq!(nvml_busy(3), (0, 0));

    // SAFETY: no arguments.
    assert_eq!(unsafe { nvmlShutdown() }, NVML_SUCCESS);
}
