//! Integration tests of the PostgreSQL adapters, on a real server and real processes.

mod adapters;
mod fleet;
mod support;
