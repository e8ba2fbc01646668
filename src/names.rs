//! Name grammars and value checks shared by every command line
//! (`nodefabric`'s, the device plugin's, the DRA driver's) and the CDI
//! code, kept below `cli`, `plugin` and `dra` so none imports another.

use std::time::Duration;

/// A duration flag clap refuses; the usage error prints this text alone, so
/// the parser's reason is part of it rather than a source.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DurationError {
    /// Not a duration humantime reads (`60s`, `5m`, `1h 30m`).
    #[error("{value:?}: {reason}")]
    Unparsable {
        /// The value as given.
        value: String,
        /// What humantime said.
        reason: humantime::DurationError,
    },
    /// A duration outside the flag's bounds.
    #[error("{value:?} is out of range: give {} to {}", humantime::format_duration(*min), humantime::format_duration(*max))]
    OutOfRange {
        /// The value as given.
        value: String,
        /// The shortest accepted.
        min: Duration,
        /// The longest accepted.
        max: Duration,
    },
}

/// A `--namespace` value that is not a DNS subdomain.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?} is not a DNS subdomain (lowercase letters, digits, '-' and '.', at most 253 characters)"
)]
pub struct NamespaceError(pub String);

/// A duration flag within `min..=max`: out-of-range values are usage errors
/// naming the bounds (a zero interval is a busy loop or a timer panic, a
/// century overflows the clock).
pub fn duration_in(s: &str, min: Duration, max: Duration) -> Result<Duration, DurationError> {
    let d = humantime::parse_duration(s).map_err(|reason| DurationError::Unparsable {
        value: s.to_string(),
        reason,
    })?;
    if d < min || d > max {
        return Err(DurationError::OutOfRange {
            value: s.to_string(),
            min,
            max,
        });
    }
    Ok(d)
}

/// The shortest `--api-timeout` any binary takes: below a second an API
/// server under load times out every request, and `0s` fails them all.
pub const API_TIMEOUT_MIN: Duration = Duration::from_secs(1);
/// The longest `--api-timeout`: past ten minutes a hung API server holds a
/// pass, a Prepare or a kubectl read for longer than anyone waits.
pub const API_TIMEOUT_MAX: Duration = Duration::from_secs(600);

/// Parses `--api-timeout`, the same flag of `nodefabric`, `kubectl
/// nodefabric` and `nodefabric-dra`: one grammar and one range
/// ([`API_TIMEOUT_MIN`] to [`API_TIMEOUT_MAX`]); each binary keeps its
/// own default.
pub fn parse_api_timeout(s: &str) -> Result<Duration, DurationError> {
    duration_in(s, API_TIMEOUT_MIN, API_TIMEOUT_MAX)
}

/// Accepts a label key prefix: a DNS subdomain (RFC 1123), at most 253 characters.
pub fn parse_namespace(s: &str) -> Result<String, NamespaceError> {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if s.is_empty() || s.len() > 253 || !s.split('.').all(label_ok) {
        return Err(NamespaceError(s.to_string()));
    }
    Ok(s.to_string())
}

/// A `--node-name` value that is not a Node's name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}: --node-name (or NODE_NAME) must be a Node's name")]
pub struct NodeNameError(NamespaceError);

/// Parses `--node-name` (or NODE_NAME) for every command line that takes
/// it: a Node's name is a DNS subdomain, and anything else (`a/b`,
/// `n1/../n1`) would reach the API as another path or object.
pub fn parse_node_name(s: &str) -> Result<String, NodeNameError> {
    parse_namespace(s).map_err(NodeNameError)
}

/// The longest DRA driver name the API server takes in a ResourceSlice or
/// a DeviceClass selector (`resource.k8s.io` `DriverNameMaxLength`).
pub const DRIVER_NAME_MAX: usize = 63;

/// A `--driver-name` value the API server would refuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?} is not a DRA driver name (a DNS subdomain of at most 63 characters: lowercase letters, digits, '-' and '.')"
)]
pub struct DriverNameError(pub String);

/// Accepts a DRA driver name as `resource.k8s.io/v1` validates one: a DNS
/// subdomain no longer than [`DRIVER_NAME_MAX`]. A longer name passes as a
/// label prefix but every ResourceSlice of it would be refused with 422.
pub fn parse_driver_name(s: &str) -> Result<String, DriverNameError> {
    match parse_namespace(s) {
        Ok(name) if name.len() <= DRIVER_NAME_MAX => Ok(name),
        _ => Err(DriverNameError(s.to_string())),
    }
}

/// True for a Kubernetes object UID as the API server makes them: an RFC
/// 4122 UUID in its 36-character text form (`8-4-4-4-12` hex digits). The
/// DRA driver names files after claim UIDs, so anything else (a `/`, `..`)
/// is refused before a path is built from it.
pub fn is_api_uid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
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
    use super::{
        is_api_uid, is_cdi_device_name, parse_api_timeout, parse_driver_name, DurationError,
        DRIVER_NAME_MAX,
    };
    use std::time::Duration;

    #[test]
    fn api_timeout_takes_one_second_to_ten_minutes_and_names_the_bounds() {
        assert_eq!(parse_api_timeout("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_api_timeout("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_api_timeout("10m"), Ok(Duration::from_secs(600)));
        for out in ["0s", "999ms", "10m 1s", "1h"] {
            let e = parse_api_timeout(out).unwrap_err();
            assert!(matches!(e, DurationError::OutOfRange { .. }), "{out}: {e}");
            assert!(e.to_string().ends_with("give 1s to 10m"), "{e}");
        }
        assert!(matches!(
            parse_api_timeout("soon"),
            Err(DurationError::Unparsable { .. })
        ));
    }

    #[test]
    fn a_claim_uid_that_would_climb_out_of_the_cdi_folder_is_not_an_api_uid() {
        for bad in [
            "x/../../victim",
            "../00000000-0000-4000-8000-000000000001",
            "00000000-0000-4000-8000-00000000000g",
            "00000000-0000-4000-8000-0000000000011",
            "00000000000040008000000000000001",
            "",
            "uid-of-nothing",
        ] {
            assert!(!is_api_uid(bad), "{bad:?}");
        }
        for good in [
            "00000000-0000-4000-8000-000000000001",
            "9B2E4F4C-1D2A-4C8E-9F3B-7A6D5C4B3A21",
        ] {
            assert!(is_api_uid(good), "{good:?}");
        }
    }

    #[test]
    fn a_driver_name_over_63_characters_is_refused_as_the_api_server_refuses_its_slices() {
        // 70 characters: a valid DNS subdomain, but resource.k8s.io's
        // validation refuses a driver name over 63 in every ResourceSlice.
        let long = format!("{}.example.com", "a".repeat(58));
        assert!(long.len() > DRIVER_NAME_MAX);
        let e = parse_driver_name(&long).unwrap_err();
        assert!(e.to_string().contains("at most 63"), "{e}");
        let longest = format!("{}.example.com", "a".repeat(51));
        assert_eq!(longest.len(), DRIVER_NAME_MAX);
        assert_eq!(parse_driver_name(&longest).unwrap(), longest);
        for bad in [
            "",
            "Rdma.example.com",
            "rdma_x.example.com",
            "-a.example.com",
        ] {
            assert!(parse_driver_name(bad).is_err(), "{bad:?}");
        }
        assert!(parse_driver_name("rdma.gpustack.ai").is_ok());
    }

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
