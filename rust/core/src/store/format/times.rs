//! A full state file's time index stored beside it (format 5): its entry,
//! and the checks a restore makes of it before it takes it as the index's
//! base run. The file is written by the store (`store::time_files`).

use arrow_array::RecordBatch;

use super::entries::sidecar_entry;
use crate::error::{Error, Result};
use crate::snapshot::TaskId;
use crate::state::{time_run_schema, TIME_METADATA};
use crate::store::manifest::{times_file_name, FileEntry, TimesEntry, TIMES_ROLE};

use super::Written;

/// The entry of the time index of `column` written (`written`) beside the
/// full state file `state_path`.
pub fn times_entry(state_path: &str, column: &str, written: &Written) -> TimesEntry {
    TimesEntry {
        path: times_file_name(state_path),
        column: column.to_string(),
        rows: written.rows,
        bytes: written.bytes,
        crc32c: written.crc32c,
    }
}

/// A stored time index as an entry of `task`, to be read and checked like
/// a manifest's file (role [`TIMES_ROLE`]).
pub fn times_file_entry(times: &TimesEntry, task: Option<&TaskId>) -> FileEntry {
    let written = Written {
        rows: times.rows,
        bytes: times.bytes,
        crc32c: times.crc32c,
    };
    sidecar_entry(&times.path, TIMES_ROLE, written, task)
}

/// Checks a stored time index's rows (its bytes checked against its entry
/// already) against its entry and what a time index run is: the columns of
/// one, its time column named as the entry names it, as many entries as the
/// entry says. `what` names the file. Its order is checked when it becomes
/// a run.
pub fn check_times(batch: &RecordBatch, entry: &TimesEntry, what: &str) -> Result<()> {
    let schema = batch.schema();
    let want = time_run_schema();
    if schema.fields() != want.fields() {
        return Err(Error::Snapshot(format!(
            "{what}: not a time index: its columns are {}, a time index's {}",
            fields_of(&schema),
            fields_of(&want)
        )));
    }
    let column = schema.metadata().get(TIME_METADATA);
    if column != Some(&entry.column) {
        return Err(Error::Snapshot(format!(
            "{what}: indexes time column {column:?}, its entry says '{}'",
            entry.column
        )));
    }
    if batch.num_rows() as u64 != entry.rows {
        return Err(Error::Snapshot(format!(
            "{what}: holds {} entries, its entry says {}",
            batch.num_rows(),
            entry.rows
        )));
    }
    Ok(())
}

fn fields_of(schema: &arrow_schema::Schema) -> String {
    let names: Vec<String> = schema
        .fields()
        .iter()
        .map(|f| format!("{} {}", f.name(), f.data_type()))
        .collect();
    format!("({})", names.join(", "))
}
