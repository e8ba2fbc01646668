//! Name grammars shared by both binaries' command lines, kept below `cli`
//! and `plugin` so neither imports the other.

/// Accepts a label key prefix: a DNS subdomain (RFC 1123), at most 253 characters.
pub fn parse_namespace(s: &str) -> Result<String, String> {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if s.is_empty() || s.len() > 253 || !s.split('.').all(label_ok) {
        return Err(format!("{s:?} is not a DNS subdomain (lowercase letters, digits, '-' and '.', at most 253 characters)"));
    }
    Ok(s.to_string())
}
