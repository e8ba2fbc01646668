//! The NFD feature file: its text format and the rule for when to rewrite it.
//!
//! nfd-worker reads every file in `features.d/`; each line is `key=value`,
//! `#` starts a comment, and the comment `# +expiry-time=<RFC 3339>` is a
//! directive after which labels lapse unless the file is renewed.

use crate::labels::LabelSet;
use std::time::{Duration, SystemTime};

/// NFD ignores a feature file larger than this, so we refuse to write one.
pub const MAX_FEATURE_FILE: usize = 64 * 1024;

/// The file name this tool owns inside `features.d/`.
pub const FEATURE_FILE: &str = "nodefabric";

const HEADER: &str = "# Written by nodefabric; rewritten on every change, do not edit.\n";
const EXPIRY: &str = "# +expiry-time=";

/// The label lines, `namespace/key=value`, one per line, sorted by key.
pub fn label_lines(labels: &LabelSet, namespace: &str) -> String {
    labels
        .values
        .iter()
        .map(|(k, v)| format!("{namespace}/{k}={v}\n"))
        .collect()
}

/// A feature file NFD would ignore for its size.
#[derive(Debug, thiserror::Error)]
#[error("feature file would be {0} bytes, over NFD's {max}-byte limit (nfd-worker would ignore it)", max = MAX_FEATURE_FILE)]
pub struct TooLarge(pub usize);

/// The last time RFC 3339 (and so the expiry directive) can write:
/// 9999-12-31T23:59:59Z.
const LAST_WRITABLE: Duration = Duration::from_secs(253_402_300_799);

/// An expiry time past what the directive can write.
#[derive(Debug, thiserror::Error)]
#[error("--expiry {} from {} lies past 9999-12-31T23:59:59Z, the last time the expiry directive can write", humantime::format_duration(*ttl), humantime::format_rfc3339_seconds(*now))]
pub struct ExpiryTooLate {
    /// The time of the pass.
    pub now: SystemTime,
    /// The lifetime asked for.
    pub ttl: Duration,
}

/// When labels written at `now` with lifetime `ttl` lapse; a time the
/// directive cannot write is an error rather than a panic in [`render`].
pub fn expiry_at(now: SystemTime, ttl: Duration) -> Result<SystemTime, ExpiryTooLate> {
    now.checked_add(ttl)
        .filter(|t| *t <= SystemTime::UNIX_EPOCH + LAST_WRITABLE)
        .ok_or(ExpiryTooLate { now, ttl })
}

/// The whole file, refused when NFD would ignore it for its size.
pub fn render_checked(
    labels: &LabelSet,
    namespace: &str,
    expiry: Option<SystemTime>,
) -> Result<String, TooLarge> {
    let text = render(labels, namespace, expiry);
    if text.len() > MAX_FEATURE_FILE {
        return Err(TooLarge(text.len()));
    }
    Ok(text)
}

/// The whole file: header, optional expiry directive (a time from
/// [`expiry_at`]), label lines.
pub fn render(labels: &LabelSet, namespace: &str, expiry: Option<SystemTime>) -> String {
    let mut out = String::from(HEADER);
    if let Some(t) = expiry {
        out.push_str(EXPIRY);
        out.push_str(&humantime::format_rfc3339_seconds(t).to_string());
        out.push('\n');
    }
    out.push_str(&label_lines(labels, namespace));
    out
}

/// Splits an existing file into its expiry time (if any) and its other lines,
/// so two files can be compared without the time stamp.
fn parse_existing(text: &str) -> (Option<SystemTime>, String) {
    let mut expiry = None;
    let mut body = String::new();
    for line in text.lines() {
        if let Some(t) = line.strip_prefix(EXPIRY) {
            expiry = humantime::parse_rfc3339(t.trim()).ok();
        } else {
            body.push_str(line);
            body.push('\n');
        }
    }
    (expiry, body)
}

/// Decides whether a new file must replace the existing one: when the labels
/// differ, when expiry was added or removed, when the old expiry has less
/// than half its lifetime left (so the labels never lapse while we run), or
/// when it lies further ahead than a whole lifetime: the wall clock stepped
/// back, and without a rewrite the labels would outlive a dead publisher by
/// the size of that step.
pub fn needs_rewrite(
    existing: Option<&str>,
    new: &str,
    now: SystemTime,
    ttl: Option<Duration>,
) -> bool {
    let Some(existing) = existing else {
        return true;
    };
    let (old_expiry, old_body) = parse_existing(existing);
    let (_, new_body) = parse_existing(new);
    if old_body != new_body {
        return true;
    }
    match (old_expiry, ttl) {
        (None, None) => false,
        (Some(_), None) | (None, Some(_)) => true,
        (Some(old), Some(ttl)) => old
            .duration_since(now)
            .map_or(true, |left| left < ttl / 2 || left > ttl),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(pairs: &[(&str, &str)]) -> LabelSet {
        LabelSet {
            values: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            withheld: vec![],
        }
    }

    #[test]
    fn oversized_file_is_refused() {
        let mut big = LabelSet::default();
        for i in 0..2000 {
            big.values.insert(format!("fabric.k{i:05}"), "v".repeat(40));
        }
        let err = render_checked(&big, "feature.gpustack.ai", None).unwrap_err();
        assert!(err.0 > MAX_FEATURE_FILE);
        assert!(render_checked(&set(&[("a", "b")]), "ns", None).is_ok());
    }

    #[test]
    fn an_expiry_past_year_9999_is_an_error_not_a_panic() {
        let now = humantime::parse_rfc3339("9999-12-31T00:00:00Z").unwrap();
        let err = expiry_at(now, Duration::from_secs(48 * 3600)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--expiry 2days from 9999-12-31T00:00:00Z lies past 9999-12-31T23:59:59Z, the last time the expiry directive can write"
        );
        let last = expiry_at(now, Duration::from_secs(86399)).unwrap();
        assert!(render(&set(&[]), "ns", Some(last)).contains("9999-12-31T23:59:59Z"));
    }

    #[test]
    fn renewal_only_when_due() {
        let now = humantime::parse_rfc3339("2026-01-01T00:00:00Z").unwrap();
        let ttl = Duration::from_secs(180);
        let l = set(&[("rdma.capable", "true")]);
        let old = render(&l, "ns", Some(now + ttl));
        // a pass 30 s later: same labels, plenty of time left → no rewrite
        let later = now + Duration::from_secs(30);
        assert!(!needs_rewrite(
            Some(&old),
            &render(&l, "ns", Some(later + ttl)),
            later,
            Some(ttl)
        ));
        // 100 s later: under half the lifetime left → renew
        let late = now + Duration::from_secs(100);
        assert!(needs_rewrite(
            Some(&old),
            &render(&l, "ns", Some(late + ttl)),
            late,
            Some(ttl)
        ));
        // a label change always rewrites
        let l2 = set(&[]);
        assert!(needs_rewrite(
            Some(&old),
            &render(&l2, "ns", Some(later + ttl)),
            later,
            Some(ttl)
        ));
        // the clock stepped back an hour: the old expiry is too far ahead
        let earlier = now - Duration::from_secs(3600);
        assert!(needs_rewrite(
            Some(&old),
            &render(&l, "ns", Some(earlier + ttl)),
            earlier,
            Some(ttl)
        ));
        // no expiry either side, same labels → nothing to do
        assert!(!needs_rewrite(
            Some(&render(&l, "ns", None)),
            &render(&l, "ns", None),
            now,
            None
        ));
    }
}
