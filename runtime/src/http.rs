//! The HTTP endpoint on `metrics.addr`: `/metrics` (Prometheus text format), `/health`, `/ready`.
//!
//! An axum [`Router`] served on the service's control runtime ([`crate::control`]), so that one
//! slow or idle client never holds up another: every connection is its own task. Connections are
//! kept alive (queries, forwards between instances and Prometheus reuse theirs): an idle one is
//! closed after [`HEADER_TIMEOUT`] without a request, and one whose exchange stalls (a request
//! that does not answer, a client that does not read) after [`CONNECTION_TIMEOUT`] without a new
//! request. A client that sends `Connection: close` gets one response, as before.
//! `HEAD` answers from the same routes without rendering a body. The server binds before the
//! runtime connects to Kafka, so probes answer during start-up (`/health` 200, `/ready` 503).
//! Dropping the [`HttpServer`] closes the listener and every open connection, freeing the port.
//!
//! More routes (admin calls, interactive queries) join by merging their router into [`routes`]
//! before [`HttpServer::start`].

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{header, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::sync::watch;

use crate::health::Health;

/// Time a client has to send its request head after connecting, or after the previous answer
/// (hyper's header timer also runs while a kept-alive connection is idle).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(2);
/// Bound on one exchange, request and response included (a scrape renders in milliseconds): a
/// connection that starts no new request for this long is closed.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);
/// The same bound once the connection has carried an admin call: such a call answers once its
/// work is done or its own timeout passed (at most [`crate::elastic::MAX_FACTOR_TIMEOUT`]), so
/// the connection must outlive that.
pub const ADMIN_CONNECTION_TIMEOUT: Duration = Duration::from_secs(310);
/// Connections the kernel may queue before the accept loop takes them (capped by
/// `net.core.somaxconn`).
const LISTEN_BACKLOG: u32 = 4096;
/// How long `drop` waits for the listener to close.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);
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
    /// The tokio runtime that serves HTTP and signals could not start.
    #[error("cannot start the runtime that serves HTTP and signals: {0}")]
    Runtime(std::io::Error),
}

/// What the probe and metrics handlers read.
#[derive(Clone)]
struct Probes {
    metrics: PrometheusHandle,
    health: Arc<Health>,
}

/// The routes of the endpoint: `/metrics`, `/health`, `/ready`, and a 404 naming them.
pub fn routes(metrics: PrometheusHandle, health: Arc<Health>) -> Router {
    Router::new()
        .route("/metrics", get(metrics_text))
        .route("/health", get(live))
        .route("/ready", get(ready))
        .fallback(not_found)
        .with_state(Probes { metrics, health })
}

async fn metrics_text(method: Method, State(p): State<Probes>) -> Response {
    let head = [(header::CONTENT_TYPE, PROMETHEUS_TEXT)];
    if method == Method::HEAD {
        return (StatusCode::OK, head).into_response();
    }
    // Rendering takes milliseconds with thousands of series: off the async workers.
    match tokio::task::spawn_blocking(move || p.metrics.render()).await {
        Ok(body) => (StatusCode::OK, head, body).into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("render failed: {e}\n"),
        )
            .into_response(),
    }
}

async fn live(State(p): State<Probes>) -> Response {
    probe(p.health.is_live(), "live", "failed")
}

async fn ready(State(p): State<Probes>) -> Response {
    probe(p.health.is_ready(), "ready", "not ready")
}

async fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        "not found: try /metrics, /health or /ready\n",
    )
        .into_response()
}

/// The route `GET /topology[?format=text|dot|mermaid]`: the topology in Kafka Streams' text
/// format (the default), as a Graphviz DOT digraph or as a Mermaid flowchart, with internal
/// topics named for `application_id` in the graphs (see [`rill_topology::describe`]). An unknown
/// format is a 400 naming the known ones. Rendered once here: the topology never changes.
pub fn topology_routes(topology: &rill_topology::Topology, application_id: &str) -> Router {
    use rill_topology::DescribeFormat;
    let rendered: Arc<Vec<(DescribeFormat, String)>> = Arc::new(
        DescribeFormat::ALL
            .into_iter()
            .map(|f| (f, topology.describe_as(f, Some(application_id))))
            .collect(),
    );
    let handler = move |axum::extract::RawQuery(query): axum::extract::RawQuery| {
        let rendered = rendered.clone();
        async move {
            let asked = query
                .as_deref()
                .unwrap_or("")
                .split('&')
                .filter_map(|pair| pair.strip_prefix("format="))
                .next_back()
                .unwrap_or("text");
            let found = asked
                .parse::<DescribeFormat>()
                .ok()
                .and_then(|f| rendered.iter().find(|(g, _)| *g == f));
            match found {
                Some((format, body)) => (
                    StatusCode::OK,
                    [(header::CONTENT_TYPE, format.content_type())],
                    body.clone(),
                )
                    .into_response(),
                None => (
                    StatusCode::BAD_REQUEST,
                    format!(
                        "unknown topology format `{asked}`: use ?format=text (the default), \
                         ?format=dot or ?format=mermaid\n"
                    ),
                )
                    .into_response(),
            }
        }
    };
    Router::new().route("/topology", get(handler))
}

fn probe(ok: bool, yes: &'static str, no: &'static str) -> Response {
    if ok {
        (StatusCode::OK, format!("{yes}\n")).into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, format!("{no}\n")).into_response()
    }
}

/// A running endpoint; dropping it stops the server.
pub struct HttpServer {
    addr: SocketAddr,
    /// Tells the accept loop and every connection to stop.
    stop: watch::Sender<bool>,
    /// Disconnects when the accept loop has dropped the listener.
    closed: mpsc::Receiver<()>,
}

impl HttpServer {
    /// Binds `addr` (port 0 picks a free port) and serves `router` on `runtime`.
    pub fn start(
        addr: SocketAddr,
        runtime: &tokio::runtime::Handle,
        router: Router,
    ) -> Result<Self, HttpError> {
        let bind = |source| HttpError::Bind { addr, source };
        let listener = {
            let _enter = runtime.enter();
            let socket = if addr.is_ipv4() {
                tokio::net::TcpSocket::new_v4()
            } else {
                tokio::net::TcpSocket::new_v6()
            }
            .map_err(bind)?;
            // As std's bind does; a port in TIME_WAIT can be reused, a listening one cannot.
            socket.set_reuseaddr(true).map_err(bind)?;
            socket.bind(addr).map_err(bind)?;
            // A flood of clients reconnecting at once must not overflow the accept queue: a
            // dropped SYN is retried only after 1 s, which would delay a probe that long.
            socket.listen(LISTEN_BACKLOG).map_err(bind)?
        };
        let bound = listener.local_addr().map_err(bind)?;
        let (stop, stopped) = watch::channel(false);
        let (closed_tx, closed) = mpsc::channel::<()>();
        runtime.spawn(async move {
            // Dropped with the listener, when the loop ends: `drop` waits for that.
            let _closed = closed_tx;
            accept_loop(listener, router, stopped).await;
        });
        Ok(HttpServer {
            addr: bound,
            stop,
            closed,
        })
    }

    /// The address actually bound (the chosen port when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        // Returns once the loop dropped the listener (the sender disconnects), so the port is free.
        let _ = self.closed.recv_timeout(CLOSE_TIMEOUT);
    }
}

/// Accepts connections until `stop`, each served on a task of its own.
async fn accept_loop(
    listener: tokio::net::TcpListener,
    router: Router,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Per-connection failures (a reset before accept, out of descriptors):
                    // back off briefly rather than spin.
                    tracing::debug!(error = %e, "HTTP accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        // Written by the middleware at each request's start, read by the stall bound below
        // (Relaxed: each is a lone value, read only to pick a deadline).
        let admin = Arc::new(AtomicBool::new(false));
        let born = Instant::now();
        let last_start_ms = Arc::new(AtomicU64::new(0));
        let (flag, last) = (admin.clone(), last_start_ms.clone());
        let router = router.clone().layer(axum::middleware::from_fn(
            move |req: axum::extract::Request, next: axum::middleware::Next| {
                last.store(born.elapsed().as_millis() as u64, Ordering::Relaxed);
                if req.uri().path().starts_with("/admin/") {
                    flag.store(true, Ordering::Relaxed);
                }
                next.run(req)
            },
        ));
        let service = TowerToHyperService::new(router);
        let mut stop = stop.clone();
        tokio::spawn(async move {
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .keep_alive(true);
            let mut conn = Box::pin(http.serve_connection(TokioIo::new(stream), service));
            // Each exchange is bounded from its request's start (the connection's, before
            // the first); a kept-alive connection lives on as long as new requests come.
            let served = async {
                loop {
                    let bound = if admin.load(Ordering::Relaxed) {
                        ADMIN_CONNECTION_TIMEOUT
                    } else {
                        CONNECTION_TIMEOUT
                    };
                    let started =
                        born + Duration::from_millis(last_start_ms.load(Ordering::Relaxed));
                    let deadline = started + bound;
                    if deadline <= Instant::now() {
                        return Ok(());
                    }
                    if let Ok(done) = tokio::time::timeout_at(deadline.into(), &mut conn).await {
                        return done;
                    }
                }
            };
            tokio::select! {
                served = served => {
                    if let Err(e) = served {
                        tracing::debug!(error = %e, "HTTP connection failed");
                    }
                }
                _ = stop.changed() => {}
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::time::Instant;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime")
    }

    fn request(addr: SocketAddr, method: &str, path: &str) -> (String, String) {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .expect("write");
        let mut text = String::new();
        s.read_to_string(&mut text).expect("read");
        let (head, body) = text.split_once("\r\n\r\n").expect("a head");
        (head.to_string(), body.to_string())
    }

    fn status(addr: SocketAddr, path: &str) -> String {
        let (head, _) = request(addr, "GET", path);
        head.lines().next().unwrap_or("").to_string()
    }

    fn server(rt: &tokio::runtime::Runtime, health: Arc<Health>) -> HttpServer {
        let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
            .build_recorder()
            .handle();
        HttpServer::start(
            "127.0.0.1:0".parse().unwrap(),
            rt.handle(),
            routes(handle, health),
        )
        .unwrap()
    }

    #[test]
    fn serves_probes_metrics_and_404_on_a_free_port() {
        let rt = runtime();
        let health = Arc::new(Health::new());
        let server = server(&rt, health.clone());
        let addr = server.local_addr();
        assert_ne!(addr.port(), 0, "port 0 resolves to the bound port");
        assert_eq!(status(addr, "/health"), "HTTP/1.1 200 OK");
        assert_eq!(status(addr, "/ready"), "HTTP/1.1 503 Service Unavailable");
        health.set_assigned();
        assert_eq!(status(addr, "/ready"), "HTTP/1.1 200 OK");
        let (head, _) = request(addr, "GET", "/metrics");
        assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
        assert!(head.contains(PROMETHEUS_TEXT), "{head}");
        assert_eq!(status(addr, "/nope"), "HTTP/1.1 404 Not Found");
        health.set_failed();
        assert_eq!(status(addr, "/health"), "HTTP/1.1 503 Service Unavailable");
        drop(server);
        assert!(
            TcpStream::connect(addr).is_err(),
            "dropping the server frees the port"
        );
    }

    #[test]
    fn head_answers_without_a_body() {
        let rt = runtime();
        let server = server(&rt, Arc::new(Health::new()));
        let (head, body) = request(server.local_addr(), "HEAD", "/metrics");
        assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
        assert!(head.contains(PROMETHEUS_TEXT), "{head}");
        assert_eq!(body, "");
        let (head, body) = request(server.local_addr(), "HEAD", "/health");
        assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
        assert_eq!(body, "");
    }

    /// Fifty clients that connect and send nothing must not delay a probe (Kubernetes gives a
    /// probe 1 s), nor keep the server from stopping and freeing its port.
    #[test]
    fn idle_clients_neither_delay_probes_nor_hold_the_port() {
        let rt = runtime();
        let server = server(&rt, Arc::new(Health::new()));
        let addr = server.local_addr();
        let idle: Vec<TcpStream> = (0..50)
            .map(|_| TcpStream::connect(addr).expect("idle connect"))
            .collect();
        let start = Instant::now();
        assert_eq!(status(addr, "/health"), "HTTP/1.1 200 OK");
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "/health took {:?} behind 50 idle clients",
            start.elapsed()
        );
        let start = Instant::now();
        drop(server);
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "{:?}",
            start.elapsed()
        );
        assert!(TcpStream::connect(addr).is_err(), "the port is free");
        // The idle connections were closed too: a read sees the end of the stream.
        let mut first = &idle[0];
        first
            .set_read_timeout(Some(Duration::from_secs(2)))
            .expect("timeout");
        let mut buf = [0u8; 1];
        assert_eq!(first.read(&mut buf).expect("closed, not timed out"), 0);
    }

    #[test]
    fn a_client_that_never_sends_its_request_is_cut_off() {
        let rt = runtime();
        let server = server(&rt, Arc::new(Health::new()));
        let mut idle = TcpStream::connect(server.local_addr()).expect("connect");
        idle.set_read_timeout(Some(HEADER_TIMEOUT * 3))
            .expect("timeout");
        let start = Instant::now();
        let mut buf = Vec::new();
        let _ = idle.read_to_end(&mut buf);
        assert!(
            start.elapsed() < HEADER_TIMEOUT * 2,
            "closed after {:?}",
            start.elapsed()
        );
    }

    /// An admin call answers when its work is done, which may take longer than a scrape may:
    /// its connection outlives [`CONNECTION_TIMEOUT`]; any other request's does not.
    #[test]
    fn an_admin_call_may_answer_after_the_connection_timeout_and_nothing_else() {
        let rt = runtime();
        let slow = || async {
            tokio::time::sleep(CONNECTION_TIMEOUT + Duration::from_secs(1)).await;
            "done"
        };
        let router = Router::new()
            .route("/admin/slow", get(slow))
            .route("/slow", get(slow));
        let server =
            HttpServer::start("127.0.0.1:0".parse().unwrap(), rt.handle(), router).unwrap();
        let addr = server.local_addr();
        let call = |path: &'static str| {
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(addr).expect("connect");
                s.set_read_timeout(Some(CONNECTION_TIMEOUT * 2))
                    .expect("timeout");
                write!(
                    s,
                    "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                )
                .expect("write");
                let mut text = String::new();
                let _ = s.read_to_string(&mut text);
                text
            })
        };
        let (admin, other) = (call("/admin/slow"), call("/slow"));
        let admin = admin.join().expect("admin call");
        assert!(
            admin.starts_with("HTTP/1.1 200 OK") && admin.ends_with("done"),
            "{admin:?}"
        );
        assert_eq!(
            other.join().expect("other call"),
            "",
            "cut off without an answer"
        );
    }

    /// Reads one answer (head and `Content-Length` body) from a kept-alive connection.
    fn answer(s: &mut TcpStream) -> (String, String) {
        let mut raw = Vec::new();
        let mut byte = [0u8; 1];
        while !raw.ends_with(b"\r\n\r\n") {
            assert_eq!(s.read(&mut byte).expect("read head"), 1, "closed mid-head");
            raw.push(byte[0]);
        }
        let head = String::from_utf8(raw).expect("UTF-8 head");
        let length: usize = head
            .lines()
            .find_map(|l| {
                l.to_lowercase()
                    .strip_prefix("content-length:")?
                    .trim()
                    .parse()
                    .ok()
            })
            .expect("content-length");
        let mut body = vec![0u8; length];
        s.read_exact(&mut body).expect("read body");
        (head, String::from_utf8(body).expect("UTF-8 body"))
    }

    /// A client reuses its connection for several requests; once it goes quiet for
    /// [`HEADER_TIMEOUT`] the server closes it.
    #[test]
    fn a_connection_is_kept_alive_until_it_goes_idle() {
        let rt = runtime();
        let health = Arc::new(Health::new());
        let server = server(&rt, health.clone());
        let mut s = TcpStream::connect(server.local_addr()).expect("connect");
        s.set_read_timeout(Some(HEADER_TIMEOUT * 3))
            .expect("timeout");
        for (i, path) in ["/health", "/ready", "/metrics", "/health"]
            .iter()
            .enumerate()
        {
            if i == 1 {
                // Quiet for less than the idle cut: still open.
                std::thread::sleep(HEADER_TIMEOUT / 2);
            }
            write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").expect("write");
            let (head, _) = answer(&mut s);
            assert!(head.starts_with("HTTP/1.1"), "{path}: {head}");
        }
        let start = Instant::now();
        let mut buf = [0u8; 1];
        assert_eq!(s.read(&mut buf).expect("closed, not timed out"), 0);
        assert!(
            start.elapsed() >= HEADER_TIMEOUT / 2 && start.elapsed() < HEADER_TIMEOUT * 2,
            "closed after {:?} idle",
            start.elapsed()
        );
    }

    /// On a kept-alive connection, a later request that stalls is still cut after
    /// [`CONNECTION_TIMEOUT`]: the bound runs from each request's start.
    #[test]
    fn a_stalled_request_on_a_reused_connection_is_cut_off() {
        let rt = runtime();
        let slow = || async {
            tokio::time::sleep(CONNECTION_TIMEOUT + Duration::from_secs(1)).await;
            "done"
        };
        let router = Router::new()
            .route("/slow", get(slow))
            .route("/fast", get(|| async { "fast" }));
        let server =
            HttpServer::start("127.0.0.1:0".parse().unwrap(), rt.handle(), router).unwrap();
        let mut s = TcpStream::connect(server.local_addr()).expect("connect");
        s.set_read_timeout(Some(CONNECTION_TIMEOUT * 2))
            .expect("timeout");
        write!(s, "GET /fast HTTP/1.1\r\nHost: x\r\n\r\n").expect("write");
        assert_eq!(answer(&mut s).1, "fast");
        let start = Instant::now();
        write!(s, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n").expect("write");
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        assert!(rest.is_empty(), "cut off without an answer: {rest:?}");
        assert!(
            start.elapsed() < CONNECTION_TIMEOUT + Duration::from_millis(900),
            "cut after {:?}",
            start.elapsed()
        );
    }

    #[test]
    fn a_taken_port_is_an_error_naming_the_address() {
        let rt = runtime();
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
            .build_recorder()
            .handle();
        let err = HttpServer::start(addr, rt.handle(), routes(handle, Arc::new(Health::new())))
            .err()
            .expect("bind fails");
        assert!(err.to_string().contains(&addr.to_string()), "{err}");
    }
}
