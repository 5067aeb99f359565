//! NVIDIA's XID catalogue, as far as the agent judges GPUs by it: which
//! XIDs condemn the hardware, which are the workload's doing, and their
//! names for reasons and logs. The classes follow NVIDIA's catalogue
//! (<https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html>,
//! and for 48/63/64 the page-retirement guide
//! <https://docs.nvidia.com/deploy/dynamic-page-retirement/visibility.html>).

/// XID 79: the GPU has fallen off the bus and stops answering.
pub const FALLEN_OFF_THE_BUS: u64 = 79;

/// XIDs that mean the hardware (or its driver state) is bad:
/// 48 double-bit ECC error, 61 internal micro-controller breakpoint,
/// 62 internal micro-controller halt, 63 ECC page retirement / row
/// remapping event, 64 page retirement / row remapping failure,
/// 74 NVLink error, 79 GPU has fallen off the bus, 92 high single-bit
/// ECC error rate, 94 contained ECC error, 95 uncontained ECC error,
/// 119 GSP RPC timeout, 120 GSP error.
pub const CRITICAL: [u64; 12] = [
    48,
    61,
    62,
    63,
    64,
    74,
    FALLEN_OFF_THE_BUS,
    92,
    94,
    95,
    119,
    120,
];

/// XIDs the workload causes, charged to its lease; the same list the
/// NVIDIA device plugin skips (`applicationErrorXids` in its health
/// check): 13 graphics engine exception, 31 GPU memory page fault,
/// 43 GPU stopped processing, 45 preemptive cleanup, 68 video
/// processor exception.
pub const APPLICATION: [u64; 5] = [13, 31, 43, 45, 68];

/// `XID 79 (GPU has fallen off the bus)`, for reasons and logs.
pub fn describe_xid(xid: u64) -> String {
    let name = match xid {
        13 => "graphics engine exception",
        31 => "GPU memory page fault",
        43 => "GPU stopped processing",
        45 => "preemptive cleanup",
        48 => "double-bit ECC error",
        61 => "internal micro-controller breakpoint",
        62 => "internal micro-controller halt",
        63 => "ECC page retirement or row remapping event",
        64 => "ECC page retirement or row remapping failure",
        68 => "video processor exception",
        74 => "NVLink error",
        79 => "GPU has fallen off the bus",
        92 => "high single-bit ECC error rate",
        94 => "contained ECC error",
        95 => "uncontained ECC error",
        119 => "GSP RPC timeout",
        120 => "GSP error",
        _ => return format!("XID {xid}"),
    };
    format!("XID {xid} ({name})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_xid_is_both_critical_and_the_workloads() {
        assert!(CRITICAL.iter().all(|x| !APPLICATION.contains(x)));
    }

    #[test]
    fn known_xids_are_named_and_others_are_numbers() {
        assert_eq!(describe_xid(79), "XID 79 (GPU has fallen off the bus)");
        assert_eq!(describe_xid(7), "XID 7");
    }
}
