//! The data-path check every backend runs: sources are filled with a pattern that has no
//! zero byte (fresh destinations are zeros, so a copy that did not happen cannot pass), and
//! sampled bytes of the destination are compared with the source after timing.

/// Bytes compared after the timed copies, first and last included.
pub const CHECK_SAMPLES: usize = 17;

/// The pattern byte at offset `i`.
pub fn pattern_byte(i: usize) -> u8 {
    (i % 255) as u8 + 1
}

/// Fill `buf` with the pattern.
pub fn fill_pattern(buf: &mut [u8]) {
    // 16 periods of 255, so consecutive blocks continue the pattern seamlessly.
    let block: Vec<u8> = (0..255 * 16).map(pattern_byte).collect();
    for chunk in buf.chunks_mut(block.len()) {
        chunk.copy_from_slice(&block[..chunk.len()]);
    }
}

/// Offsets of the sampled bytes in a buffer of `len` bytes.
pub fn check_offsets(len: usize) -> impl Iterator<Item = usize> {
    let n = CHECK_SAMPLES.min(len);
    (0..n).map(move |i| if n > 1 { i * (len - 1) / (n - 1) } else { 0 })
}

/// Compare sampled bytes of `dst` with `src`.
pub fn check_copy(src: &[u8], dst: &[u8]) -> Result<(), super::ProbeError> {
    for at in check_offsets(src.len()) {
        if src[at] != dst[at] {
            return Err(super::ProbeError::Copy(format!(
                "destination byte {at} is {:#04x}, source has {:#04x}",
                dst[at], src[at]
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_has_no_zero_and_continues_across_blocks() {
        let mut buf = vec![0u8; 255 * 16 * 2 + 7];
        fill_pattern(&mut buf);
        assert!(buf.iter().all(|&b| b != 0));
        assert!(buf.iter().enumerate().all(|(i, &b)| b == pattern_byte(i)));
    }

    #[test]
    fn check_catches_a_missing_copy() {
        let mut src = vec![0u8; 4096];
        fill_pattern(&mut src);
        assert!(check_copy(&src, &src.clone()).is_ok());
        let err = check_copy(&src, &vec![0u8; 4096]).unwrap_err();
        assert_eq!(err.reason(), "copy");
        assert_eq!(check_offsets(4096).last(), Some(4095));
    }
}
