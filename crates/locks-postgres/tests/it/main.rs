//! Integration tests of the PostgreSQL manager, on a real server.

mod basics;
mod observability;
mod support;
