//! Ground floor: a TCP proxy delaying each direction (these kernels have no `netem`), on
//! threads: Tokio's timer rounds sleeps up to the millisecond, `nanosleep` wakes within
//! about 60 µs.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::time::{Duration, Instant};

use crate::Result;

/// A running proxy; dropping it closes the listener and every connection through it.
#[derive(Debug)]
pub(crate) struct Proxy {
    address: SocketAddr,
    stop: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    /// Listens on a free port and forwards to `upstream`, each way delayed by `one_way`.
    pub(crate) fn start(upstream: (String, u16), one_way: Duration) -> Result<Self> {
        let upstream: Vec<SocketAddr> = upstream.to_socket_addrs()?.collect();
        let listener = TcpListener::bind(("127.0.0.1", 0))?;
        let (stop, open) = (Arc::default(), Arc::default());
        let proxy = Self {
            address: listener.local_addr()?,
            stop: Arc::clone(&stop),
            open: Arc::clone(&open),
        };
        std::thread::Builder::new().spawn(move || {
            for client in listener.incoming() {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                // A connection the server refuses is dropped, which closes the client's.
                let _ = client.and_then(|client| connect(client, &upstream, one_way, &open));
            }
        })?;
        Ok(proxy)
    }

    pub(crate) fn port(&self) -> u16 {
        self.address.port()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop, which then sees `stop` and drops the listener.
        let _ = TcpStream::connect(self.address);
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        for stream in open.drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

fn connect(
    client: TcpStream,
    upstream: &[SocketAddr],
    delay: Duration,
    open: &Mutex<Vec<TcpStream>>,
) -> std::io::Result<()> {
    let server = TcpStream::connect(upstream)?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let mut open = open.lock().unwrap_or_else(PoisonError::into_inner);
    open.extend([client.try_clone()?, server.try_clone()?]);
    pump(client.try_clone()?, server.try_clone()?, delay)?;
    pump(server, client, delay)
}

/// Forwards what `from` sends to `to`, each chunk `delay` after it was read.
fn pump(mut from: TcpStream, mut to: TcpStream, delay: Duration) -> std::io::Result<()> {
    let (queue, due) = mpsc::channel::<(Instant, Vec<u8>)>();
    std::thread::Builder::new().spawn(move || {
        let mut buffer = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = from.read(&mut buffer) {
            if queue
                .send((Instant::now() + delay, buffer[..n].to_vec()))
                .is_err()
            {
                break;
            }
        }
    })?;
    std::thread::Builder::new().spawn(move || {
        for (at, chunk) in due {
            if let Some(wait) = at.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            if to.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Through the proxy to an echo server: bytes come back in order, late, and dropping
    /// the proxy closes the connection.
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
        assert!(started.elapsed() >= 2 * delay && back == message);
        drop(proxy);
        client
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        assert_eq!(client.read_to_end(&mut back).unwrap(), 0);
    }
}
