//! stderr logging for every binary (stdout carries only command output).

/// Installs the `tracing` subscriber: plain text on stderr, colours only on a terminal.
pub fn init(level: tracing::Level) {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(level)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}
