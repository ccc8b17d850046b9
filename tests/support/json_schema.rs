//! Validates JSON documents against a JSON Schema with a validator others wrote: the
//! `jsonschema` package from PyPI (Draft 2020-12; scripts/test.sh installs the pinned
//! version). A missing python3 or package fails the test with what to install, never skips.
#![allow(dead_code)]

use std::path::Path;
use std::process::Command;

const SCRIPT: &str = r#"
import json, sys
try:
    import jsonschema
except ImportError:
    sys.stderr.write("python3 has no jsonschema: python3 -m pip install 'jsonschema==4.26.0' (scripts/test.sh does)\n")
    sys.exit(3)
schema = json.load(open(sys.argv[1]))
jsonschema.Draft202012Validator.check_schema(schema)
validator = jsonschema.Draft202012Validator(schema)
bad = 0
for path in sys.argv[2:]:
    doc = json.load(open(path))
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
    for e in errors[:5]:
        bad += 1
        # A oneOf failure's best match says which property of which branch is wrong.
        best = jsonschema.exceptions.best_match([e])
        print(f"{path}: {'/'.join(map(str, best.absolute_path)) or '(root)'}: {best.message[:300]}")
sys.exit(1 if bad else 0)
"#;

/// Validate each of `docs` against `schema`; `Err` carries the validator's messages.
pub fn validate(schema: &Path, docs: &[&Path]) -> Result<(), String> {
    let out = Command::new("python3")
        .arg("-c")
        .arg(SCRIPT)
        .arg(schema)
        .args(docs)
        .output()
        .expect("python3 is needed to validate JSON Schemas (apt-get install python3)");
    match out.status.code() {
        Some(0) => Ok(()),
        Some(1) => Err(String::from_utf8_lossy(&out.stdout).into_owned()),
        _ => panic!(
            "the JSON Schema validator did not run: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// The schema of chd's calibration ledger.
pub fn calibration_schema() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/calibration.schema.json")
}
