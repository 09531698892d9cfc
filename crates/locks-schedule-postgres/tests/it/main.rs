//! Integration tests of the PostgreSQL ledger, on a real server.

mod agree;
mod contract;
mod crash;
mod errors;
mod every_slot;
mod skew;
mod support;
