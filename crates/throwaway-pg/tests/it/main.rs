//! Integration tests: real clusters from the local PostgreSQL binaries.

mod lifecycle;
mod pgbouncer;
mod replication;
mod watchdog;

use std::net::{Ipv4Addr, TcpStream};
use std::time::{Duration, Instant};

/// Whether something accepts TCP connections on 127.0.0.1:`port`.
fn accepts_connections(port: u16) -> bool {
    TcpStream::connect_timeout(&(Ipv4Addr::LOCALHOST, port).into(), Duration::from_secs(2)).is_ok()
}

/// Polls `condition` until it holds or `timeout` passes; returns whether it held.
fn eventually(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
