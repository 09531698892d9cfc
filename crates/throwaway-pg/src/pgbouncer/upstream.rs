//! The server behind PgBouncer, read from its URL.

use super::PgBouncerError;

/// The server behind PgBouncer, from its URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Upstream {
    pub(super) host: String,
    pub(super) port: u16,
    pub(super) user: String,
    pub(super) password: Option<String>,
    /// `user[:password]` as written, for the client URL.
    pub(super) userinfo_raw: Option<String>,
    /// The database as written, for the client URL.
    pub(super) database_raw: Option<String>,
}

impl Upstream {
    pub(super) fn parse(url: &str) -> Result<Self, PgBouncerError> {
        let invalid = |reason: &str| PgBouncerError::InvalidUrl {
            reason: reason.to_owned(),
        };
        let rest = url
            .strip_prefix("postgres://")
            .or_else(|| url.strip_prefix("postgresql://"))
            .ok_or_else(|| invalid("it does not start with postgres:// or postgresql://"))?;
        let (rest, _query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, database) = match rest.split_once('/') {
            Some((authority, database)) => (authority, Some(database)),
            None => (rest, None),
        };
        let (userinfo, hostport) = match authority.rsplit_once('@') {
            Some((userinfo, hostport)) => (Some(userinfo), hostport),
            None => (None, authority),
        };
        if hostport.contains(',') {
            return Err(invalid("it names several hosts"));
        }
        let port_number = |port: &str| {
            port.parse::<u16>()
                .map_err(|_| invalid("its port is not a number from 1 to 65535"))
        };
        let (host, port) = if let Some(bracketed) = hostport.strip_prefix('[') {
            let (host, after) = bracketed
                .split_once(']')
                .ok_or_else(|| invalid("its IPv6 address has no closing `]`"))?;
            match after.strip_prefix(':') {
                Some(port) => (host, port_number(port)?),
                None if after.is_empty() => (host, 5432),
                None => return Err(invalid("it has text after its IPv6 address")),
            }
        } else {
            match hostport.rsplit_once(':') {
                Some((host, port)) => (host, port_number(port)?),
                None => (hostport, 5432),
            }
        };
        if host.is_empty() {
            return Err(invalid("it names no host (a Unix socket is not supported)"));
        }
        let (user, password) = match userinfo {
            Some(userinfo) => match userinfo.split_once(':') {
                Some((user, password)) => (decode(user)?, Some(decode(password)?)),
                None => (decode(userinfo)?, None),
            },
            None => (
                std::env::var("USER").unwrap_or_else(|_| "postgres".to_owned()),
                None,
            ),
        };
        let safe = |text: &str| {
            !text.is_empty()
                && !text
                    .chars()
                    .any(|c| c.is_whitespace() || c.is_control() || "\"'\\;#=".contains(c))
        };
        if !safe(host) || !safe(&user) || password.as_deref().is_some_and(|p| !safe(p)) {
            return Err(invalid(
                "its host, user or password is empty or holds whitespace, quotes, `\\`, `;`, \
                 `#` or `=`, which this launcher does not write into PgBouncer's files",
            ));
        }
        Ok(Self {
            host: host.to_owned(),
            port,
            user,
            password,
            userinfo_raw: userinfo.map(str::to_owned),
            database_raw: database.filter(|db| !db.is_empty()).map(str::to_owned),
        })
    }
}

/// Percent-decoding of a URL part.
fn decode(text: &str) -> Result<String, PgBouncerError> {
    let invalid = || PgBouncerError::InvalidUrl {
        reason: "it holds an invalid percent-escape".to_owned(),
    };
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3).ok_or_else(invalid)?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| invalid())?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| invalid())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_urls_are_read_like_libpq_reads_them() {
        let upstream = Upstream::parse("postgres://postgres@127.0.0.1:5433/postgres").unwrap();
        assert_eq!(upstream.host, "127.0.0.1");
        assert_eq!(upstream.port, 5433);
        assert_eq!(upstream.user, "postgres");
        assert_eq!(upstream.password, None);
        assert_eq!(upstream.database_raw.as_deref(), Some("postgres"));

        let upstream =
            Upstream::parse("postgresql://app:p%40ss@db.local/app?sslmode=disable").unwrap();
        assert_eq!(upstream.host, "db.local");
        assert_eq!(upstream.port, 5432);
        assert_eq!(upstream.password.as_deref(), Some("p@ss"));
        assert_eq!(upstream.userinfo_raw.as_deref(), Some("app:p%40ss"));

        let upstream = Upstream::parse("postgres://u@[::1]:6000").unwrap();
        assert_eq!((upstream.host.as_str(), upstream.port), ("::1", 6000));
        assert_eq!(upstream.database_raw, None);

        for bad in [
            "mysql://x@h/db",
            "postgres://x@h:port/db",
            "postgres://x@h1,h2/db",
            "postgres://x@/db",
            "postgres://x:a%20b@h/db",
            "postgres://x:%zz@h/db",
        ] {
            assert!(
                matches!(Upstream::parse(bad), Err(PgBouncerError::InvalidUrl { .. })),
                "{bad}"
            );
        }
    }
}
