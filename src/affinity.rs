//! Binding the calling thread to exactly one CPU, reading the binding back, and restoring it.
