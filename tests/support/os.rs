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

/// One HTTP/1.0 GET, as a probe or a scraper makes it: (status, body).
pub fn http_get(addr: &str, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(super::wait::WAIT)).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// Collects a child's stderr line by line as it runs (so a test can see what
/// it logs while idle): the lines so far, and the thread that reads them
/// (ends when the child closes stderr).
pub fn collect_stderr(
    child: &mut std::process::Child,
) -> (
    std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    std::thread::JoinHandle<()>,
) {
    use std::io::BufRead;
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let stderr = child.stderr.take().expect("stderr is piped");
    let sink = log.clone();
    let reader = std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            sink.lock().unwrap().push(line);
        }
    });
    (log, reader)
}
