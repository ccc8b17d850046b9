//! Bytes as lower-case hex text and back: the fabric's token challenges and proofs, and the
//! NCCL unique id / HCCL root info a fabric run relays between rank processes.

/// Lower-case hex of `bytes`.
pub fn encode(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes of lower- or upper-case hex (surrounding whitespace ignored).
pub fn decode(text: &str) -> Result<Vec<u8>, String> {
    let text = text.trim();
    if text.len() % 2 != 0 {
        return Err(format!("{} hex digits: not whole bytes", text.len()));
    }
    (0..text.len())
        .step_by(2)
        .map(|i| {
            text.get(i..i + 2)
                .and_then(|d| u8::from_str_radix(d, 16).ok())
                .ok_or_else(|| format!("{:?} at {i} is not hex", text.get(i..i + 2).unwrap_or("")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_and_garbage_is_named() {
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(decode(&encode(&all)).unwrap(), all);
        assert_eq!(decode(" 0A ").unwrap(), vec![10]);
        assert_eq!(decode("0Af").unwrap_err(), "3 hex digits: not whole bytes");
        assert!(decode("0A f").unwrap_err().contains("not hex"));
        assert!(decode("zz").unwrap_err().contains("not hex"));
        assert!(decode("é0").is_err());
    }
}
