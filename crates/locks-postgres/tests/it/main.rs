//! Integration tests of the PostgreSQL manager, on a real server.

mod background;
mod basics;
mod conformance;
mod faults;
mod inspect;
mod many;
mod poolers;
mod processes;
mod support;
mod xact;
