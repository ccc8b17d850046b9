//! Tests of the `chd` command line through the real binary: bad config files (each names its
//! expected message on its first line), the shipped example config, `--print-config`,
//! `chd topology` on a fixture tree, and `--help`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::chd_process::{chd_bin, text};

fn chd(args: &[&str]) -> Output {
    Command::new(chd_bin())
        .args(args)
        .output()
        .expect("run chd")
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn every_bad_config_is_rejected_with_its_key_and_problem() {
    let dir = root().join("tests/fixtures/bad-config");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    assert!(files.len() >= 10, "bad-config fixtures missing");
    for file in files {
        let body = std::fs::read_to_string(&file).unwrap();
        let expect = body
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("# expect: "))
            .unwrap_or_else(|| panic!("{} lacks a '# expect: ' first line", file.display()));
        let out = chd(&[
            "serve",
            "--config",
            file.to_str().unwrap(),
            "--print-config",
        ]);
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{} was accepted", file.display());
        assert!(
            stderr.contains(expect.trim_end()),
            "{}: expected {expect:?} in:\n{stderr}",
            file.display()
        );
        assert!(stderr.starts_with("chd: "), "{stderr}");
    }
}

#[test]
fn flag_errors_name_the_key_too() {
    let out = chd(&["serve", "--interval", "0s", "--print-config"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("schedule.interval: must be greater than zero"));
}

#[test]
fn missing_config_file_is_a_clear_error() {
    let out = chd(&["serve", "--config", "/nonexistent/chd.toml"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("cannot read config file /nonexistent/chd.toml"));
}

#[test]
fn shipped_example_config_is_the_defaults() {
    let example = root().join("deploy/chd.example.toml");
    let with_file = chd(&[
        "serve",
        "--config",
        example.to_str().unwrap(),
        "--print-config",
    ]);
    assert!(with_file.status.success(), "{}", text(&with_file.stderr));
    let defaults = chd(&["serve", "--print-config"]);
    assert_eq!(text(&with_file.stdout), text(&defaults.stdout));
}

#[test]
fn flags_override_the_file_in_print_config() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("chd.toml");
    std::fs::write(
        &file,
        "[schedule]\ninterval = \"10m\"\n[probe]\nsizes_mib = [4, 64]\n",
    )
    .unwrap();
    let out = chd(&[
        "serve",
        "--config",
        file.to_str().unwrap(),
        "--sizes",
        "16",
        "--print-config",
    ]);
    let stdout = text(&out.stdout);
    assert!(stdout.contains("interval = \"10m\""), "{stdout}");
    assert!(stdout.contains("sizes_mib = [16]"), "{stdout}");
}

#[test]
fn topology_command_reads_a_fixture_tree() {
    let fixture = root().join("tests/fixtures/topology/two-node-offline");
    let sys = fixture.join("sys");
    let proc = fixture.join("proc");
    let args = [
        "--sysfs-root",
        sys.to_str().unwrap(),
        "--procfs-root",
        proc.to_str().unwrap(),
        "topology",
    ];
    let out = chd(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    assert!(
        table.contains("6 online CPUs, 3 allowed (1-3), offline: 6-7"),
        "{table}"
    );

    let mut json_args = args.to_vec();
    json_args.push("--json");
    let out = chd(&json_args);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    assert_eq!(v["cpus"].as_array().unwrap().len(), 6);
    assert_eq!(v["offline_cpus"], serde_json::json!([6, 7]));
}

#[test]
fn topology_on_a_missing_root_names_the_path() {
    let out = chd(&["--sysfs-root", "/nonexistent-sysfs", "topology"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("/nonexistent-sysfs"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn help_explains_the_subcommands_and_keys() {
    let top = text(&chd(&["--help"]).stdout);
    for word in ["serve", "topology", "--sysfs-root", "--procfs-root"] {
        assert!(top.contains(word), "--help lacks {word}:\n{top}");
    }
    let serve = text(&chd(&["serve", "--help"]).stdout);
    for key in [
        "[schedule.interval]",
        "[probe.sizes_mib]",
        "[exposition.cells]",
        "[paths.state_dir]",
    ] {
        assert!(serve.contains(key), "serve --help lacks {key}:\n{serve}");
    }
}
