//! Asking a node's Patroni REST API (`GET /primary`, `GET /cluster`) over a plain TCP
//! stream: HTTP/1.0, the server closes when done, so no HTTP client is needed.

use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

use super::PatroniCluster;

impl PatroniCluster {
    /// The status code of `GET path` on node `node`'s REST API; `None` when it does not
    /// answer within a second.
    pub(super) fn rest_status(&self, node: usize, path: &str) -> Option<u16> {
        // "HTTP/1.0 200 OK"
        self.rest(node, path)?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    }

    /// The body of `GET path` on node `node`'s REST API when it answers 200.
    pub(super) fn rest_get(&self, node: usize, path: &str) -> Option<String> {
        let response = self.rest(node, path)?;
        let (head, body) = response.split_once("\r\n\r\n")?;
        (head.split_whitespace().nth(1)? == "200").then(|| body.to_owned())
    }

    /// The whole response to `GET path` (HTTP/1.0: the server closes when done), within
    /// a second per step.
    pub(super) fn rest(&self, node: usize, path: &str) -> Option<String> {
        let address = SocketAddr::from((Ipv4Addr::LOCALHOST, self.nodes[node].rest_port));
        let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(1)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
        stream
            .set_write_timeout(Some(Duration::from_secs(1)))
            .ok()?;
        write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
        let mut response = Vec::new();
        // A read that times out after some bytes still leaves what came.
        let _ = stream.read_to_end(&mut response);
        String::from_utf8(response).ok()
    }
}
