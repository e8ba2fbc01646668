//! How much a replay may unpack: the caps, their defaults and the parsers of
//! `--replay-max-entries` and `--replay-max-bytes`.

/// Default for `--replay-max-entries`: a capture holds about 22 entries per
/// network interface (its folder, links and attributes, and its PCI
/// function's), so a 10k-interface node's is about 220,000 entries; a
/// million replays that with room to spare, while still stopping an archive
/// that would fill the temp folder's inodes.
pub const DEFAULT_MAX_ENTRIES: u64 = 1_000_000;

/// Default for `--replay-max-bytes`: captures are attributes of a page or
/// less each, so a real one is a few MiB at most.
pub const DEFAULT_MAX_BYTES: u64 = 256 * MIB;

/// What a capture of `entries` entries whose sizes add up to `bytes` needs
/// beyond the default caps, for a warning at capture time: the flags (with
/// values) its replay must be given, or `None` when the defaults take it.
pub fn beyond_defaults(entries: u64, bytes: u64) -> Option<String> {
    let mut flags = Vec::new();
    if entries > DEFAULT_MAX_ENTRIES {
        flags.push(format!("--replay-max-entries {entries}"));
    }
    if bytes > DEFAULT_MAX_BYTES {
        flags.push(format!("--replay-max-bytes {}KiB", bytes.div_ceil(KIB)));
    }
    (!flags.is_empty()).then(|| flags.join(" "))
}

/// The most header bytes (long names, pax records) one entry may carry: the
/// tar reader buffers them whole, so without a bound a tiny archive could
/// make it allocate gigabytes before any cap is checked.
pub const MAX_HEADER_BYTES: u64 = 64 * KIB;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const GIB: u64 = 1024 * MIB;

/// The range `--replay-max-entries` accepts.
const ENTRIES_RANGE: std::ops::RangeInclusive<u64> = 1..=10_000_000;

/// The range `--replay-max-bytes` accepts.
const BYTES_RANGE: std::ops::RangeInclusive<u64> = KIB..=64 * GIB;

/// How much of an archive a replay may unpack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The most entries (folders, files, links).
    pub max_entries: u64,
    /// The most bytes, summed over every entry's size.
    pub max_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_entries: DEFAULT_MAX_ENTRIES,
            max_bytes: DEFAULT_MAX_BYTES,
        }
    }
}

/// A `--replay-max-entries` or `--replay-max-bytes` value clap refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// Not a whole number of `what` (entries, bytes).
    #[error("{value:?} is not a whole number of {what}")]
    NotANumber {
        /// The value as given.
        value: String,
        /// What it counts.
        what: &'static str,
    },
    /// A size with a unit other than B, KiB, MiB or GiB.
    #[error("{0:?}: expected a number of bytes with an optional unit B, KiB, MiB or GiB")]
    Unit(String),
    /// A size past `u64` once scaled by its unit.
    #[error("{0:?} is too large")]
    TooLarge(String),
    /// A number outside the flag's range.
    #[error("{n} {what} is out of range ({spelled})")]
    OutOfRange {
        /// The number (a size in bytes once scaled).
        n: u64,
        /// What it counts.
        what: &'static str,
        /// The range as a user writes it.
        spelled: &'static str,
    },
}

/// Parses `--replay-max-entries`: a whole number from 1 to 10,000,000.
pub fn parse_max_entries(s: &str) -> Result<u64, LimitError> {
    let n: u64 = s.trim().parse().map_err(|_| LimitError::NotANumber {
        value: s.to_string(),
        what: "entries",
    })?;
    in_range(n, &ENTRIES_RANGE, "entries", "1 to 10000000")
}

/// Parses `--replay-max-bytes`: a whole number of bytes, optionally with a
/// binary unit (`B`, `KiB`, `MiB`, `GiB`), from 1 KiB to 64 GiB.
pub fn parse_max_bytes(s: &str) -> Result<u64, LimitError> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let scale = match unit.trim() {
        "" | "B" => 1,
        "KiB" => KIB,
        "MiB" => MIB,
        "GiB" => GIB,
        _ => return Err(LimitError::Unit(s.to_string())),
    };
    let n: u64 = digits.parse().map_err(|_| LimitError::NotANumber {
        value: s.to_string(),
        what: "bytes",
    })?;
    let bytes = n
        .checked_mul(scale)
        .ok_or_else(|| LimitError::TooLarge(s.to_string()))?;
    in_range(bytes, &BYTES_RANGE, "bytes", "1KiB to 64GiB")
}

/// Keeps `n` when `range` holds it; `spelled` is the range as a user writes it.
fn in_range(
    n: u64,
    range: &std::ops::RangeInclusive<u64>,
    what: &'static str,
    spelled: &'static str,
) -> Result<u64, LimitError> {
    if range.contains(&n) {
        Ok(n)
    } else {
        Err(LimitError::OutOfRange { n, what, spelled })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_help_default_for_max_bytes_is_the_cap_the_code_uses() {
        // cli.rs spells the default as text for --help; it must mean this.
        assert_eq!(parse_max_bytes("256MiB"), Ok(DEFAULT_MAX_BYTES));
    }

    #[test]
    fn a_capture_over_the_default_caps_names_the_flags_its_replay_needs() {
        assert_eq!(
            beyond_defaults(DEFAULT_MAX_ENTRIES, DEFAULT_MAX_BYTES),
            None
        );
        assert_eq!(
            beyond_defaults(DEFAULT_MAX_ENTRIES + 1, 10),
            Some("--replay-max-entries 1000001".into())
        );
        let both = beyond_defaults(2_000_000, DEFAULT_MAX_BYTES + 1).unwrap();
        assert_eq!(
            both,
            "--replay-max-entries 2000000 --replay-max-bytes 262145KiB"
        );
        // The values it names are ones the flags accept, and they admit it.
        assert_eq!(parse_max_bytes("262145KiB"), Ok(262_145 * KIB));
        assert_eq!(parse_max_entries("2000000"), Ok(2_000_000));
    }

    #[test]
    fn byte_sizes_take_binary_units() {
        assert_eq!(parse_max_bytes("4096"), Ok(4096));
        assert_eq!(parse_max_bytes("2 KiB"), Ok(2048));
        assert_eq!(parse_max_bytes("1GiB"), Ok(GIB));
    }

    #[test]
    fn zero_negative_overflowing_and_unknown_sizes_are_refused() {
        for bad in [
            "0",
            "-1",
            "12",
            "65GiB",
            "99999999999999999999",
            "18446744073709551615GiB",
            "1MB",
            "1.5MiB",
            "MiB",
            "",
        ] {
            assert!(parse_max_bytes(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn zero_and_absurd_entry_counts_are_refused() {
        assert_eq!(parse_max_entries("1000000"), Ok(DEFAULT_MAX_ENTRIES));
        for bad in ["0", "-5", "10000001", "1e5", "many"] {
            assert!(parse_max_entries(bad).is_err(), "{bad:?} accepted");
        }
    }
}
