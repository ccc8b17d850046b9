//! Reading what a report's `.xlsx` holds without an xlsx reader: an xlsx is a zip, and its
//! central directory names every part (`xl/worksheets/sheet1.xml`, ...).
#![allow(dead_code)]

use std::path::Path;

/// File names in a zip's central directory (an xlsx is a zip).
pub fn zip_names(path: &Path) -> Vec<String> {
    let b = std::fs::read(path).unwrap();
    let mut names = Vec::new();
    let mut i = 0;
    while i + 46 <= b.len() {
        if b[i..i + 4] == [0x50, 0x4b, 0x01, 0x02] {
            let n = u16::from_le_bytes([b[i + 28], b[i + 29]]) as usize;
            names.push(String::from_utf8_lossy(&b[i + 46..i + 46 + n]).into_owned());
            i += 46 + n;
        } else {
            i += 1;
        }
    }
    names
}
