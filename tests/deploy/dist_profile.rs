//! The `dist` build profile: LTO, stripped, unwinding kept.

use crate::tools::{read, root};

#[test]
pub(crate) fn dist_profile_is_lto_stripped_and_keeps_unwinding() {
    let cargo: toml::Table = read(&root().join("Cargo.toml")).parse().unwrap();
    let dist = cargo["profile"]["dist"].as_table().expect("[profile.dist]");
    assert_eq!(dist["inherits"].as_str(), Some("release"));
    assert!(
        matches!(
            dist.get("lto").and_then(|v| v.as_str()),
            Some("fat" | "thin")
        ) || dist.get("lto").and_then(|v| v.as_bool()) == Some(true),
        "dist: lto"
    );
    assert_eq!(dist["codegen-units"].as_integer(), Some(1));
    assert!(
        dist["strip"].as_bool() == Some(true) || dist["strip"].as_str() == Some("symbols"),
        "dist: strip"
    );
    // chd catches panics of collectors and probes; abort would turn one into an exit.
    let panic = dist
        .get("panic")
        .or_else(|| cargo["profile"]["release"].get("panic"));
    assert!(
        panic.is_none() || panic.and_then(|p| p.as_str()) == Some("unwind"),
        "dist must unwind: {panic:?}"
    );
}
