//! Connection strings as libpq writes them: the URL and `key=value` forms, and the TLS
//! parameters the driver does not know, taken out of either.

use crate::exit::{CONFIG, Failure};

/// The two forms of a connection string, as an error names them.
pub(super) const EXPECTED_FORMS: &str = "expected postgres://user:password@host:port/dbname \
     (or postgresql://…) or key=value settings such as host=localhost user=app dbname=app";

/// What is plainly wrong with `conninfo` before any parser looks at it: a URL scheme
/// other than `postgres://` or `postgresql://`, or one of those without its `//`. Names
/// only the scheme, never the rest (it may hold a password); `None` for key=value
/// settings and well-formed URLs.
pub(super) fn scheme_problem(conninfo: &str) -> Option<String> {
    let (scheme, rest) = conninfo.split_once(':')?;
    let looks_like_a_scheme = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    if !looks_like_a_scheme {
        return None;
    }
    if scheme == "postgres" || scheme == "postgresql" {
        return (!rest.starts_with("//"))
            .then(|| format!("`{scheme}:` must be followed by `//` and the host"));
    }
    Some(format!("`{scheme}:` is not a PostgreSQL URL scheme"))
}

/// The TLS parameters taken out of a connection string (the driver knows neither
/// `verify-*` modes nor `sslrootcert`).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct SslParams {
    pub(super) sslmode: Option<String>,
    pub(super) sslrootcert: Option<String>,
}

/// `conninfo` without `sslmode` and `sslrootcert`, and their values. Both libpq forms:
/// `postgres://…?sslmode=…` and `host=… sslmode=…`.
pub(super) fn split_ssl_params(conninfo: &str) -> Result<(String, SslParams), Failure> {
    let mut params = SslParams::default();
    let is_url = conninfo.starts_with("postgres://") || conninfo.starts_with("postgresql://");
    if is_url {
        let Some((base, query)) = conninfo.split_once('?') else {
            return Ok((conninfo.to_owned(), params));
        };
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match percent_decode(key)?.as_str() {
                "sslmode" => params.sslmode = Some(percent_decode(value)?),
                "sslrootcert" => params.sslrootcert = Some(percent_decode(value)?),
                _ => kept.push(pair),
            }
        }
        let rest = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        return Ok((rest, params));
    }
    let mut kept = Vec::new();
    for (key, value) in key_values(conninfo)? {
        match key.as_str() {
            "sslmode" => params.sslmode = Some(value),
            "sslrootcert" => params.sslrootcert = Some(value),
            _ => kept.push(format!(
                "{key}='{}'",
                value.replace('\\', "\\\\").replace('\'', "\\'")
            )),
        }
    }
    Ok((kept.join(" "), params))
}

/// The pairs of a libpq `key=value` string (values bare or in single quotes, with `\`
/// escapes).
fn key_values(text: &str) -> Result<Vec<(String, String)>, Failure> {
    let bad = || {
        Failure::new(
            CONFIG,
            format!("invalid connection string: not key=value pairs; {EXPECTED_FORMS}"),
        )
    };
    let mut pairs = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            return Ok(pairs);
        }
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c.is_whitespace() {
                break;
            }
            key.push(c);
            chars.next();
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.next() != Some('=') || key.is_empty() {
            return Err(bad());
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut value = String::new();
        if chars.peek() == Some(&'\'') {
            chars.next();
            loop {
                match chars.next() {
                    Some('\'') => break,
                    Some('\\') => value.push(chars.next().ok_or_else(bad)?),
                    Some(c) => value.push(c),
                    None => return Err(bad()),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                chars.next();
                if c == '\\' {
                    value.push(chars.next().ok_or_else(bad)?);
                } else {
                    value.push(c);
                }
            }
        }
        pairs.push((key, value));
    }
}

/// `%XX` decoding of a URL query part.
fn percent_decode(text: &str) -> Result<String, Failure> {
    let bad = || Failure::new(CONFIG, format!("invalid percent-encoding in `{text}`"));
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3).ok_or_else(bad)?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| bad())?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| bad())
}
