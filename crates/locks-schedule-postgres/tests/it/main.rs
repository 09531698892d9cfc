//! Integration tests of the PostgreSQL ledger, on a real server.

mod contract;
mod crash;
mod errors;
mod skew;
mod support;
