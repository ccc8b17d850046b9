//! The config file (`config::Layer::from_toml`, then `Config::resolve`).

use std::path::Path;

use chd::config::{Config, ConfigError, Layer};

/// A file that parses and validates prints (`--print-config`) to a file that validates to
/// the same `Config`; a syntax error names the file, a bad value names its key.
pub fn check(data: &[u8]) {
    let Some(text) = super::text(data) else {
        return;
    };
    let path = Path::new("/etc/chd/chd.toml");
    let layer = match Layer::from_toml(path, text) {
        Ok(layer) => layer,
        Err(e) => return names_the_file(path, e),
    };
    let config = match Config::resolve([layer]) {
        Ok(config) => config,
        Err(ConfigError::Invalid { key, problem }) => {
            assert!(!key.is_empty(), "no key for {problem}");
            assert!(key.contains('.'), "{key:?} is not a section.key");
            return;
        }
        Err(e) => panic!("validation gave {e:?}, not an error naming a key"),
    };
    let printed = config.to_toml();
    let again = Layer::from_toml(path, &printed)
        .and_then(|layer| Config::resolve([layer]))
        .unwrap_or_else(|e| panic!("printed config does not read back: {e}\n{printed}"));
    assert_eq!(config, again, "printed:\n{printed}");
}

fn names_the_file(path: &Path, e: ConfigError) {
    match &e {
        ConfigError::Syntax { path: named, .. } => assert_eq!(named, path),
        other => panic!("a syntax error is {other:?}"),
    }
    assert!(e.to_string().contains(&path.display().to_string()), "{e}");
}
