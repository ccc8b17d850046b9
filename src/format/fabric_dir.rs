//! A state directory's fabric results (`<state_dir>/fabric/`, [`super::fabric`]) read again and
//! again by a long-running reader (`chd serve`'s collector, its verdict, its ledger page): a
//! file is parsed again only when its modification time or size changed, and each listing
//! has a stamp that changes whenever any file did, so a reader can keep what it built from
//! the records until then.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use super::fabric::{self, FabricFileError, FabricRecord};

/// A file's identity for the parse cache.
type Stamp = (Option<SystemTime>, u64);

/// A file's parse: its record, or why it has none.
type Parsed = Result<FabricRecord, String>;

/// The fabric directory of one state directory, with its parse cache.
#[derive(Debug)]
pub struct FabricDir {
    dir: PathBuf,
    cache: Mutex<HashMap<PathBuf, (Stamp, Parsed)>>,
}

/// What the directory holds now.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Listing {
    /// The records, in file name order.
    pub records: Vec<FabricRecord>,
    /// Files that could not be read or parsed, with why.
    pub unreadable: Vec<(PathBuf, String)>,
    /// Changes whenever a file appears, goes, or changes (0: no directory).
    pub stamp: u64,
}

impl FabricDir {
    /// The fabric directory of `state_dir`.
    pub fn of_state_dir(state_dir: &Path) -> FabricDir {
        FabricDir {
            dir: fabric::dir_of(state_dir),
            cache: Mutex::default(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The directory's files with their stamps, and the listing's stamp (0: no directory).
    #[allow(clippy::type_complexity)]
    fn scan(&self) -> Result<Option<(Vec<(PathBuf, Stamp)>, u64)>, FabricFileError> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(FabricFileError::Io {
                    path: self.dir.clone(),
                    source,
                })
            }
        };
        let mut files: Vec<(PathBuf, Stamp)> = entries
            .flatten()
            .filter(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                name.ends_with(".json") && !name.starts_with('.')
            })
            // A file removed between listing and reading is simply gone.
            .filter_map(|e| {
                let m = e.metadata().ok()?;
                Some((e.path(), (m.modified().ok(), m.len())))
            })
            .collect();
        files.sort();
        let mut hasher = DefaultHasher::new();
        files.hash(&mut hasher);
        Ok(Some((files, hasher.finish().max(1))))
    }

    /// The stamp of the directory now, without reading a file: it changes whenever a file
    /// appears, goes or changes (0: no directory).
    pub fn stamp(&self) -> Result<u64, FabricFileError> {
        Ok(self.scan()?.map_or(0, |(_, stamp)| stamp))
    }

    /// The directory's records now (none when it does not exist); only a directory that
    /// cannot be listed is an error, a file that cannot be read costs only itself.
    pub fn list(&self) -> Result<Listing, FabricFileError> {
        let Some((files, stamp)) = self.scan()? else {
            return Ok(Listing::default());
        };
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let mut listing = Listing {
            stamp,
            ..Listing::default()
        };
        for (path, stamp) in &files {
            let fresh = !matches!(cache.get(path), Some((s, _)) if s == stamp);
            if fresh {
                let parsed = match fabric::read(path) {
                    Ok(r) => Ok(r),
                    Err(FabricFileError::Io { source, .. })
                        if source.kind() == io::ErrorKind::NotFound =>
                    {
                        continue
                    }
                    Err(e) => {
                        tracing::warn!("fabric results: {e}");
                        Err(e.to_string())
                    }
                };
                cache.insert(path.clone(), (*stamp, parsed));
            }
            match &cache[path].1 {
                Ok(r) => listing.records.push(r.clone()),
                Err(e) => listing.unreadable.push((path.clone(), e.clone())),
            }
        }
        cache.retain(|p, _| files.iter().any(|(f, _)| f == p));
        Ok(listing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::fabric::samples;

    fn record(run: &str, peer: &str) -> FabricRecord {
        samples::record(run, peer, 2.0, Vec::new())
    }

    #[test]
    fn the_stamp_changes_with_the_files_and_a_bad_file_costs_only_itself() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = FabricDir::of_state_dir(tmp.path());
        let none = dir.list().unwrap();
        assert_eq!(none, Listing::default(), "no directory: nothing, stamp 0");

        fabric::write(dir.path(), &record("1", "b")).unwrap();
        let one = dir.list().unwrap();
        assert_eq!(one.records.len(), 1);
        assert_ne!(one.stamp, 0);
        assert_eq!(dir.list().unwrap().stamp, one.stamp, "nothing changed");
        assert_eq!(
            dir.stamp().unwrap(),
            one.stamp,
            "the same stamp without reading"
        );

        std::fs::write(dir.path().join("2__c.json"), b"{\"schema\": 1, \"run\": ").unwrap();
        let two = dir.list().unwrap();
        assert_ne!(two.stamp, one.stamp);
        assert_eq!(two.records.len(), 1, "the good record stays");
        assert_eq!(two.unreadable.len(), 1);
        assert!(
            two.unreadable[0].1.contains("not a fabric result"),
            "{two:?}"
        );

        std::fs::remove_file(dir.path().join("2__c.json")).unwrap();
        assert_eq!(
            dir.list().unwrap().stamp,
            one.stamp,
            "back to the same files"
        );
    }
}
