//! The password file (`PGPASSFILE`, else `~/.pgpass`), read as libpq reads it.

use std::path::{Path, PathBuf};

use locks_postgres::tokio_postgres::Config;
use locks_postgres::tokio_postgres::config::Host;

use super::Env;

/// The password for `config` from the password file (`PGPASSFILE`, else `~/.pgpass`),
/// as libpq reads it: `host:port:database:user:password`, `*` matches anything, `\`
/// escapes `:` and `\`.
pub(super) fn pgpass_password(config: &Config, env: &dyn Env) -> Option<String> {
    let path = env
        .var("PGPASSFILE")
        .map(PathBuf::from)
        .or_else(|| env.var("HOME").map(|home| Path::new(&home).join(".pgpass")))?;
    let text = read_private(&path)?;
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(host)) => host.clone(),
        // libpq matches a socket directory as `localhost`.
        Some(Host::Unix(_)) | None => "localhost".to_owned(),
    };
    let port = config
        .get_ports()
        .first()
        .copied()
        .unwrap_or(5432)
        .to_string();
    let user = config.get_user().unwrap_or_default();
    let dbname = config.get_dbname().unwrap_or(user);
    pgpass_lookup(&text, [&host, &port, dbname, user])
}

/// The password file's text, unless it is missing, not a plain file, or readable by the
/// group or others, which libpq refuses with a warning (and so does pglock).
fn read_private(path: &Path) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let metadata = std::fs::metadata(path).ok()?;
    if !metadata.is_file() {
        eprintln!(
            "pglock: WARNING: password file \"{}\" is not a plain file",
            crate::text::escaped(&path.display().to_string())
        );
        return None;
    }
    if metadata.permissions().mode() & 0o077 != 0 {
        eprintln!(
            "pglock: WARNING: password file \"{}\" has group or world access; permissions \
             should be u=rw (0600) or less",
            crate::text::escaped(&path.display().to_string())
        );
        return None;
    }
    std::fs::read_to_string(path).ok()
}

/// The first line of a password file matching `wanted` (host, port, database, user).
fn pgpass_lookup(text: &str, wanted: [&str; 4]) -> Option<String> {
    for line in text.lines() {
        if line.trim_start().starts_with('#') {
            continue;
        }
        let mut fields = vec![String::new()];
        let mut chars = line.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => {
                    if let Some(next) = chars.next() {
                        fields.last_mut()?.push(next);
                    }
                }
                ':' if fields.len() < 5 => fields.push(String::new()),
                c => fields.last_mut()?.push(c),
            }
        }
        if fields.len() != 5 {
            continue;
        }
        let matches = wanted
            .iter()
            .zip(&fields)
            .all(|(want, field)| field == "*" || field == want);
        if matches {
            return fields.pop();
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_password_file_is_read_like_libpq() {
        let text = "# comment\nother:*:*:*:no\ndb.example:5432:*:app:pa\\:ss\n*:*:*:*:fallback\n";
        assert_eq!(
            pgpass_lookup(text, ["db.example", "5432", "app", "app"]).as_deref(),
            Some("pa:ss")
        );
        assert_eq!(
            pgpass_lookup(text, ["x", "1", "d", "u"]).as_deref(),
            Some("fallback")
        );
        assert_eq!(pgpass_lookup("h:1:d:u\n", ["h", "1", "d", "u"]), None);
    }
}
