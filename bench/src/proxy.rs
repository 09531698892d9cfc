//! A TCP proxy that delays each direction by a fixed amount: a simulated network between
//! the bench and a local server (these kernels have no `netem` qdisc).
//!
//! Per connection and direction, a reader thread stamps every chunk it reads with the
//! instant it is due (read time + delay) and queues it; a writer thread takes the chunks in
//! order, sleeps until each is due and writes it. The delay is the same for every chunk, so
//! due times never go backwards and order is kept; the bandwidth is not limited.
//!
//! Threads and `std::thread::sleep` rather than Tokio: Tokio's timer rounds every sleep up
//! to the next millisecond tick, so a 0.25 ms delay would come out as 1–2 ms; a thread's
//! `nanosleep` wakes within about 60 µs (the default timer slack). What a chunk waits is
//! checked by the latency scenario, which measures the round trip through the proxy.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::BoxError;

/// A running proxy; dropping it closes the listener and every connection through it.
#[derive(Debug)]
pub(crate) struct Proxy {
    address: SocketAddr,
    stop: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
    accepting: Option<JoinHandle<()>>,
}

impl Proxy {
    /// Listens on a free port of 127.0.0.1 and forwards to `upstream`, each direction
    /// delayed by `one_way`.
    pub(crate) fn start(upstream: (String, u16), one_way: Duration) -> Result<Self, BoxError> {
        let upstream: Vec<SocketAddr> = upstream.to_socket_addrs()?.collect();
        let listener = TcpListener::bind(("127.0.0.1", 0))?;
        let address = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let open = Arc::new(Mutex::new(Vec::new()));
        let accepting = {
            let (stop, open) = (Arc::clone(&stop), Arc::clone(&open));
            std::thread::Builder::new()
                .name("proxy-accept".into())
                .spawn(move || accept(&listener, &upstream, one_way, &stop, &open))?
        };
        Ok(Self {
            address,
            stop,
            open,
            accepting: Some(accepting),
        })
    }

    pub(crate) fn port(&self) -> u16 {
        self.address.port()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop, which then sees `stop`.
        let _ = TcpStream::connect(self.address);
        if let Some(accepting) = self.accepting.take() {
            let _ = accepting.join();
        }
        for stream in self
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
        {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

fn accept(
    listener: &TcpListener,
    upstream: &[SocketAddr],
    one_way: Duration,
    stop: &AtomicBool,
    open: &Mutex<Vec<TcpStream>>,
) {
    for client in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let Ok(client) = client else { continue };
        let Ok(server) = TcpStream::connect(upstream) else {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let clones = (client.try_clone(), server.try_clone());
        let (Ok(client_copy), Ok(server_copy)) = clones else {
            continue;
        };
        if let (Ok(a), Ok(b)) = (client.try_clone(), server.try_clone()) {
            open.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend([a, b]);
        }
        pump(client, server_copy, one_way);
        pump(server, client_copy, one_way);
    }
}

/// Forwards what `from` sends to `to`, each chunk `delay` after it was read.
fn pump(mut from: TcpStream, mut to: TcpStream, delay: Duration) {
    let (queue, due) = mpsc::channel::<(Instant, Vec<u8>)>();
    let _ = std::thread::Builder::new()
        .name("proxy-read".into())
        .spawn(move || {
            let mut buffer = vec![0u8; 64 * 1024];
            loop {
                match from.read(&mut buffer) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if queue
                            .send((Instant::now() + delay, buffer[..n].to_vec()))
                            .is_err()
                        {
                            break;
                        }
                    }
                }
            }
        });
    let _ = std::thread::Builder::new()
        .name("proxy-write".into())
        .spawn(move || {
            for (at, chunk) in due {
                let now = Instant::now();
                if at > now {
                    std::thread::sleep(at - now);
                }
                if to.write_all(&chunk).is_err() {
                    break;
                }
            }
            let _ = to.shutdown(Shutdown::Write);
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server behind the proxy: bytes come back in order, after at least two
    /// delays, and the proxy's drop closes the connection.
    #[test]
    fn bytes_arrive_in_order_and_late() {
        let echo = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let port = echo.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let (mut stream, _) = echo.accept().unwrap();
            let mut buffer = [0u8; 1024];
            while let Ok(n) = stream.read(&mut buffer) {
                if n == 0 || stream.write_all(&buffer[..n]).is_err() {
                    break;
                }
            }
        });
        let delay = Duration::from_millis(20);
        let proxy = Proxy::start(("127.0.0.1".into(), port), delay).unwrap();
        let mut client = TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
        let started = Instant::now();
        let message: Vec<u8> = (0..=255u8).cycle().take(5000).collect();
        for piece in message.chunks(700) {
            client.write_all(piece).unwrap();
        }
        let mut back = vec![0u8; message.len()];
        client.read_exact(&mut back).unwrap();
        assert!(started.elapsed() >= 2 * delay, "{:?}", started.elapsed());
        assert_eq!(back, message);
        drop(proxy);
        let mut rest = Vec::new();
        client
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        assert_eq!(client.read_to_end(&mut rest).unwrap(), 0);
    }
}
