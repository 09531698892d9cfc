//! The cutover race, one harness for every lock manager: instances with their own lock
//! managers race to cut over one tenant, on the in-memory lock table and on real
//! PostgreSQL, and a lock that does not exclude must make the race fail (the negative
//! control). Also: a session holding the cutover's advisory lock id outside Rust (as a
//! Python instance would) keeps the cutover out.

mod harness;
mod memory;
mod postgres;
