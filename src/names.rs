//! Name grammars and value checks shared by both binaries' command lines,
//! kept below `cli` and `plugin` so neither imports the other.

use std::time::Duration;

/// A duration flag within `min..=max`: out-of-range values are usage errors
/// naming the bounds (a zero interval is a busy loop or a timer panic, a
/// century overflows the clock).
pub fn duration_in(s: &str, min: Duration, max: Duration) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{s:?}: {e}"))?;
    if d < min || d > max {
        return Err(format!(
            "{s:?} is out of range: give {} to {}",
            humantime::format_duration(min),
            humantime::format_duration(max)
        ));
    }
    Ok(d)
}

/// Accepts a label key prefix: a DNS subdomain (RFC 1123), at most 253 characters.
pub fn parse_namespace(s: &str) -> Result<String, String> {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if s.is_empty() || s.len() > 253 || !s.split('.').all(label_ok) {
        return Err(format!("{s:?} is not a DNS subdomain (lowercase letters, digits, '-' and '.', at most 253 characters)"));
    }
    Ok(s.to_string())
}

/// True for a CDI device name (what follows `kind=`): letters, digits and
/// `_ - . :`, starting and ending with a letter or digit. The plugin skips
/// any other name, since `,` or `=` in one would smuggle more devices into a
/// `cdi.k8s.io/` annotation.
pub fn is_cdi_device_name(name: &str) -> bool {
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '-');
    name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
        && name.chars().all(ok)
}

#[cfg(test)]
mod tests {
    use super::is_cdi_device_name;

    #[test]
    fn separators_that_would_name_other_devices_are_refused() {
        for bad in [
            "mlx5_0,nvidia.com/gpu=all",
            "a=b",
            "",
            "-a",
            "a-",
            "a b",
            "a/b",
            "é",
        ] {
            assert!(!is_cdi_device_name(bad), "{bad:?}");
        }
        for good in ["mlx5_0", "a", "0", "roce.p1:0", "a-b_c"] {
            assert!(is_cdi_device_name(good), "{good:?}");
        }
    }
}
