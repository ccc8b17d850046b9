//! The module map of docs/ARCHITECTURE.md holds: every `crate::<module>` a library module
//! names (imports, paths, test modules included; comments excluded) is a module of a lower
//! layer of the map, so no module depends on one above it and there is no cycle. The map is
//! the fenced `layers` block of the document, bottom layer first. Inside a module, no files
//! import each other round a cycle (`super::<sibling>` paths).

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

/// Sibling files of one directory (`mod.rs` excluded: it is their parent) that name each
/// other through `super::<file>`, as edges file -> sibling.
fn sibling_edges(dir: &Path) -> BTreeMap<String, Vec<String>> {
    let files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs") && !p.ends_with("mod.rs"))
        .collect();
    let stem = |p: &Path| p.file_stem().unwrap().to_string_lossy().into_owned();
    let names: Vec<String> = files.iter().map(|p| stem(p)).collect();
    let mut edges = BTreeMap::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let code: String = text.lines().map(code).collect::<Vec<_>>().join("\n");
        let mut to: Vec<String> = names
            .iter()
            .filter(|n| **n != stem(f))
            .filter(|n| {
                code.contains(&format!("super::{n}::"))
                    || code.contains(&format!("super::{n};"))
                    || code.contains(&format!("super::{{{n}"))
                    || code.contains(&format!("super::{n}::{{"))
            })
            .cloned()
            .collect();
        to.sort();
        edges.insert(stem(f), to);
    }
    edges
}

/// A cycle in `edges`, if there is one, as the files along it.
fn cycle(edges: &BTreeMap<String, Vec<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        edges: &BTreeMap<String, Vec<String>>,
        path: &mut Vec<String>,
        done: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == node) {
            return Some(path[i..].to_vec());
        }
        if done.iter().any(|d| d == node) {
            return None;
        }
        path.push(node.to_string());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, edges, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.push(node.to_string());
        None
    }
    let mut done = Vec::new();
    edges
        .keys()
        .find_map(|n| visit(n, edges, &mut Vec::new(), &mut done))
}

#[test]
fn no_two_files_of_a_module_import_each_other_round_a_cycle() {
    let mut dirs = vec![root().join("src")];
    let mut cycles = Vec::new();
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            }
        }
        if let Some(c) = cycle(&sibling_edges(&dir)) {
            cycles.push(format!(
                "{}: {} -> {}",
                dir.strip_prefix(root()).unwrap().display(),
                c.join(" -> "),
                c[0]
            ));
        }
    }
    assert!(cycles.is_empty(), "file cycles:\n{}", cycles.join("\n"));
}

#[test]
fn the_cycle_finder_finds_one() {
    let edges: BTreeMap<String, Vec<String>> = [
        ("command", vec!["plan"]),
        ("plan", vec!["bindable"]),
        ("bindable", vec!["command"]),
        ("leaf", vec![]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(cycle(&edges).unwrap(), ["bindable", "command", "plan"]);
    let mut acyclic = edges.clone();
    acyclic.insert("bindable".into(), vec![]);
    assert_eq!(cycle(&acyclic), None);
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
