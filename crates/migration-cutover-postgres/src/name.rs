//! Table names checked once, then quoted into SQL text.

use std::fmt;

/// A table name, optionally schema-qualified (`events`, `tenant_store.events`), checked
/// to be plain identifiers so it can be put into SQL text safely.
///
/// Each part starts with an ASCII letter or `_`, goes on with ASCII letters, digits or
/// `_`, and is at most 63 bytes (PostgreSQL's identifier limit). Parts are quoted in SQL,
/// so case is kept.
///
/// ```
/// use migration_cutover_postgres::TableName;
///
/// let name = TableName::new("shared.events")?;
/// assert_eq!(name.schema(), Some("shared"));
/// assert_eq!(name.quoted(), "\"shared\".\"events\"");
/// assert!(TableName::new("events; DROP TABLE x").is_err());
/// assert!(TableName::new("a.b.c").is_err());
/// # Ok::<(), migration_cutover_postgres::InvalidName>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TableName {
    schema: Option<String>,
    table: String,
}

/// A table name that is not `[schema.]table` of plain identifiers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid table name {name:?}: {reason}")]
pub struct InvalidName {
    /// The name given.
    pub name: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

fn identifier(name: &str, part: &str) -> Result<String, InvalidName> {
    let invalid = |reason| InvalidName {
        name: name.to_owned(),
        reason,
    };
    let mut chars = part.chars();
    match chars.next() {
        None => return Err(invalid("an empty part")),
        Some(first) if !(first.is_ascii_alphabetic() || first == '_') => {
            return Err(invalid("a part must start with an ASCII letter or `_`"));
        }
        Some(_) => {}
    }
    if !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(invalid("only ASCII letters, digits and `_` are allowed"));
    }
    if part.len() > 63 {
        return Err(invalid("a part is longer than 63 bytes"));
    }
    Ok(part.to_owned())
}

impl TableName {
    /// Checks `name` (`table` or `schema.table`).
    ///
    /// # Errors
    /// [`InvalidName`] naming the input and what is wrong.
    pub fn new(name: &str) -> Result<Self, InvalidName> {
        let mut parts = name.split('.');
        let first = parts.next().unwrap_or_default();
        let second = parts.next();
        if parts.next().is_some() {
            return Err(InvalidName {
                name: name.to_owned(),
                reason: "at most one `.` (schema.table)",
            });
        }
        Ok(match second {
            None => Self {
                schema: None,
                table: identifier(name, first)?,
            },
            Some(table) => Self {
                schema: Some(identifier(name, first)?),
                table: identifier(name, table)?,
            },
        })
    }

    /// The schema, when the name is qualified.
    #[must_use]
    pub fn schema(&self) -> Option<&str> {
        self.schema.as_deref()
    }

    /// The table's own name.
    #[must_use]
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The name as SQL text, each part double-quoted.
    #[must_use]
    pub fn quoted(&self) -> String {
        match &self.schema {
            Some(schema) => format!("\"{schema}\".\"{}\"", self.table),
            None => format!("\"{}\"", self.table),
        }
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.schema {
            Some(schema) => write!(f, "{schema}.{}", self.table),
            None => f.write_str(&self.table),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_part_by_part() {
        assert_eq!(TableName::new("events").unwrap().quoted(), "\"events\"");
        assert_eq!(TableName::new("_a1.B2").unwrap().to_string(), "_a1.B2");
        for bad in [
            "", ".", "a.", ".a", "1a", "a-b", "a b", "é", "a\"b", "a.b.c",
        ] {
            assert!(TableName::new(bad).is_err(), "{bad:?}");
        }
        assert!(TableName::new(&"a".repeat(63)).is_ok());
        let error = TableName::new(&"a".repeat(64)).unwrap_err();
        assert!(error.to_string().contains("63 bytes"), "{error}");
    }
}
