//! Opening a vendor runtime library at run time: an explicit path, or the first of a list of
//! sonames that loads. Failures keep every attempt with libloading's full error chain, so
//! "libcudart.so: cannot open shared object file" reaches the user instead of a terse code.
//! [`record_lookups`] lists the symbols a loader asks for, so tests can check a loader's
//! declarations against a real vendor library without a second copy of the list.

// FFI: dlopen (runs the library's initialisers), typed symbol lookup, C strings.
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::error::Error as _;
use std::path::Path;

use libloading::Library;

/// Why no candidate loaded.
#[derive(Debug, thiserror::Error)]
#[error("cannot load the {what} library: {}", summarize(.attempts))]
pub struct LoadError {
    pub what: &'static str,
    /// (name or path tried, why it failed)
    pub attempts: Vec<(String, String)>,
}

/// One line for all attempts: names that failed the same way share one reason.
fn summarize(attempts: &[(String, String)]) -> String {
    let mut groups: Vec<(Vec<&str>, &str)> = Vec::new();
    for (name, detail) in attempts {
        let reason = detail
            .strip_prefix(name.as_str())
            .and_then(|r| r.strip_prefix(": "))
            .unwrap_or(detail);
        match groups.iter_mut().find(|(_, r)| *r == reason) {
            Some((names, _)) => names.push(name),
            None => groups.push((vec![name], reason)),
        }
    }
    groups
        .iter()
        .map(|(names, reason)| format!("{}: {reason}", names.join(", ")))
        .collect::<Vec<_>>()
        .join("; ")
}

/// A symbol the library lacks.
#[derive(Debug, thiserror::Error)]
#[error("{library} lacks symbol {symbol}: {detail}")]
pub struct SymbolError {
    pub library: String,
    pub symbol: &'static str,
    pub detail: String,
}

/// The full source chain of an error, joined with ": ".
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let next = s.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = s.source();
    }
    text
}

/// Copy a C string returned by a vendor library into an owned String (empty for NULL).
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string.
pub(crate) unsafe fn c_text(p: *const std::ffi::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: `p` is not NULL (checked above) and, by this function's contract, points to a
    // NUL-terminated string; the borrow ends here, the text is copied.
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}

/// One symbol lookup a loader made, as [`record_lookups`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lookup {
    pub symbol: &'static str,
    /// Whether the library had it (optional entry points may be missing).
    pub found: bool,
}

thread_local! {
    static LOOKUPS: RefCell<Option<Vec<Lookup>>> = const { RefCell::new(None) };
}

/// Run `load` (a loader such as `CudaRuntime::load`) and return its result with every symbol
/// lookup it made on this thread, in order: the entry points that loader declares.
pub fn record_lookups<R>(load: impl FnOnce() -> R) -> (R, Vec<Lookup>) {
    let outer = LOOKUPS.with(|l| l.borrow_mut().replace(Vec::new()));
    let result = load();
    let lookups = LOOKUPS.with(|l| std::mem::replace(&mut *l.borrow_mut(), outer));
    (result, lookups.unwrap_or_default())
}

/// Open `explicit` if given, else the first of `candidates` that loads. Returns the library
/// and the name or path that worked.
pub fn open(
    what: &'static str,
    explicit: Option<&Path>,
    candidates: &[&str],
) -> Result<(Library, String), LoadError> {
    let names: Vec<String> = match explicit {
        Some(p) => vec![p.display().to_string()],
        None => candidates.iter().map(|c| c.to_string()).collect(),
    };
    let mut attempts = Vec::new();
    for name in names {
        // SAFETY: loading a vendor runtime runs its initialisers; these are the libraries the
        // user asked for (or the standard sonames of the runtime), loaded once per process.
        match unsafe { Library::new(&name) } {
            Ok(lib) => return Ok((lib, name)),
            Err(e) => {
                let mut detail = e.to_string();
                if let Some(s) = e.source() {
                    detail = format!("{detail}: {}", chain(s));
                }
                attempts.push((name, detail));
            }
        }
    }
    Err(LoadError { what, attempts })
}

/// Resolve one symbol as a copied function pointer.
///
/// # Safety
/// `T` must be the exact function-pointer type of the symbol's C declaration, and the
/// returned pointer must not outlive `lib`.
pub unsafe fn symbol<T: Copy>(
    lib: &Library,
    library: &str,
    name: &'static str,
) -> Result<T, SymbolError> {
    let mut bytes = Vec::with_capacity(name.len() + 1);
    bytes.extend_from_slice(name.as_bytes());
    bytes.push(0);
    // SAFETY: `bytes` is NUL-terminated; by this function's contract `T` is the symbol's
    // C function-pointer type and the copied pointer does not outlive `lib`.
    let found = unsafe { lib.get::<T>(&bytes) }.map(|s| *s);
    LOOKUPS.with(|l| {
        if let Some(lookups) = l.borrow_mut().as_mut() {
            lookups.push(Lookup {
                symbol: name,
                found: found.is_ok(),
            });
        }
    });
    found.map_err(|e| SymbolError {
        library: library.to_string(),
        symbol: name,
        detail: chain(&e),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_library_lists_every_attempt() {
        let err = open(
            "CUDA runtime",
            None,
            &["libchd-nope-1.so", "libchd-nope-2.so"],
        )
        .expect_err("must fail");
        let text = err.to_string();
        assert!(
            text.starts_with("cannot load the CUDA runtime library: "),
            "{text}"
        );
        assert!(
            text.contains("libchd-nope-1.so, libchd-nope-2.so: "),
            "{text}"
        );
        assert_eq!(
            text.matches("cannot open shared object file").count(),
            1,
            "{text}"
        );
        assert!(
            text.contains("No such file") || text.contains("cannot open"),
            "{text}"
        );
    }

    #[test]
    fn explicit_path_is_the_only_attempt() {
        let err = open(
            "NVML",
            Some(Path::new("/nonexistent/libnvidia-ml.so.1")),
            &["libc.so.6"],
        )
        .expect_err("must fail");
        assert_eq!(err.attempts.len(), 1);
        assert_eq!(err.attempts[0].0, "/nonexistent/libnvidia-ml.so.1");
    }

    #[test]
    fn symbols_resolve_and_missing_ones_are_named() {
        let (lib, name) = open("C library", None, &["libc.so.6"]).expect("libc loads");
        // SAFETY: getpid's C type is `pid_t getpid(void)`.
        let getpid: unsafe extern "C" fn() -> libc::pid_t =
            unsafe { symbol(&lib, &name, "getpid") }.unwrap();
        // SAFETY: getpid has no preconditions.
        assert_eq!(unsafe { getpid() }, std::process::id() as libc::pid_t);
        // SAFETY: the lookup only reads libc's symbol table; the symbol is missing, nothing is
        // called.
        let missing = unsafe { symbol::<unsafe extern "C" fn()>(&lib, &name, "chd_no_such_fn") };
        let text = missing.err().unwrap().to_string();
        assert!(text.contains("lacks symbol chd_no_such_fn"), "{text}");
    }

    #[test]
    fn lookups_are_recorded_in_order_found_or_not_and_only_while_asked() {
        let (lib, name) = open("C library", None, &["libc.so.6"]).expect("libc loads");
        // SAFETY: the lookups only read libc's symbol table; the `fn()` pointers are never
        // called, the type is only carried.
        let look = |wanted| unsafe { symbol::<unsafe extern "C" fn()>(&lib, &name, wanted) };
        let _ = look("getpid");
        let ((), lookups) = record_lookups(|| {
            let _ = look("getpid");
            let ((), inner) = record_lookups(|| {
                let _ = look("chd_no_such_fn");
            });
            assert_eq!(
                inner,
                [Lookup {
                    symbol: "chd_no_such_fn",
                    found: false
                }]
            );
            let _ = look("getppid");
        });
        assert_eq!(
            lookups,
            [
                Lookup {
                    symbol: "getpid",
                    found: true
                },
                Lookup {
                    symbol: "getppid",
                    found: true
                }
            ]
        );
    }
}
