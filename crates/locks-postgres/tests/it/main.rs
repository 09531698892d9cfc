//! Integration tests of the PostgreSQL manager, on a real server.

mod basics;
mod faults;
mod observability;
mod processes;
mod support;
