//! A root's checkpoints as a listing shows them: which are complete (their
//! manifest is there) or partial, the error of one that is not there, and
//! the one-line summary of a complete one (`snapcut snapshots list`).

use std::collections::{BTreeMap, BTreeSet};

use crate::error::Error;
use crate::protocol::CheckpointId;
use crate::store::manifest::{
    parse_checkpoint_dir, FileEntry, FileKind, FileRole, Manifest, HELD_FILE, HELD_TMP_FILE,
    MANIFEST_FILE,
};

/// What a checkpoint directory is, as a listing shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirState {
    /// Its manifest is there: restorable (once verified).
    Complete,
    /// A held record and no manifest: retention removed the checkpoint,
    /// the directory stays for the runs newer checkpoints read.
    Held,
    /// Neither: being written, or left by a crash or an abort.
    Partial,
}

/// Every checkpoint a listing of a root shows, with what its directory is
/// ([`DirState`]: a manifest makes it complete, else a held record held,
/// else partial). `listing`: `(path relative to the root, '/'-separated; is
/// a directory)`, from a recursive listing or from the root's entries plus
/// each checkpoint's manifest or held record. A checkpoint is a directory
/// whose name parses ([`parse_checkpoint_dir`]); on object stores, where
/// directories exist only as key prefixes, an entry under that name implies
/// it.
pub fn scan_listing<'a>(
    listing: impl IntoIterator<Item = (&'a str, bool)>,
) -> BTreeMap<CheckpointId, DirState> {
    let mut seen: BTreeMap<CheckpointId, (bool, bool)> = BTreeMap::new();
    for (id, rest, is_dir) in checkpoint_entries(listing) {
        let (manifest, held) = seen.entry(id).or_insert((false, false));
        if let Some(rest) = rest.filter(|_| !is_dir) {
            *manifest |= rest == MANIFEST_FILE;
            *held |= rest == HELD_FILE;
        }
    }
    seen.into_iter()
        .map(|(id, state)| {
            let state = match state {
                (true, _) => DirState::Complete,
                (false, true) => DirState::Held,
                (false, false) => DirState::Partial,
            };
            (id, state)
        })
        .collect()
}

/// The files a listing shows in each held directory (`scan`, from
/// [`scan_listing`] of the same listing), by name, the record and its
/// temporary name aside: what retention keeps or deletes there. A listing
/// must show a held directory's entries for them to be here.
pub fn held_files<'a>(
    listing: impl IntoIterator<Item = (&'a str, bool)>,
    scan: &BTreeMap<CheckpointId, DirState>,
) -> BTreeMap<CheckpointId, BTreeSet<String>> {
    let mut out: BTreeMap<CheckpointId, BTreeSet<String>> = scan
        .iter()
        .filter(|(_, s)| **s == DirState::Held)
        .map(|(id, _)| (*id, BTreeSet::new()))
        .collect();
    for (id, rest, is_dir) in checkpoint_entries(listing) {
        if let (Some(files), Some(name), false) = (out.get_mut(&id), rest, is_dir) {
            if !name.contains('/') && name != HELD_FILE && name != HELD_TMP_FILE {
                files.insert(name.to_string());
            }
        }
    }
    out
}

/// A listing's entries under checkpoint directories: `(id, the path below
/// the directory, is a directory)`.
fn checkpoint_entries<'a>(
    listing: impl IntoIterator<Item = (&'a str, bool)>,
) -> impl Iterator<Item = (CheckpointId, Option<&'a str>, bool)> {
    listing.into_iter().filter_map(|(path, is_dir)| {
        let (first, rest) = match path.split_once('/') {
            Some((first, rest)) => (first, Some(rest)),
            None => (path, None),
        };
        let id = parse_checkpoint_dir(first)?;
        // A file named like a checkpoint is not one.
        (rest.is_some() || is_dir).then_some((id, rest, is_dir))
    })
}

/// The error of reading the manifest of checkpoint `id` that is not there:
/// with its directory `dir` present the checkpoint is partial, or held (a
/// held record there: retention removed it), else it does not exist under
/// `root`.
pub fn missing_manifest(id: CheckpointId, dir: &str, root: &str, found: Option<DirState>) -> Error {
    Error::Snapshot(match found {
        Some(DirState::Held) => format!(
            "checkpoint {id} was removed by retention: {dir} holds only runs newer \
             checkpoints read ({HELD_FILE}) and cannot be restored"
        ),
        Some(_) => format!(
            "checkpoint {id} has no {MANIFEST_FILE} in {dir}: it is partial (crashed or \
             aborted before commit) and cannot be restored"
        ),
        None => format!("checkpoint {id} does not exist under {root}"),
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
        let listing = [
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
            // held: a record, no manifest; its files are listed
            ("chk-00000000/held.json", false),
            ("chk-00000000/a-0.run-1-2.state.arrow", false),
            ("chk-00000000/held.json.tmp", false),
            ("chk-00000000/sub/x", false),
            // both: the manifest wins (a demotion cut short)
            ("chk-00000009/held.json", false),
            ("chk-00000009/manifest.json", false),
        ];
        let scan = scan_listing(listing);
        use DirState::*;
        let want: BTreeMap<CheckpointId, DirState> = [
            (0, Held),
            (1, Complete),
            (2, Partial),
            (3, Complete),
            (4, Partial),
            (6, Partial),
            (9, Complete),
        ]
        .into();
        assert_eq!(scan, want);
        let held = held_files(listing, &scan);
        let want_held: BTreeMap<CheckpointId, BTreeSet<String>> =
            [(0, BTreeSet::from(["a-0.run-1-2.state.arrow".to_string()]))].into();
        assert_eq!(held, want_held);
        let plan = retention_of_root(
            &scan,
            &held,
            |id| {
                if id == 3 {
                    Err(Error::Snapshot("unreadable".into()))
                } else {
                    Ok(manifest(id, false, &[&[id]]))
                }
            },
            1,
        );
        // 3 is unreadable (kept), 9 is the newest complete one; in progress
        // 2, 4 and 6 keep 1; nothing reads the held 0.
        assert_eq!(plan.remove, Vec::<CheckpointId>::new());
        assert_eq!(plan.release, vec![0]);
        assert!(missing_manifest(2, "r/chk-00000002", "r", Some(Partial))
            .to_string()
            .contains("is partial"));
        assert!(missing_manifest(0, "r/chk-00000000", "r", Some(Held))
            .to_string()
            .contains("removed by retention"));
        assert!(missing_manifest(9, "r/chk-00000009", "r", None)
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
