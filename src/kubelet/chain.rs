//! One line for an error and every cause under it: what a plugin logs when
//! it stops, and what a failed connection reports (a transport's own
//! message, "transport error", does not say why).

/// `e` and each error under it, `outer: cause: …`, as an error chain prints
/// them.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        next = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn every_cause_is_joined_after_the_outer_message() {
        let e = Outer(std::io::Error::other("inner"));
        assert_eq!(error_chain(&e), "outer: inner");
        assert_eq!(error_chain(&std::io::Error::other("alone")), "alone");
    }
}
