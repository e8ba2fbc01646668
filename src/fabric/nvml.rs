//! NVIDIA NVLink fabric from NVML, loaded at run time (`libnvidia-ml.so.1`),
//! the preferred source: no process to spawn, no text to parse.
//!
//! `nvml-wrapper` loads the library and fails cleanly where it is absent, but
//! has no safe call for the fabric info, so [`gpu_fabric_info`] calls the raw
//! `nvmlDeviceGetGpuFabricInfoV` binding. Its answer is turned into the same
//! [`FabricInfo`] the `nvidia-smi -q` parser produces, so one set of rules
//! decides what is published.

use super::nvidia::FabricInfo;
use crate::pci;
use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings as sys;
use std::collections::BTreeMap;
use std::ffi::OsStr;

/// The library name the loader searches for by default.
pub const DEFAULT_LIB: &str = "libnvidia-ml.so.1";

/// Why NVML gave no answer at all.
#[derive(Debug, thiserror::Error)]
pub enum NvmlError {
    /// The library could not be loaded or initialised (no driver here).
    #[error("NVML unavailable ({lib}): {source}")]
    Unavailable {
        /// The library path or name tried.
        lib: String,
        /// The loader's or nvmlInit's error.
        source: nvml_wrapper::error::NvmlError,
    },
    /// A call failed after NVML loaded.
    #[error("NVML {call}: {why}")]
    Call {
        /// The call.
        call: &'static str,
        /// Its error.
        why: String,
    },
    /// Not asked: this binary does not link NVML's loader, or NVML cannot
    /// work here (no `/dev/nvidiactl`, or the tree read is not a sysfs mount).
    #[error("NVML not used here (nodefabric-full loads it where /dev/nvidiactl exists and the tree is a mounted sysfs)")]
    NotLinked,
}

/// Reads every GPU's fabric info, keyed by normalised PCI address.
pub fn read(lib: Option<&OsStr>) -> Result<BTreeMap<String, FabricInfo>, NvmlError> {
    let lib_name = lib.unwrap_or(OsStr::new(DEFAULT_LIB));
    let nvml = Nvml::builder()
        .lib_path(lib_name)
        .init()
        .map_err(|source| NvmlError::Unavailable {
            lib: lib_name.to_string_lossy().into_owned(),
            source,
        })?;
    let call = |call: &'static str| {
        move |e: nvml_wrapper::error::NvmlError| NvmlError::Call {
            call,
            why: e.to_string(),
        }
    };
    let count = nvml.device_count().map_err(call("nvmlDeviceGetCount"))?;
    let mut out = BTreeMap::new();
    for index in 0..count {
        let device = nvml
            .device_by_index(index)
            .map_err(call("nvmlDeviceGetHandleByIndex"))?;
        let bus_id = device
            .pci_info()
            .map_err(call("nvmlDeviceGetPciInfo"))?
            .bus_id;
        let address = pci::normalize(&bus_id).ok_or_else(|| NvmlError::Call {
            call: "nvmlDeviceGetPciInfo",
            why: format!("{bus_id:?} is not a PCI address"),
        })?;
        // SAFETY: the handle comes from this Nvml instance, which outlives the call.
        let info = unsafe { gpu_fabric_info(&nvml, device.handle()) }?;
        out.insert(address, info);
    }
    Ok(out)
}

/// `NVML_STRUCT_VERSION(GpuFabricInfo, 3)` from nvml.h: the struct size with
/// the version number in the top byte.
fn fabric_info_version() -> u32 {
    std::mem::size_of::<sys::nvmlGpuFabricInfo_v3_t>() as u32 | (3 << 24)
}

/// Calls `nvmlDeviceGetGpuFabricInfoV` for one device.
///
/// # Safety
/// `device` must be a live handle obtained from `nvml`.
unsafe fn gpu_fabric_info(nvml: &Nvml, device: sys::nvmlDevice_t) -> Result<FabricInfo, NvmlError> {
    // The symbol is missing on drivers before fabric info existed; the
    // binding's own wrapper would panic then, so the Result is checked here.
    let Ok(f) = nvml.lib().nvmlDeviceGetGpuFabricInfoV.as_ref() else {
        return Ok(from_raw(
            sys::NVML_GPU_FABRIC_STATE_NOT_SUPPORTED as u8,
            sys::nvmlReturn_enum_NVML_SUCCESS,
            0,
            [0; 16],
        ));
    };
    // SAFETY: a plain C struct of integers and a byte array; all-zero is a valid value.
    let mut info: sys::nvmlGpuFabricInfo_v3_t = unsafe { std::mem::zeroed() };
    info.version = fabric_info_version();
    // SAFETY: `device` is live (caller's contract) and `info` is a writable
    // struct of the size and version the call is told about.
    let rc = unsafe { f(device, &mut info) };
    if rc == sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED {
        return Ok(from_raw(
            sys::NVML_GPU_FABRIC_STATE_NOT_SUPPORTED as u8,
            sys::nvmlReturn_enum_NVML_SUCCESS,
            0,
            [0; 16],
        ));
    }
    if rc != sys::nvmlReturn_enum_NVML_SUCCESS {
        return Err(NvmlError::Call {
            call: "nvmlDeviceGetGpuFabricInfoV",
            why: format!("returned {rc}"),
        });
    }
    Ok(from_raw(
        info.state,
        info.status,
        info.cliqueId,
        info.clusterUuid,
    ))
}

/// NVML's numeric answer in the words `nvidia-smi -q` prints, so the same
/// rules apply: states 0–3 are Not Supported, Not Started, In Progress,
/// Completed; status 0 is Success.
pub fn from_raw(state: u8, status: u32, clique_id: u32, cluster_uuid: [u8; 16]) -> FabricInfo {
    let state = match u32::from(state) {
        sys::NVML_GPU_FABRIC_STATE_NOT_SUPPORTED => "Not Supported".to_string(),
        sys::NVML_GPU_FABRIC_STATE_NOT_STARTED => "Not Started".to_string(),
        sys::NVML_GPU_FABRIC_STATE_IN_PROGRESS => "In Progress".to_string(),
        sys::NVML_GPU_FABRIC_STATE_COMPLETED => "Completed".to_string(),
        other => format!("unknown state {other}"),
    };
    let status = if status == sys::nvmlReturn_enum_NVML_SUCCESS {
        "Success".to_string()
    } else {
        format!("NVML error {status}")
    };
    let hex: String = cluster_uuid.iter().map(|b| format!("{b:02x}")).collect();
    let uuid = format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    );
    FabricInfo {
        state: Some(state),
        status: Some(status),
        clique_id: Some(clique_id.to_string()),
        cluster_uuid: Some(uuid),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::nvidia::fabric;

    const UUID: [u8; 16] = [
        0x5b, 0x0e, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd,
        0xef,
    ];

    #[test]
    fn raw_answers_follow_the_same_rules_as_nvidia_smi() {
        let done = fabric(&from_raw(3, 0, 7, UUID)).unwrap();
        assert_eq!(done.id.as_deref(), Some("5b0e112233445566778899aabbccddef"));
        assert_eq!(done.clique_id.as_deref(), Some("7"));
        assert!(fabric(&from_raw(2, 0, 7, UUID))
            .unwrap_err()
            .to_string()
            .contains("In Progress"));
        assert!(fabric(&from_raw(1, 0, 0, [0; 16]))
            .unwrap_err()
            .to_string()
            .contains("Not Started"));
        assert!(fabric(&from_raw(0, 0, 0, [0; 16]))
            .unwrap_err()
            .to_string()
            .contains("Not Supported"));
        assert!(fabric(&from_raw(3, 999, 7, UUID))
            .unwrap_err()
            .to_string()
            .contains("NVML error 999"));
        assert!(fabric(&from_raw(3, 0, 7, [0; 16]))
            .unwrap_err()
            .to_string()
            .contains("all zeros"));
    }

    #[test]
    fn the_struct_version_matches_nvml_h() {
        // NVML_STRUCT_VERSION(GpuFabricInfo, 3) = sizeof | 3 << 24.
        let v = fabric_info_version();
        assert_eq!(v >> 24, 3);
        assert_eq!(
            (v & 0xff_ffff) as usize,
            std::mem::size_of::<sys::nvmlGpuFabricInfo_v3_t>()
        );
    }

    #[test]
    fn a_missing_library_is_a_clean_error() {
        let e = read(Some(OsStr::new("/nonexistent/libnvidia-ml.so.1"))).unwrap_err();
        assert!(matches!(e, NvmlError::Unavailable { .. }), "{e}");
        assert!(
            e.to_string().contains("/nonexistent/libnvidia-ml.so.1"),
            "{e}"
        );
    }
}
