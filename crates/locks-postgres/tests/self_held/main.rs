//! A wait on a key this manager holds is told at debug level: a binary of its own, because
//! the case counts one thread's tracing events, and with the `it` binary's other cases
//! running on other threads the event was missed (tracing caches each callsite's interest
//! process-wide; seen with the multiplexing cases beside it).

#[allow(dead_code)]
#[path = "../it/support.rs"]
mod support;

mod case;
