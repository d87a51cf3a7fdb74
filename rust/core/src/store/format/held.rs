//! A held directory's record: what stays of a checkpoint retention removed
//! while newer checkpoints still read some of its files (their runs).

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::protocol::CheckpointId;

/// Value of a held record's `format` field.
pub const HELD_FORMAT: &str = "snapcut-held";
/// The held record version this code writes and reads.
pub const HELD_FORMAT_VERSION: u32 = 1;

/// Contents of `held.json`. Informational: retention decides from the
/// manifests it keeps, and readers find a run's file through the manifest
/// naming it; the record only marks the directory as held (not partial).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldRecord {
    pub format: String,
    pub format_version: u32,
    pub checkpoint_id: CheckpointId,
    /// The files held, by name, sorted.
    pub files: Vec<String>,
    /// The complete checkpoints that read them when the record was written.
    pub read_by: Vec<CheckpointId>,
}

/// The record of checkpoint `id`'s directory holding `files` for `read_by`.
pub fn held_record(
    id: CheckpointId,
    files: impl IntoIterator<Item = String>,
    read_by: impl IntoIterator<Item = CheckpointId>,
) -> HeldRecord {
    let mut files: Vec<String> = files.into_iter().collect();
    files.sort();
    files.dedup();
    let mut read_by: Vec<CheckpointId> = read_by.into_iter().collect();
    read_by.sort_unstable();
    read_by.dedup();
    HeldRecord {
        format: HELD_FORMAT.into(),
        format_version: HELD_FORMAT_VERSION,
        checkpoint_id: id,
        files,
        read_by,
    }
}

pub fn held_bytes(record: &HeldRecord) -> Vec<u8> {
    serde_json::to_vec_pretty(record).expect("held record serialises")
}

/// Parses the held record of checkpoint `id` (`what` names it in errors).
pub fn parse_held(bytes: &[u8], what: &str, id: CheckpointId) -> Result<HeldRecord> {
    let record: HeldRecord = serde_json::from_slice(bytes)
        .map_err(|e| Error::Snapshot(format!("{what} is not a held record: {e}")))?;
    if record.format != HELD_FORMAT {
        return Err(Error::Snapshot(format!(
            "{what} has format '{}', expected '{HELD_FORMAT}'",
            record.format
        )));
    }
    if record.format_version > HELD_FORMAT_VERSION {
        return Err(Error::Snapshot(format!(
            "{what} has format_version {}, newer than the {HELD_FORMAT_VERSION} this snapcut \
             reads: upgrade snapcut to read it",
            record.format_version
        )));
    }
    if record.checkpoint_id != id {
        return Err(Error::Snapshot(format!(
            "{what} names checkpoint {}, expected {id}",
            record.checkpoint_id
        )));
    }
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_and_is_checked() {
        let r = held_record(7, ["b".into(), "a".into(), "a".into()], [9, 8, 9]);
        assert_eq!(
            (r.files.clone(), r.read_by.clone()),
            (vec!["a".into(), "b".into()], vec![8, 9])
        );
        assert_eq!(parse_held(&held_bytes(&r), "held", 7).unwrap(), r);
        let e = parse_held(&held_bytes(&r), "held", 8).unwrap_err();
        assert!(e.to_string().contains("expected 8"), "{e}");
        let newer = HeldRecord {
            format_version: 2,
            ..r.clone()
        };
        let e = parse_held(&held_bytes(&newer), "held", 7).unwrap_err();
        assert!(e.to_string().contains("upgrade snapcut"), "{e}");
        assert!(parse_held(b"{}", "held", 7).is_err());
    }
}
