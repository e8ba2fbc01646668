//! What the benchmarks read of a running child in /proc.

/// A memory figure of process `pid` in KiB: `field` is a line name of
/// /proc/PID/status, such as `VmRSS:` (now) or `VmHWM:` (peak).
pub fn rss_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}
