//! The host backend: placeholder, being written.
