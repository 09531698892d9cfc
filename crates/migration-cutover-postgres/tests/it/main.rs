//! Integration tests of the PostgreSQL adapters, on a real server and real processes.

mod adapters;
mod bounds;
mod crash;
mod fleet;
mod inputs;
mod lost_lock;
mod support;
mod uncertain;
