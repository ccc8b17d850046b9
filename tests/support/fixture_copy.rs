//! A writable copy of a fixture tree, for tests that change sysfs or procfs under a running
//! collector set or `chd serve`: links are copied as links (the fixtures' links are
//! relative, so they point into the copy, as the kernel's do).
#![allow(dead_code)]

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;

/// Copy `from` into `to` (created), recursively, links kept as links.
pub fn copy_tree(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let kind = entry.file_type().unwrap();
        if kind.is_symlink() {
            symlink(fs::read_link(&src).unwrap(), &dst).unwrap();
        } else if kind.is_dir() {
            copy_tree(&src, &dst);
        } else {
            fs::copy(&src, &dst).unwrap();
        }
    }
}
