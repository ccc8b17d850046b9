//! The properties the fuzz targets assert: `tests/parsers/checks/`, shared with the stable
//! property tests (`tests/parsers/main.rs`) so both drivers check the same things.

#[path = "../../tests/parsers/checks/mod.rs"]
pub mod checks;
