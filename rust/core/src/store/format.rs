//! The snapshot format's rules, with no I/O (in the style of
//! [`crate::protocol`]): encoding a file and its manifest entry, checking a
//! file's bytes against its entry, diff-chain resolution, rebuilding state
//! from a chain, building and parsing a manifest, the retention rule, and
//! planning a verification. The spec is `docs/format.md`.
//!
//! Everything that touches a filesystem calls these: the Rust store and
//! reader on local paths (`files.rs`, `reader.rs`, `sink.rs` keep only the
//! `std::fs` calls), and, through the bindings, the Python backend that moves
//! bytes for URIs (pyarrow filesystems, Spark executors).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::io::Write;
use std::sync::Arc;

use arrow_array::{Array, BooleanArray, RecordBatch, StringArray, UInt64Array};
use arrow_buffer::Buffer;
use arrow_ipc::convert::fb_to_schema;
use arrow_ipc::reader::{read_footer_length, FileDecoder};
use arrow_ipc::root_as_footer;
use arrow_ipc::writer::FileWriter;
use arrow_row::{RowConverter, SortField};
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use super::manifest::{
    parse_checkpoint_dir, FileEntry, FileKind, FileRole, Manifest, TaskEntry, FORMAT_NAME,
    FORMAT_VERSION, MANIFEST_FILE, SOURCES_FILE,
};
use crate::error::{Error, Result};
use crate::protocol::CheckpointId;
use crate::snapshot::{StateKind, TaskId};
use crate::state::{DELETED_COLUMN, KEY_METADATA};

// --- encoding ---------------------------------------------------------------

/// What encoding one file produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Written {
    pub rows: u64,
    pub bytes: u64,
    pub crc32c: u32,
}

/// Counts bytes and updates the CRC as they stream through.
struct Checksummed<W> {
    inner: W,
    crc: u32,
    bytes: u64,
}

impl<W: Write> Write for Checksummed<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc = crc32c::crc32c_append(self.crc, &buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Encodes `batches` as one Arrow IPC file into `out` (a file, or memory),
/// returning what was written and `out` back. `what` names it in errors;
/// an I/O error of `out` comes back as the `std::io::Error` it was.
pub fn encode_ipc_into<W: Write>(
    out: W,
    schema: &Schema,
    batches: &[RecordBatch],
    what: &str,
) -> std::result::Result<(W, Written), EncodeError> {
    let arrow = |e: arrow_schema::ArrowError| match e {
        arrow_schema::ArrowError::IoError(_, source) => EncodeError::Io(source),
        other => EncodeError::Format(Error::Snapshot(format!("encoding {what}: {other}"))),
    };
    let sink = Checksummed {
        inner: out,
        crc: 0,
        bytes: 0,
    };
    let mut writer = FileWriter::try_new(sink, schema).map_err(arrow)?;
    let mut rows = 0;
    for batch in batches {
        writer.write(batch).map_err(arrow)?;
        rows += batch.num_rows() as u64;
    }
    let sink = writer.into_inner().map_err(arrow)?;
    Ok((
        sink.inner,
        Written {
            rows,
            bytes: sink.bytes,
            crc32c: sink.crc,
        },
    ))
}

/// Why [`encode_ipc_into`] failed: the destination, or the data.
#[derive(Debug)]
pub enum EncodeError {
    Io(std::io::Error),
    Format(Error),
}

/// Encodes `batches` as the bytes of one Arrow IPC file.
pub fn encode_ipc(
    schema: &Schema,
    batches: &[RecordBatch],
    what: &str,
) -> Result<(Vec<u8>, Written)> {
    encode_ipc_into(Vec::new(), schema, batches, what).map_err(|e| match e {
        EncodeError::Io(e) => Error::io(format!("encoding {what}"), e),
        EncodeError::Format(e) => e,
    })
}

/// Decodes an Arrow IPC file without copying its buffers: the arrays are
/// slices of `bytes` (a restore of a large state reads it only once).
pub fn decode_ipc(bytes: Vec<u8>, what: &str) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    decode_buffer(Buffer::from_vec(bytes), what)
}

fn decode_buffer(buffer: Buffer, what: &str) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    let err = |e: String| Error::Snapshot(format!("{what} is not a readable Arrow IPC file: {e}"));
    if buffer.len() < 16 {
        return Err(err(format!("{} bytes is too short", buffer.len())));
    }
    let trailer = buffer.len() - 10;
    let footer_len = read_footer_length(buffer[trailer..].try_into().expect("10 bytes"))
        .map_err(|e| err(e.to_string()))?;
    let footer_start = trailer
        .checked_sub(footer_len)
        .ok_or_else(|| err("footer longer than the file".into()))?;
    let footer = root_as_footer(&buffer[footer_start..trailer]).map_err(|e| err(e.to_string()))?;
    let schema = Arc::new(fb_to_schema(
        footer
            .schema()
            .ok_or_else(|| err("no schema in the footer".into()))?,
    ));
    let mut decoder = FileDecoder::new(schema.clone(), footer.version());
    let block_data = |offset: i64, meta: i32, body: i64| -> Result<Buffer> {
        let start = usize::try_from(offset).map_err(|_| err("negative block offset".into()))?;
        let len = meta as usize + body as usize;
        if start + len > buffer.len() {
            return Err(err("block past the end of the file".into()));
        }
        Ok(buffer.slice_with_length(start, len))
    };
    for block in footer.dictionaries().iter().flatten() {
        let data = block_data(block.offset(), block.metaDataLength(), block.bodyLength())?;
        decoder
            .read_dictionary(block, &data)
            .map_err(|e| err(e.to_string()))?;
    }
    let mut batches = Vec::new();
    for block in footer.recordBatches().iter().flatten() {
        let data = block_data(block.offset(), block.metaDataLength(), block.bodyLength())?;
        if let Some(batch) = decoder
            .read_record_batch(block, &data)
            .map_err(|e| err(e.to_string()))?
        {
            batches.push(batch);
        }
    }
    Ok((schema, batches))
}

/// The batches of a file as one batch (state files are read whole).
pub fn concat(schema: &SchemaRef, batches: &[RecordBatch]) -> Result<RecordBatch> {
    if let [one] = batches {
        return Ok(one.clone());
    }
    arrow_select::concat::concat_batches(schema, batches)
        .map_err(|e| Error::Snapshot(format!("state batches do not concatenate: {e}")))
}

// --- manifest entries of the files a checkpoint holds ------------------------

fn bare_entry(path: &str, role: FileRole, written: Written) -> FileEntry {
    FileEntry {
        path: path.into(),
        role,
        rows: written.rows,
        bytes: written.bytes,
        crc32c: written.crc32c,
        vertex: None,
        subtask: None,
        kind: None,
        base: None,
        chain: Vec::new(),
        key: None,
        edge: None,
        input: None,
        from_subtask: None,
        extra: Default::default(),
    }
}

/// The entry of a file of a role this format leaves to its writer (the
/// Spark sink's `output`), with the writer's own `fields`.
pub fn other_entry(
    path: &str,
    role: &str,
    written: Written,
    fields: serde_json::Map<String, serde_json::Value>,
) -> FileEntry {
    FileEntry {
        extra: fields,
        ..bare_entry(path, FileRole::from(role.to_string()), written)
    }
}

/// The entry of `task`'s state file (`written` still to be filled in when
/// the bytes are written later): full, or a diff against `base`.
pub fn state_entry(
    task: &TaskId,
    key: Option<String>,
    base: Option<CheckpointId>,
    written: Written,
) -> FileEntry {
    FileEntry {
        vertex: Some(task.vertex.clone()),
        subtask: Some(task.subtask),
        kind: Some(if base.is_some() {
            FileKind::Diff
        } else {
            FileKind::Full
        }),
        base,
        key,
        ..bare_entry(&super::state_file_name(task), FileRole::State, written)
    }
}

/// The entry of a channel file of `task` (recorded from `edge`'s `from_subtask`).
pub fn channel_entry(
    task: &TaskId,
    edge: &str,
    input: usize,
    from_subtask: usize,
    written: Written,
) -> FileEntry {
    FileEntry {
        vertex: Some(task.vertex.clone()),
        subtask: Some(task.subtask),
        edge: Some(edge.into()),
        input: Some(input),
        from_subtask: Some(from_subtask),
        ..bare_entry(
            &super::channel_file_name(task, edge, from_subtask),
            FileRole::Channel,
            written,
        )
    }
}

/// The state table to store for `task`, checked: it names its key column
/// (schema metadata `snapcut.key`, set here), a diff has its `__deleted`
/// column.
pub fn state_batch(batch: &RecordBatch, key: &str, diff: bool) -> Result<RecordBatch> {
    let schema = batch.schema();
    if schema.index_of(key).is_err() {
        return Err(Error::Snapshot(format!(
            "state table has no key column '{key}'"
        )));
    }
    if diff && schema.index_of(DELETED_COLUMN).is_err() {
        return Err(Error::Snapshot(format!(
            "a diff needs a base id and a boolean '{DELETED_COLUMN}' column"
        )));
    }
    let mut metadata = schema.metadata().clone();
    metadata.insert(KEY_METADATA.into(), key.into());
    let schema = Arc::new(Schema::new_with_metadata(schema.fields().clone(), metadata));
    batch
        .clone()
        .with_schema(schema)
        .map_err(|e| Error::Snapshot(format!("state table: {e}")))
}

/// `batch` sorted by its `key` column, ascending, nulls last: a state file
/// written from a table's capture has deterministic bytes (a retry or a
/// duplicate task rewrites the same file).
pub fn sort_by_key(batch: &RecordBatch, key: &str) -> Result<RecordBatch> {
    let at = batch
        .schema()
        .index_of(key)
        .map_err(|_| Error::Snapshot(format!("state table has no key column '{key}'")))?;
    let column = batch.column(at);
    let field = SortField::new_with_options(
        column.data_type().clone(),
        arrow_schema::SortOptions {
            descending: false,
            nulls_first: false,
        },
    );
    let err = |e: arrow_schema::ArrowError| Error::Snapshot(format!("sorting by '{key}': {e}"));
    let rows = RowConverter::new(vec![field])
        .and_then(|c| c.convert_columns(std::slice::from_ref(column)))
        .map_err(err)?;
    let mut order: Vec<u32> = (0..batch.num_rows() as u32).collect();
    order.sort_by(|a, b| rows.row(*a as usize).cmp(&rows.row(*b as usize)));
    if order.iter().enumerate().all(|(i, j)| i as u32 == *j) {
        return Ok(batch.clone());
    }
    let indices = arrow_array::UInt32Array::from(order);
    arrow_select::take::take_record_batch(batch, &indices).map_err(err)
}

/// Schema of `sources.arrow`.
pub fn sources_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("vertex", DataType::Utf8, false),
        Field::new("subtask", DataType::UInt64, false),
        Field::new("offset", DataType::UInt64, false),
    ]))
}

/// `sources.arrow`'s rows: every task with a source offset, in `tasks` order.
pub fn sources_batch(tasks: &[TaskEntry]) -> RecordBatch {
    let sources: Vec<&TaskEntry> = tasks.iter().filter(|t| t.source_offset.is_some()).collect();
    RecordBatch::try_new(
        sources_schema(),
        vec![
            Arc::new(StringArray::from_iter_values(
                sources.iter().map(|t| &t.vertex),
            )),
            Arc::new(UInt64Array::from_iter_values(
                sources.iter().map(|t| t.subtask as u64),
            )),
            Arc::new(UInt64Array::from_iter_values(
                sources.iter().map(|t| t.source_offset.unwrap_or_default()),
            )),
        ],
    )
    .expect("sources batch matches its schema")
}

/// The entry of `sources.arrow`.
pub fn sources_entry(written: Written) -> FileEntry {
    bare_entry(SOURCES_FILE, FileRole::Sources, written)
}

/// The tasks of a checkpoint: those named, those with an offset, and those
/// owning a file, sorted by (vertex, subtask).
pub fn task_entries(
    tasks: &[TaskId],
    offsets: &BTreeMap<TaskId, u64>,
    files: &[FileEntry],
) -> Vec<TaskEntry> {
    let mut all: BTreeSet<(String, usize)> = tasks
        .iter()
        .chain(offsets.keys())
        .map(|t| (t.vertex.clone(), t.subtask))
        .collect();
    all.extend(
        files
            .iter()
            .filter_map(|f| Some((f.vertex.clone()?, f.subtask?))),
    );
    all.into_iter()
        .map(|(vertex, subtask)| {
            let task = TaskId { vertex, subtask };
            TaskEntry {
                source_offset: offsets.get(&task).copied(),
                vertex: task.vertex,
                subtask: task.subtask,
                alignment_nanos: 0,
                sent_seq: Vec::new(),
                taken_seq: Vec::new(),
            }
        })
        .collect()
}

/// What a manifest says about its checkpoint, besides tasks and files.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ManifestMeta {
    pub checkpoint_id: CheckpointId,
    pub protocol: String,
    pub started_ms: u64,
    pub finished_ms: u64,
    pub committed_ms: u64,
    pub graph_fingerprint: String,
    pub savepoint: bool,
    /// Top-level fields of an engine (e.g. Spark's `"spark"`).
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// The manifest of a checkpoint (whose state files' chains are resolved).
pub fn build_manifest(
    meta: ManifestMeta,
    tasks: Vec<TaskEntry>,
    files: Vec<FileEntry>,
) -> Manifest {
    Manifest {
        format: FORMAT_NAME.into(),
        format_version: FORMAT_VERSION,
        checkpoint_id: meta.checkpoint_id,
        protocol: meta.protocol,
        started_ms: meta.started_ms,
        finished_ms: meta.finished_ms,
        committed_ms: meta.committed_ms,
        graph_fingerprint: meta.graph_fingerprint,
        savepoint: meta.savepoint,
        tasks,
        files,
        extra: meta.extra,
    }
}

/// A manifest's bytes as written.
pub fn manifest_bytes(manifest: &Manifest) -> Vec<u8> {
    serde_json::to_vec_pretty(manifest).expect("manifest serialises")
}

/// Parses the manifest of checkpoint `id` (`what` names it in errors).
pub fn parse_manifest(bytes: &[u8], what: &str, id: CheckpointId) -> Result<Manifest> {
    let manifest = Manifest::parse(bytes, what)?;
    if manifest.checkpoint_id != id {
        return Err(Error::Snapshot(format!(
            "{what} names checkpoint {}, expected {id}",
            manifest.checkpoint_id
        )));
    }
    Ok(manifest)
}

// --- a root's checkpoints ------------------------------------------------------

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
    /// longest), or `[id]`.
    pub chain: Vec<CheckpointId>,
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
        savepoint: manifest.savepoint,
    }
}

// --- diff chains ------------------------------------------------------------

/// The chain of a state diff of `task` at `id` based on `base`: the chain of
/// `base`'s state file for the task (its manifest: `base_manifest`), then `id`.
/// `committed` says whether a checkpoint is still there to be read.
pub fn diff_chain(
    id: CheckpointId,
    task: &TaskId,
    base: CheckpointId,
    base_manifest: Option<&Manifest>,
    committed: impl Fn(CheckpointId) -> bool,
) -> Result<Vec<CheckpointId>> {
    let base_entry = base_manifest
        .and_then(|m| m.state_file(task))
        .ok_or_else(|| {
            Error::Snapshot(format!(
                "checkpoint {id}: state diff of {task} is based on checkpoint {base}, which is \
             not a committed checkpoint holding its state; take a full capture instead"
            ))
        })?;
    let base_chain = state_chain(base, base_entry);
    if let Some(lost) = base_chain.iter().find(|c| !committed(**c)) {
        return Err(Error::Snapshot(format!(
            "checkpoint {id}: state diff of {task} is based on checkpoint {base}, whose \
             chain needs checkpoint {lost}, which retention removed; take a full \
             capture instead"
        )));
    }
    Ok(chain_after(id, Some(&base_chain)))
}

/// The chain of a state file written at `id`: `[id]` for a full (no
/// `base_chain`), the base's chain then `id` for a diff.
pub fn chain_after(id: CheckpointId, base_chain: Option<&[CheckpointId]>) -> Vec<CheckpointId> {
    let mut chain = base_chain.map(<[_]>::to_vec).unwrap_or_default();
    chain.push(id);
    chain
}

/// Gives each state entry of checkpoint `id` without a chain its chain: a
/// full's is `[id]`, a diff's its base's chain then `id`, the base's
/// manifest read through `manifest_of` (`None`: not there to be read, and
/// the diff is refused).
pub fn resolve_chains(
    id: CheckpointId,
    files: &mut [FileEntry],
    mut manifest_of: impl FnMut(CheckpointId) -> Option<Manifest>,
) -> Result<()> {
    let mut bases: BTreeMap<CheckpointId, Option<Manifest>> = BTreeMap::new();
    for f in files.iter_mut() {
        if f.role != FileRole::State || !f.chain.is_empty() {
            continue;
        }
        f.chain = match (f.kind, f.base, f.task()) {
            (Some(FileKind::Diff), Some(base), Some(t)) => {
                let m = bases.entry(base).or_insert_with(|| manifest_of(base));
                diff_chain(id, &t, base, m.as_ref(), |_| true)?
            }
            _ => vec![id],
        };
    }
    Ok(())
}

/// The checkpoints whose state files rebuild `task`'s state at `id`
/// (`entry`: its state file there), oldest first.
pub fn state_chain(id: CheckpointId, entry: &FileEntry) -> Vec<CheckpointId> {
    if entry.chain.is_empty() {
        vec![id]
    } else {
        entry.chain.clone()
    }
}

/// `task`'s state file at `cid`, a link of the chain of `id`.
pub fn chain_link<'m>(
    id: CheckpointId,
    task: &TaskId,
    cid: CheckpointId,
    manifest: &'m Manifest,
) -> Result<&'m FileEntry> {
    manifest.state_file(task).ok_or_else(|| {
        Error::Snapshot(format!(
            "checkpoint {id}: state of {task} needs checkpoint {cid}, which has no state file for it"
        ))
    })
}

/// What a link of a state chain holds: a full state, or a diff that names
/// its base (`cid`: the link's checkpoint, for the error).
pub fn link_kind(cid: CheckpointId, entry: &FileEntry) -> Result<StateKind> {
    match (entry.kind, entry.base) {
        (Some(FileKind::Diff), Some(base)) => Ok(StateKind::Diff { base }),
        (Some(FileKind::Full) | None, _) => Ok(StateKind::Full),
        (Some(FileKind::Diff), None) => Err(Error::Snapshot(format!(
            "checkpoint {cid}: diff state file {} has no base",
            entry.path
        ))),
    }
}

// --- rebuilding state -------------------------------------------------------

/// Full state from a chain of `(kind, batch)`: one full, then diffs. A diff's
/// rows replace the rows of their keys (the key column is named by the full
/// file's `snapcut.key` metadata); rows with `__deleted` true remove them.
/// A lone full is the state itself, whatever its layout. Any column type.
pub fn rebuild_state(chain: &[(FileKind, RecordBatch)]) -> Result<RecordBatch> {
    let Some(((first_kind, full), diffs)) = chain.split_first() else {
        return Err(Error::Snapshot(
            "a state chain must start with a full state file".into(),
        ));
    };
    if *first_kind != FileKind::Full {
        return Err(Error::Snapshot(
            "a state chain must start with a full state file".into(),
        ));
    }
    if diffs.is_empty() {
        return Ok(full.clone());
    }
    let schema = full.schema();
    let key = schema
        .metadata()
        .get(KEY_METADATA)
        .filter(|k| !k.is_empty())
        .ok_or_else(|| {
            Error::Snapshot(format!(
                "state file has no '{KEY_METADATA}' metadata naming its key"
            ))
        })?
        .clone();
    let key_at = |s: &Schema| {
        s.index_of(&key)
            .map_err(|_| Error::Snapshot(format!("state file has no key column '{key}'")))
    };
    let converter = RowConverter::new(vec![SortField::new(
        schema.field(key_at(&schema)?).data_type().clone(),
    )])
    .map_err(|e| Error::Snapshot(format!("state key '{key}': {e}")))?;
    let mut state = full.clone();
    for (kind, diff) in diffs {
        if *kind != FileKind::Diff {
            return Err(Error::Snapshot(format!(
                "state chain continues with a '{}' file, expected a diff",
                kind_name(*kind)
            )));
        }
        let rows = |b: &RecordBatch| -> Result<arrow_row::Rows> {
            converter
                .convert_columns(&[b.column(key_at(&b.schema())?).clone()])
                .map_err(|e| Error::Snapshot(format!("state key '{key}': {e}")))
        };
        let diff_keys = rows(diff)?;
        let changed: HashSet<&[u8]> = diff_keys.iter().map(|r| r.data()).collect();
        let state_keys = rows(&state)?;
        let keep: BooleanArray = state_keys
            .iter()
            .map(|r| Some(!changed.contains(r.data())))
            .collect();
        let kept = arrow_select::filter::filter_record_batch(&state, &keep)
            .map_err(|e| Error::Snapshot(format!("rebuilding state: {e}")))?;
        let deleted_at = diff.schema().index_of(DELETED_COLUMN).map_err(|_| {
            Error::Snapshot(format!("a state diff has no '{DELETED_COLUMN}' column"))
        })?;
        let deleted = diff
            .column(deleted_at)
            .as_any()
            .downcast_ref::<BooleanArray>()
            .ok_or_else(|| Error::Snapshot(format!("'{DELETED_COLUMN}' is not boolean")))?;
        let upsert: BooleanArray = (0..deleted.len())
            .map(|i| Some(!(deleted.is_valid(i) && deleted.value(i))))
            .collect();
        let mut upserts = arrow_select::filter::filter_record_batch(diff, &upsert)
            .map_err(|e| Error::Snapshot(format!("rebuilding state: {e}")))?;
        upserts.remove_column(deleted_at);
        let upserts = RecordBatch::try_new(schema.clone(), upserts.columns().to_vec())
            .map_err(|e| Error::Snapshot(format!("a state diff does not match its full: {e}")))?;
        state = arrow_select::concat::concat_batches(&schema, [&kept, &upserts])
            .map_err(|e| Error::Snapshot(format!("rebuilding state: {e}")))?;
    }
    Ok(state)
}

fn kind_name(kind: FileKind) -> &'static str {
    match kind {
        FileKind::Full => "full",
        FileKind::Diff => "diff",
    }
}

// --- reading a manifest, for tools -------------------------------------------

/// The state files of a checkpoint, per task, in manifest order.
pub fn state_files(manifest: &Manifest) -> impl Iterator<Item = (TaskId, &FileEntry)> {
    manifest
        .files
        .iter()
        .filter(|f| f.role == FileRole::State)
        .filter_map(|f| Some((f.task()?, f)))
}

/// The channel files `task` recorded at a checkpoint, in manifest order.
pub fn channel_files<'m>(
    manifest: &'m Manifest,
    task: &'m TaskId,
) -> impl Iterator<Item = &'m FileEntry> {
    manifest
        .files
        .iter()
        .filter(move |f| f.role == FileRole::Channel && f.task().as_ref() == Some(task))
}

/// One part of an export of a checkpoint (`snapcut snapshots export`): a
/// task's state, rebuilt, as part `index` (its subtask) of the table named
/// after its vertex; a file of a role the format leaves to its writer (the
/// Spark sink's `output`) as part `index` (its subtask, its `partition`, or
/// its rank) of the table named after the role (`<role>-<vertex>` when it
/// belongs to a vertex). Source offsets and channel logs are not exported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportPart {
    pub table: String,
    pub role: String,
    pub index: u64,
    pub task: Option<TaskId>,
    /// Index of its file in the manifest's `files`.
    pub file: usize,
}

/// Every part an export of `manifest` writes, states first, then by table
/// and index; two files that would be one part, or a table of two roles,
/// are refused.
pub fn export_plan(manifest: &Manifest) -> Result<Vec<ExportPart>> {
    let mut parts = Vec::new();
    let mut ranks: BTreeMap<String, u64> = BTreeMap::new();
    for (file, f) in manifest.files.iter().enumerate() {
        let role = String::from(f.role.clone());
        match &f.role {
            FileRole::State => {
                let task = f.task().ok_or_else(|| {
                    Error::Snapshot(format!(
                        "cannot export: state file {} names no task",
                        f.path
                    ))
                })?;
                parts.push(ExportPart {
                    table: task.vertex.clone(),
                    role,
                    index: task.subtask as u64,
                    task: Some(task),
                    file,
                });
            }
            FileRole::Sources | FileRole::Channel => {}
            FileRole::Other(_) => {
                let table = match &f.vertex {
                    Some(vertex) => format!("{role}-{vertex}"),
                    None => role.clone(),
                };
                let rank = ranks.entry(table.clone()).or_default();
                let index = f
                    .subtask
                    .map(|s| s as u64)
                    .or_else(|| f.extra.get("partition").and_then(|p| p.as_u64()))
                    .unwrap_or(*rank);
                *rank += 1;
                parts.push(ExportPart {
                    table,
                    role,
                    index,
                    task: None,
                    file,
                });
            }
        }
    }
    let mut roles: BTreeMap<&str, &str> = BTreeMap::new();
    let mut seen: BTreeMap<(&str, u64), &str> = BTreeMap::new();
    for p in &parts {
        let role = *roles.entry(&p.table).or_insert(&p.role);
        if role != p.role {
            return Err(Error::Snapshot(format!(
                "cannot export: table '{}' would hold both {role} and {} files",
                p.table, p.role
            )));
        }
        let path = manifest.files[p.file].path.as_str();
        if let Some(other) = seen.insert((&p.table, p.index), path) {
            return Err(Error::Snapshot(format!(
                "cannot export: files {other} and {path} would both be part {} of table '{}'",
                p.index, p.table
            )));
        }
    }
    parts.sort_by(|a, b| {
        (a.role != "state", &a.table, a.index).cmp(&(b.role != "state", &b.table, b.index))
    });
    Ok(parts)
}

// --- checking files ---------------------------------------------------------

/// Checks a file's bytes against its manifest entry: size, then checksum
/// (`path` names it in errors). A corrupt file is an error, never read.
pub fn check_file(
    entry: &FileEntry,
    bytes: &[u8],
    checkpoint: CheckpointId,
    path: &str,
) -> Result<()> {
    if bytes.len() as u64 != entry.bytes {
        return Err(Error::Snapshot(format!(
            "checkpoint {checkpoint}: file {path} is {} bytes, the manifest says {}: truncated or overwritten",
            bytes.len(),
            entry.bytes
        )));
    }
    let crc = crc32c::crc32c(bytes);
    if crc != entry.crc32c {
        return Err(Error::Snapshot(format!(
            "checkpoint {checkpoint}: file {path} fails its checksum (crc32c {crc:#010x}, manifest says \
             {:#010x}): corrupt",
            entry.crc32c
        )));
    }
    Ok(())
}

/// The error of a file listed in a manifest but not there.
pub fn missing_file(checkpoint: CheckpointId, path: &str) -> Error {
    Error::Snapshot(format!(
        "checkpoint {checkpoint}: file {path} listed in the manifest is missing"
    ))
}

/// Why a file whose checksum matches still cannot be read as its entry
/// lists it (not an Arrow IPC file, other row count, a state file without
/// its key column, a diff without `__deleted`), or `None`. Files that are
/// not `.arrow` are checked by checksum only.
pub fn check_structure(entry: &FileEntry, bytes: &[u8]) -> Option<String> {
    if !entry.path.ends_with(".arrow") {
        return None;
    }
    let (schema, batches) = match decode_buffer(Buffer::from(bytes), "file") {
        Ok(decoded) => decoded,
        Err(e) => {
            let why = e.to_string();
            let why = why
                .strip_prefix("snapshot error: file is not a readable Arrow IPC file: ")
                .unwrap_or(&why);
            return Some(format!("does not open as arrow: {why}"));
        }
    };
    let rows: u64 = batches.iter().map(|b| b.num_rows() as u64).sum();
    if rows != entry.rows {
        return Some(format!(
            "holds {rows} rows, the manifest says {}",
            entry.rows
        ));
    }
    if entry.role == FileRole::State {
        if let Some(key) = &entry.key {
            if schema.index_of(key).is_err() {
                return Some(format!("has no key column '{key}'"));
            }
        }
        if entry.kind == Some(FileKind::Diff) && schema.index_of(DELETED_COLUMN).is_err() {
            return Some(format!("is a diff without a '{DELETED_COLUMN}' column"));
        }
    }
    None
}

// --- verification -----------------------------------------------------------

/// What verifying a checkpoint reads, and what is wrong with its structure.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VerifyPlan {
    /// `(checkpoint, index into that checkpoint's manifest files)`, by
    /// checkpoint (oldest first): every file of the checkpoint itself, the
    /// state files of each base its chains need.
    pub files: Vec<(CheckpointId, usize)>,
    /// Problems of no single file: an unreadable base manifest, a chain that
    /// does not end with the checkpoint, names a base without state for the
    /// task, or does not start with a full.
    pub problems: Vec<String>,
}

/// Plans the verification of checkpoint `id` (`manifest`), given the
/// manifests of the checkpoints it needs (or why each cannot be read).
pub fn plan_verify(
    id: CheckpointId,
    manifest: &Manifest,
    bases: &BTreeMap<CheckpointId, std::result::Result<Manifest, String>>,
) -> VerifyPlan {
    let mut plan = VerifyPlan::default();
    let get = |cid: CheckpointId| -> Option<&Manifest> {
        if cid == id {
            Some(manifest)
        } else {
            bases.get(&cid).and_then(|m| m.as_ref().ok())
        }
    };
    for base in manifest.needs() {
        if base == id {
            plan.files
                .extend((0..manifest.files.len()).map(|i| (id, i)));
            continue;
        }
        match bases.get(&base) {
            Some(Ok(m)) => plan.files.extend(
                m.files
                    .iter()
                    .enumerate()
                    .filter(|(_, f)| f.role == FileRole::State)
                    .map(|(i, _)| (base, i)),
            ),
            Some(Err(why)) => plan.problems.push(format!(
                "checkpoint {id} needs base checkpoint {base}: {why}"
            )),
            None => plan.problems.push(format!(
                "checkpoint {id} needs base checkpoint {base}: its manifest was not read"
            )),
        }
    }
    for entry in manifest.files.iter().filter(|f| f.role == FileRole::State) {
        let Some(task) = entry.task() else { continue };
        let chain = state_chain(id, entry);
        if chain.last() != Some(&id) {
            plan.problems.push(format!(
                "checkpoint {id}: state of {task} has a chain {chain:?} not ending with {id}"
            ));
            continue;
        }
        for (i, cid) in chain.iter().enumerate() {
            let Some(m) = get(*cid) else { continue }; // reported above
            let Some(f) = m.state_file(&task) else {
                plan.problems.push(format!(
                    "checkpoint {id}: state of {task} needs checkpoint {cid}, which has no state file for it"
                ));
                break;
            };
            let want = if i == 0 {
                FileKind::Full
            } else {
                FileKind::Diff
            };
            let have = f.kind.unwrap_or(FileKind::Full);
            if have != want {
                plan.problems.push(format!(
                    "checkpoint {id}: state of {task} needs a {} state at checkpoint {cid}, which holds a {}",
                    kind_name(want),
                    kind_name(have)
                ));
                break;
            }
        }
    }
    plan
}

/// Plans the verification of checkpoint `id` reading the manifests it needs
/// through `manifest_of` (the caller's I/O); one that fails to read is a
/// problem of the plan, not an error. Returns the plan and the manifests.
pub fn plan_verify_with(
    id: CheckpointId,
    manifest: &Manifest,
    mut manifest_of: impl FnMut(CheckpointId) -> Result<Manifest>,
) -> (
    VerifyPlan,
    BTreeMap<CheckpointId, std::result::Result<Manifest, String>>,
) {
    let bases: BTreeMap<_, _> = manifest
        .needs()
        .into_iter()
        .filter(|&b| b != id)
        .map(|b| (b, manifest_of(b).map_err(|e| e.to_string())))
        .collect();
    (plan_verify(id, manifest, &bases), bases)
}

/// Verifies checkpoint `id` as a restore relies on it: every manifest it
/// needs, then every file of its plan, through the caller's I/O
/// (`manifest_of`, `check`: read and check one file against its entry). The
/// first failure is the error; one of a base names the base.
pub fn verify_with(
    id: CheckpointId,
    manifest: &Manifest,
    mut manifest_of: impl FnMut(CheckpointId) -> Result<Manifest>,
    mut check: impl FnMut(CheckpointId, &FileEntry) -> Result<()>,
) -> Result<()> {
    let wrap = |needed: CheckpointId, e: Error| {
        if needed == id {
            e
        } else {
            Error::Snapshot(format!(
                "checkpoint {id} needs base checkpoint {needed}: {e}"
            ))
        }
    };
    let mut bases = BTreeMap::new();
    for needed in manifest.needs() {
        if needed != id {
            let m = manifest_of(needed).map_err(|e| wrap(needed, e))?;
            bases.insert(needed, Ok(m));
        }
    }
    let plan = plan_verify(id, manifest, &bases);
    for (cid, i) in plan.files {
        let f = match bases.get(&cid) {
            Some(Ok(m)) => &m.files[i],
            _ => &manifest.files[i],
        };
        check(cid, f).map_err(|e| wrap(cid, e))?;
    }
    Ok(())
}

// --- retention --------------------------------------------------------------

/// A checkpoint being written while retention runs: the bases its state
/// diffs are captured against, when known (the store knows them; a reader of
/// a root sees only a directory without a manifest, and then the newest
/// complete checkpoint older than it is taken as its base).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InProgress {
    pub id: CheckpointId,
    pub bases: Option<Vec<CheckpointId>>,
}

/// THE retention rule. Given the complete checkpoints' manifests, those in
/// progress and `retain`, the complete checkpoints to delete: every one that
/// is not among the newest `retain` regular (not savepoint) checkpoints, not
/// a savepoint, not a base of a checkpoint in progress, and not needed, to a
/// fixpoint, by a kept one (a checkpoint kept as one task's base must
/// restore whole too: another task's chain there may reach further back).
pub fn retention(
    manifests: &BTreeMap<CheckpointId, Manifest>,
    in_progress: &[InProgress],
    retain: usize,
) -> Vec<CheckpointId> {
    let mut keep: BTreeSet<CheckpointId> = manifests
        .values()
        .filter(|m| !m.savepoint)
        .map(|m| m.checkpoint_id)
        .rev()
        .take(retain)
        .collect();
    keep.extend(
        manifests
            .values()
            .filter(|m| m.savepoint)
            .map(|m| m.checkpoint_id),
    );
    for p in in_progress {
        match &p.bases {
            Some(bases) => keep.extend(bases.iter().copied()),
            None => keep.extend(manifests.range(..p.id).next_back().map(|(id, _)| *id)),
        }
    }
    loop {
        let needed: Vec<CheckpointId> = keep
            .iter()
            .filter_map(|id| manifests.get(id))
            .flat_map(Manifest::needs)
            .filter(|id| !keep.contains(id))
            .collect();
        if needed.is_empty() {
            break;
        }
        keep.extend(needed);
    }
    manifests
        .keys()
        .filter(|id| !keep.contains(id))
        .copied()
        .collect()
}

/// [`retention`] over a root as a reader sees it (`scan`: every checkpoint
/// and whether it is complete, [`scan_listing`]): the complete checkpoints'
/// manifests read through `manifest_of` (one that fails to read is never a
/// base and is kept for inspection), every partial one in progress with
/// unknown bases.
pub fn retention_of_root(
    scan: &BTreeMap<CheckpointId, bool>,
    mut manifest_of: impl FnMut(CheckpointId) -> Result<Manifest>,
    retain: usize,
) -> Vec<CheckpointId> {
    let manifests: BTreeMap<CheckpointId, Manifest> = scan
        .iter()
        .filter(|(_, complete)| **complete)
        .filter_map(|(&id, _)| Some((id, manifest_of(id).ok()?)))
        .collect();
    let in_progress: Vec<InProgress> = scan
        .iter()
        .filter(|(_, complete)| !**complete)
        .map(|(&id, _)| InProgress { id, bases: None })
        .collect();
    retention(&manifests, &in_progress, retain)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOTHING: Written = Written {
        rows: 0,
        bytes: 0,
        crc32c: 0,
    };

    fn manifest(id: CheckpointId, savepoint: bool, chains: &[&[CheckpointId]]) -> Manifest {
        let files = chains
            .iter()
            .enumerate()
            .map(|(s, chain)| {
                let task = TaskId {
                    vertex: "a".into(),
                    subtask: s,
                };
                let base = (chain.len() > 1).then(|| chain[chain.len() - 2]);
                FileEntry {
                    chain: chain.to_vec(),
                    ..state_entry(&task, Some("k".into()), base, NOTHING)
                }
            })
            .collect();
        build_manifest(
            ManifestMeta {
                checkpoint_id: id,
                savepoint,
                ..Default::default()
            },
            Vec::new(),
            files,
        )
    }

    #[test]
    fn retention_keeps_bases_to_a_fixpoint_and_those_in_progress() {
        // Task 0: full at 2, diffs 3, 4. Task 1: full at 1, diff 2, full 3, diff 4.
        let ms: BTreeMap<_, _> = [
            manifest(1, false, &[&[1], &[1]]),
            manifest(2, false, &[&[2], &[1, 2]]),
            manifest(3, false, &[&[2, 3], &[3]]),
            manifest(4, false, &[&[2, 3, 4], &[3, 4]]),
        ]
        .into_iter()
        .map(|m| (m.checkpoint_id, m))
        .collect();
        // 4 needs 2 and 3; 2 needs 1 (task 1's chain there).
        assert_eq!(retention(&ms, &[], 1), Vec::<CheckpointId>::new());
        let mut fewer = ms.clone();
        fewer.insert(5, manifest(5, false, &[&[5], &[5]]));
        assert_eq!(retention(&fewer, &[], 1), vec![1, 2, 3, 4]);
        let known = InProgress {
            id: 6,
            bases: Some(vec![3]),
        };
        // 3 needs 2 (task 0), which needs 1 (task 1).
        assert_eq!(retention(&fewer, &[known], 1), vec![4]);
        let unknown = InProgress { id: 5, bases: None };
        // Unknown bases: the newest complete checkpoint before it, 4.
        assert_eq!(retention(&fewer, &[unknown], 1), Vec::<CheckpointId>::new());
    }

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
    fn an_export_plans_states_first_and_refuses_clashing_parts() {
        let mut m = manifest(2, false, &[&[2], &[1, 2]]);
        let partition = |p: u64| [("partition".to_string(), p.into())].into_iter().collect();
        m.files.insert(
            0,
            other_entry("part-00001.arrow", "output", NOTHING, partition(1)),
        );
        m.files.push(other_entry(
            "part-00000.arrow",
            "output",
            NOTHING,
            partition(0),
        ));
        m.files.push(sources_entry(NOTHING));
        let plan = export_plan(&m).unwrap();
        let got: Vec<(&str, u64, usize)> = plan
            .iter()
            .map(|p| (p.table.as_str(), p.index, p.file))
            .collect();
        assert_eq!(
            got,
            vec![("a", 0, 1), ("a", 1, 2), ("output", 0, 3), ("output", 1, 0)]
        );
        m.files
            .push(other_entry("again.arrow", "output", NOTHING, partition(0)));
        let err = export_plan(&m).unwrap_err().to_string();
        assert!(
            err.contains("would both be part 0 of table 'output'"),
            "{err}"
        );
        m.files.pop();
        m.files
            .push(other_entry("x.arrow", "a", NOTHING, partition(7)));
        let err = export_plan(&m).unwrap_err().to_string();
        assert!(
            err.contains("table 'a' would hold both state and a files"),
            "{err}"
        );
    }

    #[test]
    fn chains_resolve_from_the_base_once() {
        let task = TaskId {
            vertex: "a".into(),
            subtask: 0,
        };
        let mut files = vec![
            state_entry(&task, Some("k".into()), Some(4), NOTHING),
            state_entry(
                &TaskId {
                    vertex: "b".into(),
                    subtask: 0,
                },
                Some("k".into()),
                None,
                NOTHING,
            ),
        ];
        let mut reads = 0;
        resolve_chains(5, &mut files, |id| {
            reads += 1;
            Some(manifest(id, false, &[&[3, 4]]))
        })
        .unwrap();
        assert_eq!(
            (files[0].chain.clone(), files[1].chain.clone(), reads),
            (vec![3, 4, 5], vec![5], 1)
        );
        let mut orphan = vec![state_entry(&task, Some("k".into()), Some(4), NOTHING)];
        let err = resolve_chains(5, &mut orphan, |_| None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("take a full capture instead"), "{err}");
    }

    #[test]
    fn a_summary_takes_the_first_longest_chain() {
        let m = manifest(4, true, &[&[2, 3, 4], &[1, 2, 4], &[4]]);
        let s = summarize(&m);
        assert_eq!(s.chain, vec![2, 3, 4]);
        assert_eq!(
            (s.kind, s.engine, s.savepoint),
            (Some(FileKind::Diff), "local", true)
        );
        let empty = summarize(&manifest(5, false, &[]));
        assert_eq!((empty.kind, empty.chain), (None, vec![5]));
    }

    #[test]
    fn verify_names_the_base_a_failure_belongs_to() {
        let top = manifest(3, false, &[&[1, 3]]);
        let base = manifest(1, false, &[&[1]]);
        let mut read = Vec::new();
        verify_with(
            3,
            &top,
            |_| Ok(base.clone()),
            |cid, f| {
                read.push((cid, f.path.clone()));
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(read.iter().map(|r| r.0).collect::<Vec<_>>(), vec![1, 3]);
        let err = verify_with(
            3,
            &top,
            |_| Ok(base.clone()),
            |cid, _| Err(missing_file(cid, "x")),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("checkpoint 3 needs base checkpoint 1"),
            "{err}"
        );
        let (plan, bases) = plan_verify_with(3, &top, |_| Err(Error::Snapshot("gone".into())));
        assert_eq!(plan.files, vec![(3, 0)]);
        assert!(plan.problems[0].contains("needs base checkpoint 1: snapshot error: gone"));
        assert!(bases[&1].is_err());
    }

    #[test]
    fn rebuild_replaces_and_deletes_by_key_for_any_type() {
        use arrow_array::types::Int64Type;
        use arrow_array::{Int64Array, ListArray};
        let list =
            |v: Vec<Option<Vec<Option<i64>>>>| ListArray::from_iter_primitive::<Int64Type, _, _>(v);
        let schema = Arc::new(Schema::new_with_metadata(
            vec![
                Field::new("k", DataType::Int64, false),
                Field::new_list("l", Field::new_list_field(DataType::Int64, true), true),
            ],
            [(KEY_METADATA.to_string(), "k".to_string())].into(),
        ));
        let full = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from(vec![1, 2, 3])),
                Arc::new(list(vec![Some(vec![Some(1)]), None, Some(vec![])])),
            ],
        )
        .unwrap();
        let diff_schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new_list("l", Field::new_list_field(DataType::Int64, true), true),
            Field::new(DELETED_COLUMN, DataType::Boolean, true),
        ]));
        let diff = RecordBatch::try_new(
            diff_schema,
            vec![
                Arc::new(Int64Array::from(vec![2, 3, 4])),
                Arc::new(list(vec![Some(vec![Some(7)]), None, Some(vec![Some(8)])])),
                Arc::new(BooleanArray::from(vec![Some(false), Some(true), None])),
            ],
        )
        .unwrap();
        let out = rebuild_state(&[(FileKind::Full, full), (FileKind::Diff, diff)]).unwrap();
        let keys = out.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
        assert_eq!(keys.values().to_vec(), vec![1, 2, 4]);
        assert_eq!(out.schema(), schema);
        assert!(rebuild_state(&[]).is_err());
    }

    #[test]
    fn encoded_files_check_against_their_entry() {
        let batch = sources_batch(&[TaskEntry {
            vertex: "src".into(),
            subtask: 0,
            source_offset: Some(10),
            alignment_nanos: 0,
            sent_seq: Vec::new(),
            taken_seq: Vec::new(),
        }]);
        let (bytes, written) = encode_ipc(&batch.schema(), &[batch], "sources").unwrap();
        let entry = sources_entry(written);
        assert_eq!(written.rows, 1);
        check_file(&entry, &bytes, 1, "x").unwrap();
        assert_eq!(check_structure(&entry, &bytes), None);
        let mut bad = bytes.clone();
        bad[bytes.len() / 2] ^= 0xFF;
        assert!(check_file(&entry, &bad, 1, "x")
            .unwrap_err()
            .to_string()
            .contains("fails its checksum"));
        assert!(check_structure(&entry, b"not an arrow file")
            .unwrap()
            .starts_with("does not open as arrow"));
    }
}
