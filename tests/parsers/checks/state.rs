//! `state.json`: `format::state_file::decode` and the store it restores
//! (`store::persist::decode`).

use chd::format::state_file;
use chd::store::persist;

/// A file that decodes encodes to a file that decodes to the same records, and the store
/// it restores saves to a file that restores the same store.
pub fn check(data: &[u8]) {
    let Ok(file) = state_file::decode(data) else {
        return;
    };
    let bytes = state_file::encode(&file).expect("a decoded file encodes");
    let again = state_file::decode(&bytes)
        .unwrap_or_else(|e| panic!("re-encoded file does not decode: {e}"));
    assert_eq!(file, again);
    // A record the store cannot use (a direction it does not know) is refused, by name.
    let Ok(store) = persist::decode(data) else {
        return;
    };
    let saved = state_file::encode(&persist::to_file(&store, file.saved_at)).expect("encodes");
    let restored =
        persist::decode(&saved).unwrap_or_else(|e| panic!("a saved store does not restore: {e}"));
    assert_eq!(store, restored);
}
