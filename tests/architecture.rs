//! The module map of docs/ARCHITECTURE.md holds: every `crate::<module>` a library module
//! names (imports, paths, test modules included; comments excluded) is a module of a lower
//! layer of the map, so no module depends on one above it and there is no cycle. The map is
//! the fenced `layers` block of the document, bottom layer first.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Module -> layer index, from the document's `layers` block.
fn layers() -> BTreeMap<String, usize> {
    let doc =
        std::fs::read_to_string(root().join("docs/ARCHITECTURE.md")).expect("docs/ARCHITECTURE.md");
    let block = doc
        .split("```layers\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("a ```layers block in docs/ARCHITECTURE.md");
    let mut map = BTreeMap::new();
    for (i, line) in block.lines().enumerate() {
        let names = line.split('#').next().unwrap_or("");
        for name in names.split_whitespace() {
            assert!(
                map.insert(name.to_string(), i).is_none(),
                "{name} is in two layers of docs/ARCHITECTURE.md"
            );
        }
    }
    map
}

/// The top-level library modules: `src/<name>.rs` or `src/<name>/mod.rs`, declared in lib.rs.
fn library_modules() -> Vec<String> {
    let lib = std::fs::read_to_string(root().join("src/lib.rs")).unwrap();
    lib.lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod "))
        .map(|l| l.trim_end_matches(';').to_string())
        .collect()
}

fn rust_files(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(path)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for e in entries {
            rust_files(&e, out);
        }
    } else if path.is_file() && path.extension().is_some_and(|e| e == "rs") {
        out.push(path.to_path_buf());
    }
}

/// The code of a line without its `//` comment (a `//` inside a string literal is rare in
/// this code base and would only hide a name, never invent one).
fn code(line: &str) -> &str {
    line.split("//").next().unwrap_or("")
}

/// Every top-level module named as `crate::<name>` or inside `crate::{...}` in `text`.
fn named_modules(text: &str) -> Vec<String> {
    let code: String = text.lines().map(code).collect::<Vec<_>>().join("\n");
    let mut names = Vec::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Top-level names of the group only: `crate::{a::b, c}` names a and c.
            let mut depth = 0;
            let mut start = true;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = true,
                    c if start && !c.is_whitespace() => {
                        start = false;
                        names.push(ident(&group[j..]));
                    }
                    _ => {}
                }
            }
        } else {
            names.push(ident(rest));
        }
    }
    names.retain(|n| !n.is_empty());
    names
}

#[test]
fn no_module_names_one_above_it_in_the_map() {
    let layers = layers();
    let modules = library_modules();
    for m in &modules {
        assert!(
            layers.contains_key(m),
            "src/lib.rs declares `{m}`, which the layers block of docs/ARCHITECTURE.md lacks"
        );
    }
    let mut violations = Vec::new();
    for m in &modules {
        let mut files = Vec::new();
        let dir = root().join("src").join(m);
        rust_files(&dir, &mut files);
        rust_files(&root().join("src").join(format!("{m}.rs")), &mut files);
        assert!(!files.is_empty(), "no source files for module {m}");
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for used in named_modules(&text) {
                if &used == m {
                    continue;
                }
                let Some(&layer) = layers.get(&used) else {
                    continue;
                };
                if layer >= layers[m] {
                    violations.push(format!(
                        "{} names crate::{used} (layer {layer}) from {m} (layer {})",
                        file.strip_prefix(root()).unwrap().display(),
                        layers[m]
                    ));
                }
            }
        }
    }
    assert!(
        violations.is_empty(),
        "imports against the map in docs/ARCHITECTURE.md:\n{}",
        violations.join("\n")
    );
}

#[test]
fn the_scanner_finds_paths_and_groups_but_not_comments() {
    let text = "use crate::store::Store;\nuse crate::{format::run_dir::{self, X}, stats};\n\
                // crate::serve in a comment\nlet x = crate::topology::read();\n";
    assert_eq!(
        named_modules(text),
        ["store", "format", "stats", "topology"]
    );
}
