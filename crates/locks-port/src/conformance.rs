//! The shared contract suite (filled in by the conformance work).
