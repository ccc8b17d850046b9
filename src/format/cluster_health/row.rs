//! One row of a results document's `metrics`, as read: the values of the keys chd
//! interprets ([`KEYS`]), everything else skipped while it streams past, so a row of the
//! tool's ~27 keys costs a handful of small values and no map.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

/// The keys [`rows`](super::rows) reads, sorted (looked up by binary search).
pub(super) const KEYS: [&str; 24] = [
    "alg_gbps",
    "device",
    "device_id",
    "device_pair",
    "direction",
    "error",
    "gbps",
    "host_cpu",
    "host_memory",
    "load",
    "load_profile",
    "memory",
    "message",
    "operation",
    "pinned",
    "profile",
    "rank",
    "rank0_cpu",
    "rank1_cpu",
    "reason",
    "repeat",
    "size_mb",
    "status",
    "test",
];

/// A row: for each of [`KEYS`], its value when the row has the key (`null` included).
/// A row that is not an object has none of them.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct Row {
    values: [Option<Value>; KEYS.len()],
}

impl Row {
    /// The value of `key` (one of [`KEYS`]), as `serde_json::Value::get` would give it.
    pub(super) fn get(&self, key: &str) -> Option<&Value> {
        let i = KEYS.binary_search(&key);
        debug_assert!(i.is_ok(), "{key} is not in row::KEYS");
        self.values[i.ok()?].as_ref()
    }
}

/// A key of a row: its index in [`KEYS`], `None` for a key chd does not read.
struct Key;

impl<'de> DeserializeSeed<'de> for Key {
    type Value = Option<usize>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<usize>, D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for Key {
    type Value = Option<usize>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<Option<usize>, E> {
        Ok(KEYS.binary_search(&key).ok())
    }
}

struct RowVisitor;

impl<'de> Visitor<'de> for RowVisitor {
    type Value = Row;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a metrics row")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Row, A::Error> {
        let mut row = Row::default();
        while let Some(key) = map.next_key_seed(Key)? {
            match key {
                // A key given twice keeps its last value, as a JSON object read whole would.
                Some(i) => row.values[i] = Some(map.next_value()?),
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(row)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Row, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Row::default())
    }

    fn visit_unit<E: de::Error>(self) -> Result<Row, E> {
        Ok(Row::default())
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Row, E> {
        Ok(Row::default())
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Row, E> {
        Ok(Row::default())
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Row, E> {
        Ok(Row::default())
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Row, E> {
        Ok(Row::default())
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Row, E> {
        Ok(Row::default())
    }
}

impl<'de> de::Deserialize<'de> for Row {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Row, D::Error> {
        d.deserialize_any(RowVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_sorted_for_the_binary_search() {
        assert!(KEYS.windows(2).all(|w| w[0] < w[1]), "{KEYS:?}");
    }

    #[test]
    fn a_row_keeps_the_keys_chd_reads_and_tells_null_from_absent() {
        let row: Row = serde_json::from_str(
            r#"{"bind_actual_cpus": [0], "device_id": null, "gbps": 1.5, "test": "x", "ts": "t",
                "gbps": 2.5}"#,
        )
        .unwrap();
        assert_eq!(row.get("device_id"), Some(&Value::Null));
        assert_eq!(row.get("host_cpu"), None);
        assert_eq!(
            row.get("gbps"),
            Some(&Value::from(2.5)),
            "the last of a key given twice"
        );
        assert_eq!(row.get("test"), Some(&Value::from("x")));
        let not_an_object: Row = serde_json::from_str("[1, {\"test\": 2}]").unwrap();
        assert_eq!(not_an_object, Row::default());
    }
}
