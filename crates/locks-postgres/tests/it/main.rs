//! Integration tests of the PostgreSQL manager, on a real server.

mod background;
mod basics;
mod conformance;
mod counter;
mod faults;
mod group_waits;
mod inspect;
mod installs;
mod leader;
mod leader_board;
mod leader_restart;
mod lease;
mod mode_change;

mod many;
mod metrics;
mod multiplex;
mod poolers;
mod processes;
mod recorded;
mod semaphore_waits;
mod semaphores;
mod stopped;
mod support;
mod told;
mod xact;
