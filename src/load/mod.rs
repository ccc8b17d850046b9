//! Background load profiles for one-shot runs (`chd probe --load`): the same matrix measured
//! idle and under load shows how much a busy node costs each cell.
//!
//! - `idle`: nothing runs besides the probe.
//! - `cpu:N`: N burner threads stressing compute and memory bandwidth ([`burner`]), pinned to
//!   CPUs that are not probed; when every allowed CPU is probed they float over all of them
//!   except the one being probed. `cpu:N@LIST` pins them to LIST instead (which may include
//!   probed CPUs: "asked otherwise").
//! - `device`: a matrix-multiply loop (cuBLAS sgemm) on each probed device, on its own stream,
//!   so it overlaps the probe's copies ([`device`], [`crate::runtime::gemm`]). Only the CUDA
//!   backend runs it; the others refuse it with [`LoadError::DeviceUnsupported`].

pub mod burner;
pub mod device;

use crate::topology::cpulist;

/// One load profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadProfile {
    Idle,
    Cpu {
        threads: usize,
        /// Where to pin the burners; `None` = away from the probed CPUs.
        cpus: Option<Vec<u32>>,
    },
    Device,
}

/// Why a load profile cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{0:?} is not a load profile: expected idle, cpu:N, cpu:N@CPULIST or device")]
    Syntax(String),
    #[error("load profile {0:?}: {1}")]
    Invalid(String, String),
    #[error("load profile \"device\" is not supported by the {backend} backend: {reason}; use idle or cpu:N")]
    DeviceUnsupported { backend: String, reason: String },
    #[error("cannot start a load thread: {0}")]
    Spawn(#[source] std::io::Error),
}

impl std::str::FromStr for LoadProfile {
    type Err = LoadError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        match text {
            "idle" => return Ok(LoadProfile::Idle),
            "device" => return Ok(LoadProfile::Device),
            _ => {}
        }
        let Some(rest) = text.strip_prefix("cpu:") else {
            return Err(LoadError::Syntax(text.to_string()));
        };
        let (count, list) = match rest.split_once('@') {
            Some((c, l)) => (c, Some(l)),
            None => (rest, None),
        };
        let threads: usize = count.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
            LoadError::Invalid(text.into(), "N must be a count of at least 1".into())
        })?;
        let cpus = match list {
            Some(l) => {
                let ids = cpulist::parse(l)
                    .map_err(|e| LoadError::Invalid(text.into(), e.to_string()))?;
                if ids.is_empty() {
                    return Err(LoadError::Invalid(
                        text.into(),
                        "the CPU list is empty".into(),
                    ));
                }
                Some(ids)
            }
            None => None,
        };
        Ok(LoadProfile::Cpu { threads, cpus })
    }
}

impl std::fmt::Display for LoadProfile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadProfile::Idle => f.write_str("idle"),
            LoadProfile::Device => f.write_str("device"),
            LoadProfile::Cpu {
                threads,
                cpus: None,
            } => write!(f, "cpu:{threads}"),
            LoadProfile::Cpu {
                threads,
                cpus: Some(c),
            } => write!(f, "cpu:{threads}@{}", cpulist::format(c)),
        }
    }
}

impl LoadProfile {
    /// Refuse what this backend cannot run. (`device` on the cuda backend also needs cuBLAS,
    /// which is checked when the run opens it.)
    pub fn check_supported(&self, backend: &str) -> Result<(), LoadError> {
        let reason = match (self, backend) {
            (LoadProfile::Device, "cuda") => return Ok(()),
            (LoadProfile::Device, "acl") => {
                "it runs a cuBLAS matrix multiply on each device, and chd does not load an \
                 Ascend BLAS (aclblas) yet"
            }
            (LoadProfile::Device, _) => "it has no accelerator to run a matrix multiply on",
            _ => return Ok(()),
        };
        Err(LoadError::DeviceUnsupported {
            backend: backend.to_string(),
            reason: reason.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_parse_and_print_back() {
        for text in ["idle", "device", "cpu:4", "cpu:2@0-3,8"] {
            let p: LoadProfile = text.parse().unwrap();
            assert_eq!(p.to_string(), text);
        }
        assert_eq!(
            "cpu:3".parse::<LoadProfile>().unwrap(),
            LoadProfile::Cpu {
                threads: 3,
                cpus: None
            }
        );
    }

    #[test]
    fn bad_profiles_say_why() {
        for (text, want) in [
            ("busy", "not a load profile"),
            ("cpu:0", "at least 1"),
            ("cpu:x", "at least 1"),
            ("cpu:2@", "empty"),
        ] {
            let err = text.parse::<LoadProfile>().unwrap_err().to_string();
            assert!(err.contains(want), "{text}: {err}");
        }
    }

    #[test]
    fn device_load_is_refused_where_no_matrix_multiply_runs() {
        for backend in ["host", "acl"] {
            let err = LoadProfile::Device
                .check_supported(backend)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(&format!("not supported by the {backend} backend: ")),
                "{err}"
            );
            assert!(err.ends_with("; use idle or cpu:N"), "{err}");
        }
        assert!(LoadProfile::Device.check_supported("cuda").is_ok());
        assert!(LoadProfile::Idle.check_supported("host").is_ok());
    }
}
