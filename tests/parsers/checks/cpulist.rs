//! `topology::cpulist`: the kernel's `0-3,8` lists (`online`, `nodeN/cpulist`,
//! `thread_siblings_list`, `Cpus_allowed_list`).

use chd::topology::cpulist::{self, CpuListError, MAX_CPU_ID};

/// A list that parses is sorted, unique, within [`MAX_CPU_ID`], and prints to a list that
/// parses back to the same ids; a list that does not names a token of the input.
pub fn check(data: &[u8]) {
    let Some(text) = super::text(data) else {
        return;
    };
    match cpulist::parse(text) {
        Ok(ids) => {
            assert!(
                ids.windows(2).all(|w| w[0] < w[1]),
                "not sorted and unique: {ids:?}"
            );
            assert!(
                ids.iter().all(|&id| id < MAX_CPU_ID),
                "id out of range: {ids:?}"
            );
            round_trips(&ids);
        }
        Err(e) => {
            let token = match &e {
                CpuListError::BadToken { token, .. }
                | CpuListError::ReversedRange { token, .. } => token,
            };
            assert!(
                text.contains(token.as_str()),
                "{e} names no token of {text:?}"
            );
            assert!(e.to_string().contains(&format!("{token:?}")), "{e}");
        }
    }
}

/// Largest id `round_trips` may be given, exclusive.
pub const MAX_ID: u32 = MAX_CPU_ID;

/// `format` then `parse` gives the ids back, sorted and deduplicated.
pub fn round_trips(ids: &[u32]) {
    let printed = cpulist::format(ids);
    let mut want = ids.to_vec();
    want.sort_unstable();
    want.dedup();
    assert_eq!(
        cpulist::parse(&printed).as_ref(),
        Ok(&want),
        "printed {printed:?}"
    );
}
