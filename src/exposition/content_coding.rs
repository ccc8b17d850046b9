//! Content-coding negotiation for responses (`Accept-Encoding`, RFC 9110 §12.5.3) and the
//! gzip coding itself (flate2).
//!
//! Rules, as RFC 9110 §12.5.3 and §12.4.2 state them: codings are case-insensitive tokens
//! with an optional weight `q` (0..1, at most three decimals; `q=0` means "not
//! acceptable"); `*` matches every coding not listed; `identity` (no coding) is acceptable
//! unless the field says `identity;q=0`, or `*;q=0` without listing `identity`; an empty
//! field means identity only; no field means any coding, and identity is sent. `x-gzip` is
//! `gzip` (§8.4.1.3). A malformed element (a bad weight) is ignored, not guessed at.

use std::io::Write;

use flate2::write::GzEncoder;
use flate2::Compression;

/// gzip level for response bodies, chosen with `cargo bench --bench scrape` (its
/// `scrape: gzip` lines) on the 30,720-cell exposition (4.06 MB plain), zlib-rs backend:
/// level 1 547 KB in ~7-11 ms, 2 392 KB in ~17 ms, 3 357 KB in ~21 ms, 4 351 KB in ~22 ms,
/// 6 331 KB in ~40 ms, 9 337 KB in ~90-118 ms. Level 1 misses the 400 KB target; 2 meets it
/// by 2 %, so any growth of the exposition breaks it; 3 keeps an 11 % margin for a quarter
/// more time than 2, and everything above buys a few percent for twice the time or more.
pub const GZIP_LEVEL: u32 = 3;

/// Bodies shorter than this are sent without a coding even when gzip is acceptable: with
/// the response head they fit in one Ethernet segment (1,460 bytes of payload) either way,
/// so compressing them saves no packet, only adds gzip's 18 bytes of framing.
pub const MIN_GZIP_BYTES: usize = 1024;

/// The coding a response is sent with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    Identity,
    Gzip,
}

impl Coding {
    /// The `Content-Encoding` value, `None` for identity.
    pub fn header_value(self) -> Option<&'static str> {
        match self {
            Coding::Identity => None,
            Coding::Gzip => Some("gzip"),
        }
    }
}

/// What a request's `Accept-Encoding` allows for the two codings chd can send.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Acceptable {
    /// Weight of gzip (0: not acceptable).
    gzip: f32,
    /// Weight of identity; `None` when the field does not mention it (acceptable, least
    /// preferred).
    identity: Option<f32>,
}

impl Acceptable {
    /// Parse the request's `Accept-Encoding` field lines (joined as one list, as RFC 9110
    /// §5.3 combines repeated fields); no line at all means identity.
    pub fn parse<'a>(fields: impl IntoIterator<Item = &'a str>) -> Acceptable {
        let mut any = false;
        let (mut gzip, mut identity, mut star) = (None, None, None);
        for field in fields {
            any = true;
            for element in field.split(',') {
                let mut parts = element.split(';');
                let coding = parts.next().unwrap_or("").trim();
                if coding.is_empty() {
                    continue;
                }
                let Some(weight) = weight(parts) else {
                    continue;
                };
                let slot = if coding.eq_ignore_ascii_case("gzip")
                    || coding.eq_ignore_ascii_case("x-gzip")
                {
                    &mut gzip
                } else if coding.eq_ignore_ascii_case("identity") {
                    &mut identity
                } else if coding == "*" {
                    &mut star
                } else {
                    continue;
                };
                // A coding listed twice: the first one counts.
                slot.get_or_insert(weight);
            }
        }
        if !any {
            // No field: any coding is acceptable; identity is what a client that did not
            // ask gets.
            return Acceptable {
                gzip: 0.0,
                identity: Some(1.0),
            };
        }
        Acceptable {
            gzip: gzip.or(star).unwrap_or(0.0),
            identity: identity.or(star),
        }
    }

    /// The coding for a body of `len` bytes, `None` when neither is acceptable (406).
    pub fn choose(self, len: usize) -> Option<Coding> {
        let identity_ok = self.identity.is_none_or(|q| q > 0.0);
        let gzip_ok = self.gzip > 0.0;
        let gzip_preferred = gzip_ok && self.identity.is_none_or(|q| self.gzip >= q);
        match (gzip_ok, identity_ok) {
            (false, false) => None,
            (true, false) => Some(Coding::Gzip),
            (false, true) => Some(Coding::Identity),
            (true, true) if gzip_preferred && len >= MIN_GZIP_BYTES => Some(Coding::Gzip),
            (true, true) => Some(Coding::Identity),
        }
    }
}

/// The `q` parameter of an element's parameters (1 when absent), `None` when malformed.
fn weight<'a>(params: impl Iterator<Item = &'a str>) -> Option<f32> {
    let mut q = 1.0;
    for param in params {
        let (name, value) = param.split_once('=')?;
        if !name.trim().eq_ignore_ascii_case("q") {
            continue;
        }
        q = qvalue(value.trim())?;
    }
    Some(q)
}

/// `qvalue = ( "0" [ "." 0*3DIGIT ] ) / ( "1" [ "." 0*3("0") ] )`
fn qvalue(text: &str) -> Option<f32> {
    let (int, frac) = text.split_once('.').unwrap_or((text, ""));
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    match int {
        "0" => Some(format!("0.{frac}0").parse().ok()?),
        "1" if frac.bytes().all(|b| b == b'0') => Some(1.0),
        _ => None,
    }
}

/// `body` in the gzip coding at [`GZIP_LEVEL`].
pub fn gzip(body: &[u8]) -> Vec<u8> {
    gzip_at(body, GZIP_LEVEL)
}

/// `body` in the gzip coding at `level` (0..=9); the benchmark compares levels with it.
pub fn gzip_at(body: &[u8], level: u32) -> Vec<u8> {
    // Text exposition compresses about tenfold; start there to grow the buffer rarely.
    let mut encoder = GzEncoder::new(
        Vec::with_capacity(body.len() / 8 + 64),
        Compression::new(level),
    );
    // Writing to a Vec cannot fail.
    encoder
        .write_all(body)
        .and_then(|()| encoder.try_finish())
        .expect("gzip into memory");
    encoder.finish().expect("gzip into memory")
}

#[cfg(test)]
mod tests {
    use super::*;
    use Coding::{Gzip, Identity};

    const BIG: usize = MIN_GZIP_BYTES;

    fn choose(fields: &[&str], len: usize) -> Option<Coding> {
        Acceptable::parse(fields.iter().copied()).choose(len)
    }

    #[test]
    fn prometheus_and_curl_get_gzip() {
        // Prometheus' scrape request; curl --compressed.
        assert_eq!(choose(&["gzip"], BIG), Some(Gzip));
        assert_eq!(choose(&["deflate, gzip, br, zstd"], BIG), Some(Gzip));
        assert_eq!(choose(&["GZip"], BIG), Some(Gzip));
        assert_eq!(choose(&["x-gzip"], BIG), Some(Gzip));
    }

    #[test]
    fn no_field_or_empty_field_is_identity() {
        assert_eq!(choose(&[], BIG), Some(Identity));
        assert_eq!(choose(&[""], BIG), Some(Identity));
        assert_eq!(choose(&["br"], BIG), Some(Identity));
    }

    #[test]
    fn q_zero_refuses() {
        assert_eq!(choose(&["gzip;q=0"], BIG), Some(Identity));
        assert_eq!(choose(&["gzip; q=0.000"], BIG), Some(Identity));
        assert_eq!(choose(&["*;q=0, identity"], BIG), Some(Identity));
        assert_eq!(choose(&["gzip;q=0, *"], BIG), Some(Identity));
        assert_eq!(choose(&["identity;q=0, gzip"], 10), Some(Gzip));
        assert_eq!(choose(&["*;q=0"], BIG), None);
        assert_eq!(choose(&["gzip;q=0, identity;q=0"], BIG), None);
    }

    #[test]
    fn weights_decide() {
        assert_eq!(choose(&["gzip;q=0.5, identity;q=0.8"], BIG), Some(Identity));
        assert_eq!(choose(&["gzip;q=0.8, identity;q=0.5"], BIG), Some(Gzip));
        assert_eq!(
            choose(&["gzip;q=1.0, identity; q=0.5, *;q=0"], BIG),
            Some(Gzip)
        );
        // Unlisted identity is the fallback, not a competitor.
        assert_eq!(choose(&["gzip;q=0.1"], BIG), Some(Gzip));
        // `*` stands for gzip and identity when neither is listed.
        assert_eq!(choose(&["*"], BIG), Some(Gzip));
        assert_eq!(choose(&["*;q=0.5, identity"], BIG), Some(Identity));
        // Repeated field lines form one list.
        assert_eq!(choose(&["identity;q=0.2", "gzip"], BIG), Some(Gzip));
    }

    #[test]
    fn malformed_weights_are_ignored() {
        for bad in [
            "gzip;q=2",
            "gzip;q=1.5",
            "gzip;q=0.1234",
            "gzip;q=abc",
            "gzip;q=",
            "gzip;q",
        ] {
            assert_eq!(choose(&[bad], BIG), Some(Identity), "{bad}");
        }
        // Other parameters do not matter.
        assert_eq!(choose(&["gzip;level=1"], BIG), Some(Gzip));
    }

    #[test]
    fn tiny_bodies_stay_plain_unless_identity_is_refused() {
        assert_eq!(choose(&["gzip"], BIG - 1), Some(Identity));
        assert_eq!(choose(&["gzip, identity;q=0"], BIG - 1), Some(Gzip));
    }

    #[test]
    fn qvalues_parse_to_the_grammar() {
        assert_eq!(qvalue("1"), Some(1.0));
        assert_eq!(qvalue("1.000"), Some(1.0));
        assert_eq!(qvalue("0.5"), Some(0.5));
        assert_eq!(qvalue("0."), Some(0.0));
        assert_eq!(qvalue("0"), Some(0.0));
        assert_eq!(qvalue("1.001"), None);
        assert_eq!(qvalue("00.5"), None);
        assert_eq!(qvalue("-0"), None);
    }

    #[test]
    fn gzip_round_trips() {
        use std::io::Read;
        let body = "chd_h2d_bandwidth_bytes_per_second{cpu=\"0\"} 5.8e10\n".repeat(1000);
        let packed = gzip(body.as_bytes());
        assert!(packed.len() < body.len() / 10, "{}", packed.len());
        let mut back = String::new();
        flate2::read::GzDecoder::new(&packed[..])
            .read_to_string(&mut back)
            .unwrap();
        assert_eq!(back, body);
    }
}
