//! A root's checkpoints as a listing shows them: which are complete (their
//! manifest is there) or partial, the error of one that is not there, and
//! the one-line summary of a complete one (`snapcut snapshots list`).

use std::collections::BTreeMap;

use crate::error::Error;
use crate::protocol::CheckpointId;
use crate::store::manifest::{
    parse_checkpoint_dir, FileEntry, FileKind, FileRole, Manifest, MANIFEST_FILE,
};

/// Every checkpoint a listing of a root shows, with whether it is complete
/// (its manifest is there) or partial (a directory without one). `listing`:
/// `(path relative to the root, '/'-separated; is a directory)`, from a
/// recursive listing or from the root's entries plus each checkpoint's
/// manifest. A checkpoint is a directory whose name parses
/// ([`parse_checkpoint_dir`]); on object stores, where directories exist
/// only as key prefixes, an entry under that name implies it.
pub fn scan_listing<'a>(
    listing: impl IntoIterator<Item = (&'a str, bool)>,
) -> BTreeMap<CheckpointId, bool> {
    let mut out = BTreeMap::new();
    for (path, is_dir) in listing {
        let (first, rest) = match path.split_once('/') {
            Some((first, rest)) => (first, Some(rest)),
            None => (path, None),
        };
        let Some(id) = parse_checkpoint_dir(first) else {
            continue;
        };
        match rest {
            None if !is_dir => {}
            None => {
                out.entry(id).or_insert(false);
            }
            Some(rest) => {
                let complete = out.entry(id).or_insert(false);
                *complete |= rest == MANIFEST_FILE && !is_dir;
            }
        }
    }
    out
}

/// The error of reading the manifest of checkpoint `id` that is not there:
/// with its directory `dir` present the checkpoint is partial, else it does
/// not exist under `root`.
pub fn missing_manifest(id: CheckpointId, dir: &str, root: &str, dir_exists: bool) -> Error {
    Error::Snapshot(if dir_exists {
        format!(
            "checkpoint {id} has no {MANIFEST_FILE} in {dir}: it is partial (crashed or \
             aborted before commit) and cannot be restored"
        )
    } else {
        format!("checkpoint {id} does not exist under {root}")
    })
}

/// A complete checkpoint as a listing shows it (`snapcut snapshots list`).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Summary {
    pub id: CheckpointId,
    pub committed_ms: u64,
    /// `"spark"` when an engine's `"spark"` record is there (the Spark
    /// helper and sink), else `"local"`.
    pub engine: &'static str,
    pub protocol: String,
    /// `diff` when a state file is a diff (a restore reads a chain), `full`
    /// when every one is full, none without state.
    pub kind: Option<FileKind>,
    pub files: usize,
    pub bytes: u64,
    /// Rows of every file but the source offsets.
    pub records: u64,
    /// The longest chain a state file is rebuilt from (the first of the
    /// longest), or `[id]`; for a state listing runs, the checkpoints that
    /// hold them.
    pub chain: Vec<CheckpointId>,
    /// The most files a task's state here is rebuilt from: its runs, or
    /// its chain (format 1); 0 without state.
    pub runs: usize,
    pub savepoint: bool,
}

/// What [`Summary`] says of `manifest`.
pub fn summarize(manifest: &Manifest) -> Summary {
    let state: Vec<&FileEntry> = manifest
        .files
        .iter()
        .filter(|f| f.role == FileRole::State)
        .collect();
    let kind = if state.iter().any(|f| f.kind == Some(FileKind::Diff)) {
        Some(FileKind::Diff)
    } else if state.is_empty() {
        None
    } else {
        Some(FileKind::Full)
    };
    let longest = state
        .iter()
        .map(|f| &f.chain)
        .fold(None, |best, c| match best {
            Some(b) if Vec::len(b) >= c.len() => Some(b),
            _ => Some(c),
        });
    let chain = match longest {
        Some(c) if !c.is_empty() => c.clone(),
        _ => vec![manifest.checkpoint_id],
    };
    Summary {
        id: manifest.checkpoint_id,
        committed_ms: manifest.committed_ms,
        engine: if manifest.extra.contains_key("spark") {
            "spark"
        } else {
            "local"
        },
        protocol: manifest.protocol.clone(),
        kind,
        files: manifest.files.len(),
        bytes: manifest.files.iter().map(|f| f.bytes).sum(),
        records: manifest
            .files
            .iter()
            .filter(|f| f.role != FileRole::Sources)
            .map(|f| f.rows)
            .sum(),
        chain,
        runs: state
            .iter()
            .map(|f| match f.runs.len() {
                0 => f.chain.len().max(1),
                n => n,
            })
            .max()
            .unwrap_or(0),
        savepoint: manifest.savepoint,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::format::retention_of_root;
    use crate::store::format::testing::manifest;

    #[test]
    fn a_listing_classifies_checkpoints_by_their_manifest() {
        let scan = scan_listing([
            ("chk-00000001", true),
            ("chk-00000001/manifest.json", false),
            ("chk-00000002", true),
            ("chk-00000002/manifest.json.tmp", false),
            // an object store: the directory only as a key prefix
            ("chk-00000003/manifest.json", false),
            ("chk-00000004/a-0.state.arrow", false),
            ("chk-00000005", false),              // a file, not a checkpoint
            ("chk-00000006/manifest.json", true), // a directory, not a manifest
            ("chk-7", true),
            ("_staging/chk-00000008/manifest.json", false),
        ]);
        let want: BTreeMap<CheckpointId, bool> =
            [(1, true), (2, false), (3, true), (4, false), (6, false)].into();
        assert_eq!(scan, want);
        let removed = retention_of_root(
            &scan,
            |id| {
                if id == 3 {
                    Err(Error::Snapshot("unreadable".into()))
                } else {
                    Ok(manifest(id, false, &[&[id]]))
                }
            },
            1,
        );
        // 3 is unreadable (kept), 1 is the newest complete one: nothing to
        // delete; in progress 2, 4 and 6 keep 1 too.
        assert_eq!(removed, Vec::<CheckpointId>::new());
        assert!(missing_manifest(2, "r/chk-00000002", "r", true)
            .to_string()
            .contains("is partial"));
        assert!(missing_manifest(9, "r/chk-00000009", "r", false)
            .to_string()
            .contains("does not exist under r"));
    }

    #[test]
    fn a_summary_takes_the_first_longest_chain() {
        let m = manifest(4, true, &[&[2, 3, 4], &[1, 2, 4], &[4]]);
        let s = summarize(&m);
        assert_eq!((s.chain, s.runs), (vec![2, 3, 4], 3));
        assert_eq!(
            (s.kind, s.engine, s.savepoint),
            (Some(FileKind::Diff), "local", true)
        );
        let empty = summarize(&manifest(5, false, &[]));
        assert_eq!((empty.kind, empty.chain), (None, vec![5]));
    }
}
