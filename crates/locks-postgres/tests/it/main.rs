//! Integration tests of the PostgreSQL manager, on a real server.

mod basics;
mod support;
