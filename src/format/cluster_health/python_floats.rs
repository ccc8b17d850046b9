//! Python's `json.dumps` writes a float that is not finite as a bare `NaN`, `Infinity` or
//! `-Infinity`, which JSON does not have. [`PythonFloats`] wraps a reader and, as the bytes
//! stream through, turns each such token outside a string into `null`; everything else
//! (strings that say `NaN` included) passes unchanged, so a document is never copied whole.

use std::io::{self, Read};

/// The tokens replaced, each by `null`.
const TOKENS: [&[u8]; 3] = [b"NaN", b"Infinity", b"-Infinity"];

/// How many bytes of the inner reader are rewritten at a time.
const CHUNK: usize = 64 * 1024;

/// A reader of JSON text as Python writes it, giving JSON.
pub(crate) struct PythonFloats<R> {
    inner: R,
    /// Inside a string (after its opening quote).
    in_string: bool,
    /// The previous byte inside a string was an unescaped backslash.
    escaped: bool,
    /// The start of a token read so far, outside strings (`-`, `N`, `Na`, `-Inf`, ...).
    partial: Vec<u8>,
    input: Vec<u8>,
    /// Rewritten bytes not yet handed out, from `out_at` on.
    out: Vec<u8>,
    out_at: usize,
    eof: bool,
}

impl<R: Read> PythonFloats<R> {
    pub(crate) fn new(inner: R) -> Self {
        PythonFloats {
            inner,
            in_string: false,
            escaped: false,
            partial: Vec::with_capacity(16),
            input: vec![0; CHUNK],
            out: Vec::with_capacity(CHUNK + CHUNK / 3),
            out_at: 0,
            eof: false,
        }
    }

    /// Rewrite one byte into `out`.
    fn push(&mut self, b: u8) {
        if self.in_string {
            match (self.escaped, b) {
                (true, _) => self.escaped = false,
                (false, b'\\') => self.escaped = true,
                (false, b'"') => self.in_string = false,
                _ => {}
            }
            self.out.push(b);
            return;
        }
        if !self.partial.is_empty() || matches!(b, b'N' | b'I' | b'-') {
            self.partial.push(b);
            match TOKENS.iter().find(|t| t.starts_with(&self.partial)) {
                Some(t) if t.len() == self.partial.len() => {
                    self.out.extend_from_slice(b"null");
                    self.partial.clear();
                }
                Some(_) => {}
                None => {
                    // Not one of the tokens (`-1.5`, or text the parser will refuse): the
                    // bytes go through as they are, the last one read afresh.
                    let last = self.partial.pop().unwrap_or(b);
                    self.out.append(&mut self.partial);
                    if matches!(last, b'N' | b'I' | b'-') {
                        self.partial.push(last);
                    } else {
                        self.push(last);
                    }
                }
            }
            return;
        }
        if b == b'"' {
            self.in_string = true;
        }
        self.out.push(b);
    }

    /// Read and rewrite the next chunk; false at the end of the input.
    fn fill(&mut self) -> io::Result<bool> {
        self.out.clear();
        self.out_at = 0;
        while self.out.is_empty() {
            if self.eof {
                return Ok(false);
            }
            let n = match self.inner.read(&mut self.input) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if n == 0 {
                self.eof = true;
                // A token cut short by the end of the file goes through as it is.
                self.out.append(&mut self.partial);
                continue;
            }
            let input = std::mem::take(&mut self.input);
            for &b in &input[..n] {
                self.push(b);
            }
            self.input = input;
        }
        Ok(true)
    }
}

impl<R: Read> Read for PythonFloats<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.out_at == self.out.len() && !self.fill()? {
            return Ok(0);
        }
        let n = buf.len().min(self.out.len() - self.out_at);
        buf[..n].copy_from_slice(&self.out[self.out_at..self.out_at + n]);
        self.out_at += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rewrite `text`, handing the reader its input `step` bytes at a time.
    fn rewrite(text: &str, step: usize) -> String {
        struct Trickle<'a>(&'a [u8], usize);
        impl Read for Trickle<'_> {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                let n = self.1.min(buf.len()).min(self.0.len());
                buf[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let mut out = String::new();
        PythonFloats::new(Trickle(text.as_bytes(), step))
            .read_to_string(&mut out)
            .unwrap();
        out
    }

    #[test]
    fn bare_tokens_become_null_and_strings_stay_as_they_are() {
        let text = r#"{"a": NaN, "b": -Infinity, "c": "NaN Infinity \" -Infinity \\", "d": [Infinity,-1.5,-Infinity], "e": -2}"#;
        let want = r#"{"a": null, "b": null, "c": "NaN Infinity \" -Infinity \\", "d": [null,-1.5,null], "e": -2}"#;
        for step in [1, 2, 3, 5, 7, text.len()] {
            assert_eq!(rewrite(text, step), want, "input {step} bytes at a time");
        }
    }

    #[test]
    fn text_that_only_starts_like_a_token_passes_through() {
        for (text, want) in [
            ("[Nope]", "[Nope]"),
            ("[-Inf]", "[-Inf]"),
            ("[--1]", "[--1]"),
            ("[-NaN]", "[-null]"),
            ("[Na", "[Na"),
            ("NaNNaN", "nullnull"),
        ] {
            for step in [1, 2, text.len()] {
                assert_eq!(rewrite(text, step), want, "{text} by {step}");
            }
        }
    }
}
