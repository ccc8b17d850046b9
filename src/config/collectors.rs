//! The `[collectors]` section, derived from the collector table (`collect::COLLECTORS`): one
//! `NAME = true|false` key per collector and one key per collector option
//! (`netdev_all = true`, `hca_include = "^mlx5_"`). A key the table lacks is refused with
//! its name; validation compiles the patterns into [`CollectorSettings`].

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::error::{ConfigError, Problem};
use crate::collect::registry::{self, OptionValue};
use crate::collect::{CollectorSettings, OptionField, COLLECTORS};

/// An option's value as written: a switch or a pattern's text.
#[derive(Debug, Clone, PartialEq)]
pub enum RawOption {
    Switch(bool),
    Pattern(String),
}

/// `[collectors]` as written in TOML (or built from flags). Every key optional; keys are the
/// table's names, so only known ones can be held.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CollectorsLayer {
    /// `NAME = true|false`, by collector name.
    pub enabled: BTreeMap<&'static str, bool>,
    /// Option values by key.
    pub options: BTreeMap<&'static str, RawOption>,
}

impl CollectorsLayer {
    pub(super) fn is_empty(&self) -> bool {
        self.enabled.is_empty() && self.options.is_empty()
    }

    /// `over` wins wherever it sets a key.
    pub(super) fn merge(mut self, over: CollectorsLayer) -> CollectorsLayer {
        self.enabled.extend(over.enabled);
        self.options.extend(over.options);
        self
    }

    /// The complete layer of `settings`: every collector's switch, every switch option, and
    /// each pattern that is set. Of the defaults, this is what `--print-config` shows.
    pub fn of(settings: &CollectorSettings) -> CollectorsLayer {
        let enabled = COLLECTORS
            .iter()
            .map(|s| (s.name, settings.enabled.contains(s.name)))
            .collect();
        let options = settings
            .option_values()
            .into_iter()
            .filter_map(|(key, value)| match value {
                OptionValue::Switch(on) => Some((key, RawOption::Switch(on))),
                OptionValue::Pattern(text) => text.map(|t| (key, RawOption::Pattern(t))),
            })
            .collect();
        CollectorsLayer { enabled, options }
    }

    /// Validate: start from the table's defaults, apply what is set, compile the patterns.
    pub(super) fn validate(self) -> Result<CollectorSettings, ConfigError> {
        let mut settings = CollectorSettings::default();
        for (name, on) in self.enabled {
            settings.set_enabled(name, on);
        }
        for option in registry::options() {
            let Some(raw) = self.options.get(option.key) else {
                continue;
            };
            let key = format!("collectors.{}", option.key);
            match (option.field, raw) {
                (OptionField::Switch(field), RawOption::Switch(on)) => *field(&mut settings) = *on,
                (OptionField::Pattern(field), RawOption::Pattern(text)) => {
                    *field(&mut settings) = Some(pattern(key, text)?);
                }
                (OptionField::Switch(_), RawOption::Pattern(text)) => {
                    return Err(ConfigError::invalid(key, Problem::NotASwitch(text.clone())));
                }
                (OptionField::Pattern(_), RawOption::Switch(on)) => {
                    return Err(ConfigError::invalid(key, Problem::NotAPattern(*on)));
                }
            }
        }
        Ok(settings)
    }
}

/// An unanchored regex; the error keeps regex's last line (`unclosed group`).
fn pattern(key: String, text: &str) -> Result<regex::Regex, ConfigError> {
    regex::Regex::new(text).map_err(|e| {
        let why = e.to_string();
        let why = why
            .lines()
            .last()
            .unwrap_or_default()
            .trim_start_matches("error: ")
            .to_string();
        ConfigError::invalid(
            key,
            Problem::NotARegex {
                text: text.to_string(),
                why,
            },
        )
    })
}

/// The known keys, for the error that refuses an unknown one.
fn known_keys() -> String {
    let names: Vec<&str> = COLLECTORS.iter().map(|s| s.name).collect();
    let options: Vec<&str> = registry::options().map(|o| o.key).collect();
    format!(
        "a collector ({}) or a collector option ({})",
        names.join(", "),
        options.join(", ")
    )
}

impl Serialize for CollectorsLayer {
    /// Collectors in table order, then options in table order.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        for spec in COLLECTORS {
            if let Some(on) = self.enabled.get(spec.name) {
                map.serialize_entry(spec.name, on)?;
            }
        }
        for option in registry::options() {
            match self.options.get(option.key) {
                Some(RawOption::Switch(on)) => map.serialize_entry(option.key, on)?,
                Some(RawOption::Pattern(text)) => map.serialize_entry(option.key, text)?,
                None => {}
            }
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for CollectorsLayer {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(SectionVisitor)
    }
}

struct SectionVisitor;

impl<'de> Visitor<'de> for SectionVisitor {
    type Value = CollectorsLayer;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "a table of collector switches and options")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<CollectorsLayer, A::Error> {
        let mut layer = CollectorsLayer::default();
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::Collector(name) => {
                    layer.enabled.insert(name, map.next_value()?);
                }
                Key::Option(option) => {
                    let value = match option.field {
                        OptionField::Switch(_) => RawOption::Switch(map.next_value()?),
                        OptionField::Pattern(_) => RawOption::Pattern(map.next_value()?),
                    };
                    layer.options.insert(option.key, value);
                }
            }
        }
        Ok(layer)
    }
}

/// A key of the section, looked up in the table as it is read (so an unknown one is
/// reported at the key, as serde reports unknown fields).
enum Key {
    Collector(&'static str),
    Option(&'static registry::OptionSpec),
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_identifier(KeyVisitor)
    }
}

struct KeyVisitor;

impl Visitor<'_> for KeyVisitor {
    type Value = Key;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "a collector name or a collector option")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<Key, E> {
        if let Some(spec) = registry::spec(key) {
            Ok(Key::Collector(spec.name))
        } else if let Some(option) = registry::option(key) {
            Ok(Key::Option(option))
        } else {
            Err(E::custom(format!(
                "unknown field `{key}`, expected {}",
                known_keys()
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<CollectorsLayer, toml::de::Error> {
        toml::from_str(text)
    }

    #[test]
    fn every_collector_and_option_is_a_key() {
        let layer =
            parse("rdma = false\ndevice = false\nnetdev_all = true\nhca_include = \"^mlx5_\"\n")
                .unwrap();
        assert_eq!(layer.enabled.get("rdma"), Some(&false));
        assert_eq!(layer.enabled.get("device"), Some(&false));
        assert_eq!(
            layer.options.get("hca_include"),
            Some(&RawOption::Pattern("^mlx5_".into()))
        );
        let settings = layer.validate().unwrap();
        assert_eq!(settings.enabled("rdma"), Some(false));
        assert_eq!(settings.enabled("numa"), Some(true));
        assert!(settings.netdev_all);
        assert_eq!(settings.hca_include.unwrap().as_str(), "^mlx5_");
    }

    #[test]
    fn an_unknown_collector_is_refused_by_name() {
        let err = parse("gpu = true\n").unwrap_err().to_string();
        assert!(err.contains("unknown field `gpu`"), "{err}");
        assert!(err.contains("rdma, numa, netdev, pcie, device"), "{err}");
        assert!(err.contains("netdev_all"), "{err}");
    }

    #[test]
    fn values_of_the_wrong_type_are_refused() {
        let err = parse("rdma = \"yes\"\n").unwrap_err().to_string();
        assert!(err.contains("expected a boolean"), "{err}");
        let err = parse("hca_include = true\n").unwrap_err().to_string();
        assert!(err.contains("expected a string"), "{err}");
    }

    #[test]
    fn the_settings_layer_round_trips_in_table_order() {
        let mut settings = CollectorSettings::default();
        settings.set_enabled("pcie", false);
        settings.netdev_exclude = regex::Regex::new("^veth").ok();
        let layer = CollectorsLayer::of(&settings);
        let text = toml::to_string(&layer).unwrap();
        assert!(
            text.starts_with("rdma = true\nnuma = true\nnetdev = true\npcie = false\n"),
            "{text}"
        );
        assert!(text.contains("netdev_exclude = \"^veth\""), "{text}");
        assert!(!text.contains("hca_include"), "{text}");
        assert_eq!(parse(&text).unwrap().validate().unwrap(), settings);
    }

    #[test]
    fn a_bad_pattern_names_its_key() {
        let err = parse("netdev_include = \"(\"\n")
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("collectors.netdev_include: \"(\" is not a regex"),
            "{err}"
        );
    }
}
