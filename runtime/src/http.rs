//! The HTTP endpoint on `metrics.addr`: `/metrics` (Prometheus text format), `/health`, `/ready`.
//!
//! A small blocking server on one thread: scrapes and probes are rare and tiny, so connections are
//! served one at a time, each bounded by `IO_TIMEOUT` (2 s) so a stalled client cannot hold the others
//! back for long. It binds before the runtime connects to Kafka, so probes answer during start-up
//! (`/health` 200, `/ready` 503). Dropping the [`HttpServer`] stops it and frees the port.

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;

use crate::health::Health;

/// Bound on reading a request and writing its response.
const IO_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest request head accepted.
const MAX_HEAD: usize = 8 << 10;
/// Content type of the Prometheus text exposition format.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Why the endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The address could not be bound.
    #[error("cannot listen on metrics.addr {addr}: {source} (choose another port, port 0 for any free one, or metrics.addr=off)")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The server thread could not start.
    #[error("cannot start the HTTP thread: {0}")]
    Thread(std::io::Error),
}

/// A running endpoint; dropping it stops the server.
pub struct HttpServer {
    addr: SocketAddr,
    /// Set by `drop`; the accept loop checks it after every connection.
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl HttpServer {
    /// Binds `addr` (port 0 picks a free port) and serves `metrics` and `health` on a thread.
    pub fn start(
        addr: SocketAddr,
        metrics: PrometheusHandle,
        health: Arc<Health>,
    ) -> Result<Self, HttpError> {
        let listener =
            TcpListener::bind(addr).map_err(|source| HttpError::Bind { addr, source })?;
        let bound = listener
            .local_addr()
            .map_err(|source| HttpError::Bind { addr, source })?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("rill-http".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if stop2.load(Ordering::SeqCst) {
                        break;
                    }
                    if let Ok(stream) = conn {
                        if let Err(e) = serve(stream, &metrics, &health) {
                            tracing::debug!(error = %e, "HTTP request failed");
                        }
                    }
                }
            })
            .map_err(HttpError::Thread)?;
        Ok(HttpServer {
            addr: bound,
            stop,
            thread: Some(thread),
        })
    }

    /// The address actually bound (the chosen port when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept with a connection of our own.
        let mut wake = self.addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(match wake.ip() {
                IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
            });
        }
        if TcpStream::connect_timeout(&wake, IO_TIMEOUT).is_ok() {
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
        // Otherwise the thread stays blocked in accept; it exits at the next connection.
    }
}

/// Reads one request and answers it.
fn serve(stream: TcpStream, metrics: &PrometheusHandle, health: &Health) -> std::io::Result<()> {
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    // Consume the headers (to the blank line) so the client sees an orderly close.
    let mut head = request_line.len();
    loop {
        let mut line = String::new();
        let n = reader.read_line(&mut line)?;
        head += n;
        if n == 0 || line == "\r\n" || line == "\n" || head > MAX_HEAD {
            break;
        }
    }
    let mut parts = request_line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (status, content_type, body) = match (method, path) {
        ("GET" | "HEAD", "/metrics") => ("200 OK", PROMETHEUS_TEXT, metrics.render()),
        ("GET" | "HEAD", "/health") => probe(health.is_live(), "live", "failed"),
        ("GET" | "HEAD", "/ready") => probe(health.is_ready(), "ready", "not ready"),
        ("GET" | "HEAD", _) => (
            "404 Not Found",
            "text/plain",
            "not found: try /metrics, /health or /ready\n".into(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "only GET and HEAD\n".into(),
        ),
    };
    let mut out = stream;
    write!(
        out,
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    if method != "HEAD" {
        out.write_all(body.as_bytes())?;
    }
    out.flush()
}

fn probe(ok: bool, yes: &str, no: &str) -> (&'static str, &'static str, String) {
    if ok {
        ("200 OK", "text/plain", format!("{yes}\n"))
    } else {
        ("503 Service Unavailable", "text/plain", format!("{no}\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn get(addr: SocketAddr, path: &str) -> (String, String) {
        let mut s = TcpStream::connect(addr).expect("connect");
        write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").expect("write");
        let mut text = String::new();
        s.read_to_string(&mut text).expect("read");
        let (head, body) = text.split_once("\r\n\r\n").expect("a head");
        (
            head.lines().next().unwrap_or("").to_string(),
            body.to_string(),
        )
    }

    #[test]
    fn serves_probes_metrics_and_404_on_a_free_port() {
        let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
            .build_recorder()
            .handle();
        let health = Arc::new(Health::new());
        let server =
            HttpServer::start("127.0.0.1:0".parse().unwrap(), handle, health.clone()).unwrap();
        let addr = server.local_addr();
        assert_ne!(addr.port(), 0, "port 0 resolves to the bound port");
        assert_eq!(get(addr, "/health").0, "HTTP/1.1 200 OK");
        assert_eq!(get(addr, "/ready").0, "HTTP/1.1 503 Service Unavailable");
        health.set_assigned();
        assert_eq!(get(addr, "/ready").0, "HTTP/1.1 200 OK");
        assert_eq!(get(addr, "/metrics").0, "HTTP/1.1 200 OK");
        assert_eq!(get(addr, "/nope").0, "HTTP/1.1 404 Not Found");
        health.set_failed();
        assert_eq!(get(addr, "/health").0, "HTTP/1.1 503 Service Unavailable");
        drop(server);
        assert!(
            TcpStream::connect(addr).is_err(),
            "dropping the server frees the port"
        );
    }

    #[test]
    fn a_taken_port_is_an_error_naming_the_address() {
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
            .build_recorder()
            .handle();
        let err = HttpServer::start(addr, handle, Arc::new(Health::new()))
            .err()
            .expect("bind fails");
        assert!(err.to_string().contains(&addr.to_string()), "{err}");
    }
}
