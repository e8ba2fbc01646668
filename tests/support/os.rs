//! What tests ask of the operating system itself: a FIFO where a file is
//! expected (a reader must not block on it), and a free loopback port for a
//! server the test starts.

use std::path::Path;

/// Makes a FIFO at `path`, which nobody writes to.
pub fn make_fifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo has no other preconditions.
    assert_eq!(
        unsafe { libc::mkfifo(c.as_ptr(), 0o644) },
        0,
        "mkfifo {}",
        path.display()
    );
}

/// A loopback port nothing listens on now (the listener that found it is
/// closed on return), for a child process to bind.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// [`free_port`] as the `127.0.0.1:PORT` address flags take.
pub fn free_addr() -> String {
    format!("127.0.0.1:{}", free_port())
}
