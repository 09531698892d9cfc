//! Asking a node's Patroni REST API (`GET /primary`, `GET /cluster`) and etcd over a plain
//! TCP stream: HTTP/1.0, the server closes when done, so no HTTP client is needed. Inside a
//! network namespace this process cannot open a socket (that needs `setns`), so `curl`
//! runs there instead.

use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::process::Stdio;
use std::time::Duration;

use super::{PatroniCluster, Place};
use crate::NetworkPair;

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

    /// The whole response to `GET path` on node `node`'s REST API.
    pub(super) fn rest(&self, node: usize, path: &str) -> Option<String> {
        let node = &self.nodes[node];
        self.http_get(&node.place, node.rest_port, path)
    }

    /// The whole response (status line, headers, body) to `GET path` on `port` at `place`
    /// (HTTP/1.0: the server closes when done), within a second per step; from inside the
    /// place's namespace (`curl` there) when it has one.
    pub(super) fn http_get(&self, place: &Place, port: u16, path: &str) -> Option<String> {
        if let Some(namespace) = &place.namespace {
            let output = NetworkPair::command_in(namespace, "curl")
                .args(["--silent", "--include", "--http1.0", "--max-time", "2"])
                .arg(format!("http://{}:{port}{path}", place.address))
                .stdin(Stdio::null())
                .stderr(Stdio::null())
                .output()
                .ok()?;
            return output
                .status
                .success()
                .then(|| String::from_utf8(output.stdout).ok())
                .flatten();
        }
        let address = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
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
