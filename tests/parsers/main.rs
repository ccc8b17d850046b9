//! Every parser of untrusted text under its fuzz target's properties (`checks/`), on stable
//! Rust in bounded time: proptest mutates the targets' seed inputs (`fuzz/seeds.txt`) and
//! generates inputs in each format's own shape, and every input a fuzzer once crashed on
//! (`fuzz/regressions/<target>/`) is replayed. `scripts/fuzz.sh` runs the same properties
//! under libFuzzer (nightly, cargo-fuzz).

mod checks;

use std::path::{Path, PathBuf};

use proptest::prelude::*;
use proptest::sample::Index;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The seeds `fuzz/seeds.txt` lists for `target`.
fn seeds(target: &str) -> Vec<Vec<u8>> {
    let list = std::fs::read_to_string(repo().join("fuzz/seeds.txt")).expect("fuzz/seeds.txt");
    let mut seeds = Vec::new();
    for line in list
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let (name, path) = line.split_once(' ').expect("TARGET PATH");
        if name != target {
            continue;
        }
        let parts: Vec<PathBuf> = path.trim().split('+').map(|p| repo().join(p)).collect();
        if parts[0].is_dir() {
            seeds.extend(files_in(&parts[0]).iter().map(|f| read(f)));
        } else {
            let mut seed = read(&parts[0]);
            for more in &parts[1..] {
                seed.push(0);
                seed.extend(read(more));
            }
            seeds.push(seed);
        }
    }
    assert!(
        !seeds.is_empty(),
        "fuzz/seeds.txt lists no seed for {target}"
    );
    seeds
}

fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Bytes that matter to the formats chd reads: JSON and TOML punctuation, numbers at and
/// past the edges of the types they land in, the words drivers write.
const TOKENS: &[&str] = &[
    "0",
    "-1",
    "1",
    "4294967295",
    "4294967296",
    "18446744073709551615",
    "18446744073709551616",
    "1e308",
    "1e999",
    "-0",
    "0.5",
    "NaN",
    "null",
    "true",
    "\"",
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "=",
    "-",
    "\n",
    " ",
    "\0",
    "N/A",
    "é",
    "1048575",
    "1048576",
    "gzip",
    "q=0",
    "*",
];

/// A seed with a few spans replaced by random bytes or tokens.
fn mutated(target: &str) -> impl Strategy<Value = Vec<u8>> {
    let seeds = seeds(target);
    let replacement = prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..6),
        proptest::sample::select(TOKENS).prop_map(|t| t.as_bytes().to_vec()),
    ];
    (
        any::<Index>(),
        proptest::collection::vec((any::<Index>(), 0usize..12, replacement), 0..5),
    )
        .prop_map(move |(seed, edits)| {
            let mut data = seed.get(&seeds).clone();
            for (at, cut, with) in edits {
                let start = at.index(data.len() + 1);
                let end = (start + cut).min(data.len());
                data.splice(start..end, with);
            }
            data
        })
}

/// Random bytes, or a seed mutated.
fn inputs(target: &str) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        1 => proptest::collection::vec(any::<u8>(), 0..256),
        4 => mutated(target),
    ]
}

fn check(target: &str) -> checks::Check {
    checks::TARGETS
        .iter()
        .find(|(name, _)| *name == target)
        .map(|(_, check)| *check)
        .unwrap_or_else(|| panic!("no check {target}"))
}

macro_rules! fuzzed {
    ($($name:ident: $cases:expr),* $(,)?) => {$(
        proptest! {
            #![proptest_config(ProptestConfig { cases: $cases, failure_persistence: None, ..ProptestConfig::default() })]
            #[test]
            fn $name(data in inputs(stringify!($name))) {
                check(stringify!($name))(&data);
            }
        }
    )*};
}

fuzzed! {
    affinity_file: 256,
    cluster_health: 256,
    config: 512,
    cpulist: 1024,
    http_negotiation: 1024,
    http_server: 128,
    proc_stat: 512,
    run_dir: 256,
    state_file: 512,
    sysfs_values: 1024,
    topology: 256,
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    /// Any set of ids prints as a cpulist that parses back to it.
    #[test]
    fn cpulists_print_and_parse_back(ids in proptest::collection::vec(0u32..checks::cpulist::MAX_ID, 0..64)) {
        checks::cpulist::round_trips(&ids);
    }

    /// Lists in the kernel's alphabet, the shape a corrupt sysfs file takes.
    #[test]
    fn cpulist_alphabet(text in "[0-9,\\- \n]{0,24}") {
        checks::cpulist::check(text.as_bytes());
    }

    /// Counters, rates, states and rows in the shape of the files they come from.
    #[test]
    fn sysfs_shaped(text in "( |\n)?[0-9]{0,22}(\\.[0-9]{0,3})?(e[0-9]{1,3})?( Gb/sec| GT/s| kB|: ACTIVE)?\n?") {
        checks::sysfs::check(text.as_bytes());
    }

    /// `/proc/stat` aggregate rows with counters up to the largest u64.
    #[test]
    fn proc_stat_counters(counters in proptest::collection::vec(any::<u64>(), 4..11)) {
        let row: Vec<String> = counters.iter().map(u64::to_string).collect();
        let stat = format!("cpu  {}\ncpu0 {}\nintr 0\nctxt 0\nbtime 1\nprocesses 1\nprocs_running 1\nprocs_blocked 0\n", row.join(" "), row.join(" "));
        checks::proc_stat::check(stat.as_bytes());
    }

    /// `Accept-Encoding` lists of the codings and weights that matter.
    #[test]
    fn accept_encoding_lists(elements in proptest::collection::vec(("(gzip|x-gzip|GZIP|identity|\\*|br|)", "(;q=[01](\\.[0-9]{0,4})?|;Q=1|;q=|;level=1)?"), 0..5)) {
        let field: Vec<String> = elements.iter().map(|(c, w)| format!("{c}{w}")).collect();
        checks::http::check_negotiation(field.join(", ").as_bytes());
    }
}

/// Every input a fuzzer crashed on, under its target's properties again.
#[test]
fn regressions_replay() {
    let root = repo().join("fuzz/regressions");
    let mut replayed = 0;
    for dir in files_or_dirs(&root) {
        let name = dir
            .file_name()
            .and_then(|n| n.to_str())
            .expect("target name")
            .to_owned();
        let check = check(&name);
        for file in files_in(&dir) {
            check(&read(&file));
            replayed += 1;
        }
    }
    assert!(replayed > 0, "no regression input under {}", root.display());
}

fn files_or_dirs(root: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| e.expect("entry").path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs
}

/// Every target has a check, seeds, and a fuzz target of the same name.
#[test]
fn every_target_is_fuzzed_and_seeded() {
    for (name, _) in checks::TARGETS {
        assert!(!seeds(name).is_empty());
        let target = repo().join("fuzz/fuzz_targets").join(format!("{name}.rs"));
        assert!(target.is_file(), "{} is missing", target.display());
    }
}
