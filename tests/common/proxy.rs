//! A TCP proxy that injects network faults between Kafka clients and a broker: added latency,
//! connections reset mid-stream, and a blackhole (bytes stop flowing, connections stay open).
//!
//! The broker must advertise the proxy's address (`scripts/kafka start --advertise-port P`),
//! or clients would connect to the broker directly after bootstrapping.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the proxy does to traffic now.
#[derive(Default)]
struct Faults {
    /// Delay added to every chunk forwarded, in milliseconds.
    latency_ms: AtomicU64,
    /// Nothing is forwarded (and nothing read) while set.
    blackhole: AtomicBool,
    /// Set when the proxy is dropped: every thread ends.
    closed: AtomicBool,
}

/// The proxy; its threads end when it is dropped.
pub struct Proxy {
    addr: SocketAddr,
    faults: Arc<Faults>,
    /// Both sockets of every connection made so far (for resets).
    conns: Arc<Mutex<Vec<(TcpStream, TcpStream)>>>,
}

impl Proxy {
    /// Listens on a free local port; forwards to `upstream` once [`Proxy::start`] is called.
    pub fn bind() -> (TcpListener, SocketAddr) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let addr = listener.local_addr().expect("proxy addr");
        (listener, addr)
    }

    /// Starts forwarding connections accepted on `listener` to `upstream`.
    pub fn start(listener: TcpListener, upstream: SocketAddr) -> Self {
        let addr = listener.local_addr().expect("proxy addr");
        let faults = Arc::new(Faults::default());
        let conns = Arc::new(Mutex::new(Vec::new()));
        listener
            .set_nonblocking(true)
            .expect("nonblocking listener");
        let (f, c) = (faults.clone(), conns.clone());
        std::thread::spawn(move || accept_loop(listener, upstream, f, c));
        Proxy {
            addr,
            faults,
            conns,
        }
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Adds `latency` to every chunk forwarded (zero: none).
    pub fn set_latency(&self, latency: Duration) {
        self.faults
            .latency_ms
            .store(latency.as_millis() as u64, Ordering::SeqCst);
    }

    /// Stops (or resumes) forwarding anything, keeping connections open.
    pub fn set_blackhole(&self, on: bool) {
        self.faults.blackhole.store(on, Ordering::SeqCst);
    }

    /// Closes every open connection in both directions (new connections are proxied again).
    pub fn reset_all(&self) -> usize {
        let mut conns = self.conns.lock().expect("proxy connections");
        let n = conns.len();
        for (a, b) in conns.drain(..) {
            let _ = a.shutdown(Shutdown::Both);
            let _ = b.shutdown(Shutdown::Both);
        }
        n
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.faults.closed.store(true, Ordering::SeqCst);
        self.reset_all();
    }
}

fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    faults: Arc<Faults>,
    conns: Arc<Mutex<Vec<(TcpStream, TcpStream)>>>,
) {
    while !faults.closed.load(Ordering::SeqCst) {
        let client = match listener.accept() {
            Ok((s, _)) => s,
            Err(_) => {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
        };
        let _ = client.set_nonblocking(false);
        let Ok(server) = TcpStream::connect(upstream) else {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
            continue;
        };
        if let (Ok(c3), Ok(s3)) = (client.try_clone(), server.try_clone()) {
            conns.lock().expect("proxy connections").push((c3, s3));
        }
        let (f1, f2) = (faults.clone(), faults.clone());
        std::thread::spawn(move || pump(client, s2, f1));
        std::thread::spawn(move || pump(server, c2, f2));
    }
}

/// Copies `from` to `to`, applying the faults, until either side closes.
fn pump(mut from: TcpStream, mut to: TcpStream, faults: Arc<Faults>) {
    let mut buf = vec![0u8; 64 * 1024];
    let _ = from.set_read_timeout(Some(Duration::from_millis(100)));
    loop {
        if faults.closed.load(Ordering::SeqCst) {
            break;
        }
        if faults.blackhole.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(_) => break,
        };
        let latency = faults.latency_ms.load(Ordering::SeqCst);
        if latency > 0 {
            std::thread::sleep(Duration::from_millis(latency));
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
