//! placeholder, being written.
