//! A minimal HTTP/1.1 client for the service's endpoint (one request per connection, as the
//! endpoint closes after each response).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Status line and body of `method path` with `body`.
pub fn request(addr: SocketAddr, method: &str, path: &str, body: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("write request");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read response");
    let (head, body) = text.split_once("\r\n\r\n").expect("response head");
    (
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    )
}

/// Status line and body of `GET path`.
pub fn get(addr: SocketAddr, path: &str) -> (String, String) {
    request(addr, "GET", path, "")
}

/// The status code of `GET path`, or `None` when no answer came within `timeout` (for
/// endpoints that may be down or slow; [`get`] panics instead).
pub fn status(addr: SocketAddr, path: &str, timeout: Duration) -> Option<u16> {
    let mut s = TcpStream::connect_timeout(&addr, timeout).ok()?;
    s.set_read_timeout(Some(timeout)).ok()?;
    s.set_write_timeout(Some(timeout)).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut head = [0u8; 12];
    s.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

/// Sum of the samples of metric `name` whose labels contain every `label="value"` of `with`.
pub fn sum(text: &str, name: &str, with: &[&str]) -> Option<f64> {
    let mut found = None;
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, value) = line.rsplit_once(' ')?;
        let metric = series.split('{').next().unwrap_or("");
        if metric == name && with.iter().all(|l| series.contains(l)) {
            *found.get_or_insert(0.0) += value.parse::<f64>().ok()?;
        }
    }
    found
}

/// GET `path`: the status code and the JSON body.
pub fn get_json(addr: SocketAddr, path: &str) -> (u16, serde_json::Value) {
    let (status, body) = get(addr, path);
    let code = status
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("status line {status:?}"));
    let json = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: body {body:?}: {e}"));
    (code, json)
}

/// GET `path` until it answers `want` (a runtime may still be assigning, applying, restoring or
/// rebalancing: 503 and 404-moved are retried, as a client would), for at most 60 s.
pub fn await_status(addr: SocketAddr, path: &str, want: u16) -> serde_json::Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (code, body) = get_json(addr, path);
        if code == want {
            return body;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{path}: {code} {body}, want {want}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
