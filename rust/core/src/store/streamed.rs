//! One Arrow IPC file of one record batch, written as its rows are made
//! (issue 37): a merge of sorted runs, a capture of a table larger than
//! its memory budget. The rows come in chunks; each chunk's buffers are
//! appended to spool files (one per buffer of the batch: validity, offsets,
//! values), and [`StreamedFile::finish`] writes the file from them, so the
//! writer holds one chunk, never the batch.
//!
//! The file is byte for byte what `arrow_ipc`'s `FileWriter` (default
//! options, as [`super::format::encode_ipc_into`]) writes for the chunks
//! concatenated into one batch (a test holds it to that): one record batch,
//! so a file streamed is still one sorted run that a reader maps without a
//! copy, and a retried task rewrites the same bytes whichever way it wrote
//! them. The record batch message is built here from its lengths, null
//! counts and buffer sizes, which are known only once the last chunk is in;
//! the schema message and the footer are `arrow_ipc`'s own.
//!
//! Flat columns only: fixed-width, boolean, and (large) utf8/binary, which
//! are every column a state table holds. [`StreamedFile::supports`] says
//! whether a schema qualifies; callers write others in memory.

use std::fs::{self, File};
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use arrow_array::{Array, RecordBatch};
use arrow_buffer::{bit_util, Buffer, ToByteSlice};
use arrow_ipc::convert::IpcSchemaEncoder;
use arrow_ipc::writer::{DictionaryTracker, FileWriter};
use arrow_schema::{DataType, SchemaRef};
use flatbuffers::FlatBufferBuilder;

use super::format::{encode_ipc_into, EncodeError, Written};
use crate::error::{Error, Result};

/// `arrow_ipc`'s default alignment of a message's metadata and buffers.
const ALIGNMENT: usize = 64;
pub(super) const PADDING: [u8; ALIGNMENT] = [0; ALIGNMENT];
const CONTINUATION: [u8; 4] = [0xff; 4];

/// Spool files made by this process so far (their names).
static SPOOLS: AtomicU64 = AtomicU64::new(0);

/// How a column's values lie in its buffers.
#[derive(Clone, Copy, Debug)]
pub(super) enum Layout {
    /// One buffer of `width` bytes a row.
    Fixed(usize),
    /// One bit a row.
    Bits,
    /// i32 offsets and values.
    Bytes,
    /// i64 offsets and values.
    LargeBytes,
}

impl Layout {
    pub(super) fn of(data_type: &DataType) -> Option<Self> {
        Some(match data_type {
            DataType::Boolean => Self::Bits,
            DataType::Utf8 | DataType::Binary => Self::Bytes,
            DataType::LargeUtf8 | DataType::LargeBinary => Self::LargeBytes,
            t => Self::Fixed(t.primitive_width().or(match t {
                DataType::FixedSizeBinary(w) => usize::try_from(*w).ok(),
                _ => None,
            })?),
        })
    }
}

/// Where one buffer of the batch goes as its chunks come: a spool file
/// (here), or its place in a file sized ahead ([`super::presized`]).
pub(super) trait BufferOut {
    fn append(&mut self, bytes: &[u8]) -> Result<()>;
    /// Bytes appended so far.
    fn len(&self) -> u64;
}

impl BufferOut for Spool {
    fn append(&mut self, bytes: &[u8]) -> Result<()> {
        let out = self
            .out
            .as_mut()
            .expect("a spool is written before it is read");
        out.write_all(bytes)
            .map_err(|e| Error::io(format!("writing spool file {}", self.path.display()), e))?;
        self.len += bytes.len() as u64;
        Ok(())
    }

    fn len(&self) -> u64 {
        self.len
    }
}

/// One buffer of the batch as it grows, in a file of its own.
struct Spool {
    path: PathBuf,
    out: Option<BufWriter<File>>,
    len: u64,
}

impl Spool {
    fn new(dir: &Path, stem: &str) -> Result<Self> {
        let n = SPOOLS.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("{stem}.spool-{}-{n}.tmp", std::process::id()));
        let file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| Error::io(format!("creating spool file {}", path.display()), e))?;
        Ok(Self {
            path,
            out: Some(BufWriter::with_capacity(1 << 16, file)),
            len: 0,
        })
    }

    /// Copies the spool to `out`, `len` bytes.
    fn copy_to(&mut self, out: &mut impl Write) -> std::io::Result<()> {
        let mut file = self
            .out
            .take()
            .expect("a spool is read once")
            .into_inner()
            .map_err(|e| e.into_error())?;
        file.seek(SeekFrom::Start(0))?;
        let copied = std::io::copy(
            &mut BufReader::with_capacity(1 << 20, file).take(self.len),
            out,
        )?;
        if copied != self.len {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!(
                    "spool file {} is short: {copied} of {} bytes",
                    self.path.display(),
                    self.len
                ),
            ));
        }
        Ok(())
    }
}

impl Drop for Spool {
    fn drop(&mut self) {
        self.out = None;
        let _ = fs::remove_file(&self.path);
    }
}

/// A column's buffers and counts.
pub(super) struct Column<B> {
    pub(super) layout: Layout,
    pub(super) nulls: usize,
    pub(super) validity: B,
    /// `Some` for (large) bytes.
    pub(super) offsets: Option<B>,
    pub(super) values: B,
    /// The values' bytes so far: where the next chunk's offsets start.
    pub(super) value_bytes: u64,
}

/// A file of one record batch, written a chunk at a time ([`Self::push`]),
/// then finished into its destination ([`Self::finish`]). The spool files
/// go when the writer does, finished or not.
pub struct StreamedFile {
    schema: SchemaRef,
    columns: Vec<Column<Spool>>,
    rows: usize,
    /// A chunk ended inside a byte of the bit buffers: only the last may.
    ragged: bool,
}

impl std::fmt::Debug for StreamedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamedFile")
            .field("columns", &self.columns.len())
            .field("rows", &self.rows)
            .finish()
    }
}

impl StreamedFile {
    /// Whether every column of `schema` is flat (see the module's doc).
    pub fn supports(schema: &arrow_schema::Schema) -> bool {
        schema
            .fields()
            .iter()
            .all(|f| Layout::of(f.data_type()).is_some())
    }

    /// A file of `schema`'s batch, its spools under `dir` (local, writable;
    /// named after `stem`, removed with the writer).
    pub fn new(schema: SchemaRef, dir: &Path, stem: &str) -> Result<Self> {
        let mut columns = Vec::with_capacity(schema.fields().len());
        for field in schema.fields() {
            let layout = Layout::of(field.data_type()).ok_or_else(|| {
                Error::Config(format!(
                    "column '{}' of type {} cannot be streamed into a file: only flat \
                     (fixed-width, boolean, utf8, binary) columns are; write the batch whole",
                    field.name(),
                    field.data_type()
                ))
            })?;
            let bytes = matches!(layout, Layout::Bytes | Layout::LargeBytes);
            columns.push(Column {
                layout,
                nulls: 0,
                validity: Spool::new(dir, stem)?,
                offsets: bytes.then(|| Spool::new(dir, stem)).transpose()?,
                values: Spool::new(dir, stem)?,
                value_bytes: 0,
            });
        }
        Ok(Self {
            schema,
            columns,
            rows: 0,
            ragged: false,
        })
    }

    /// Rows pushed so far.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Appends `chunk` (the file's columns; names and metadata aside) to
    /// the batch. Every chunk but the last holds a multiple of 8 rows, so
    /// the bit buffers join at whole bytes.
    pub fn push(&mut self, chunk: &RecordBatch) -> Result<()> {
        push_chunk(
            &self.schema,
            &mut self.columns,
            self.rows,
            &mut self.ragged,
            chunk,
        )?;
        self.rows += chunk.num_rows();
        Ok(())
    }

    /// Writes the file into `out`: the schema, the batch of every chunk
    /// pushed, the footer. Returns `out` and what was written; `what` names
    /// the file in errors.
    pub fn finish<W: Write>(
        mut self,
        out: W,
        what: &str,
    ) -> std::result::Result<(W, Written), EncodeError> {
        if self.rows == 0 {
            let empty = RecordBatch::new_empty(self.schema.clone());
            return encode_ipc_into(out, &self.schema, &[empty], what);
        }
        let frame = Frame::new(&self.schema, self.rows, &self.columns, what)
            .map_err(EncodeError::Format)?;
        let mut sink = super::format::Checksummed::new(out);
        let io = EncodeError::Io;
        sink.write_all(&frame.head).map_err(io)?;
        for column in &mut self.columns {
            let nulls = column.nulls;
            let mut parts: Vec<&mut Spool> = Vec::with_capacity(3);
            if nulls > 0 {
                parts.push(&mut column.validity);
            }
            parts.extend(column.offsets.as_mut());
            parts.push(&mut column.values);
            for spool in parts {
                spool.copy_to(&mut sink).map_err(io)?;
                let pad = (padded(spool.len) - spool.len) as usize;
                sink.write_all(&PADDING[..pad]).map_err(io)?;
            }
        }
        sink.write_all(&frame.tail).map_err(io)?;
        Ok(sink.done(self.rows as u64))
    }
}

/// Checks `chunk` against the file's `schema` and the last chunk's end
/// (`ragged`), and appends its rows (after `rows` already in) to `columns`.
pub(super) fn push_chunk<B: BufferOut>(
    schema: &SchemaRef,
    columns: &mut [Column<B>],
    rows: usize,
    ragged: &mut bool,
    chunk: &RecordBatch,
) -> Result<()> {
    if chunk.num_rows() == 0 {
        return Ok(());
    }
    if *ragged {
        return Err(Error::Config(format!(
            "a streamed file's chunk of {} rows follows one whose rows were not a multiple \
             of 8; only the last chunk may be",
            chunk.num_rows()
        )));
    }
    let same = chunk.num_columns() == columns.len()
        && (chunk.schema_ref().fields().iter())
            .zip(schema.fields())
            .all(|(a, b)| a.data_type() == b.data_type());
    if !same {
        return Err(Error::Config(format!(
            "a streamed file's chunk has columns ({}) where the file has ({})",
            describe(chunk.schema_ref()),
            describe(schema)
        )));
    }
    let n = chunk.num_rows();
    for (column, array) in columns.iter_mut().zip(chunk.columns()) {
        column.push(array.as_ref(), rows + n)?;
    }
    *ragged = n % 8 != 0;
    Ok(())
}

/// What a file holds around its batch's buffers: before them (`head`) the
/// schema message, magic first, as `FileWriter` writes it, and the record
/// batch message built from the buffers' lengths; after them (`tail`) the
/// end of the stream and the footer naming the one batch.
pub(super) struct Frame {
    pub(super) head: Vec<u8>,
    pub(super) tail: Vec<u8>,
}

impl Frame {
    /// The frame of a batch of `rows` rows whose columns' null counts and
    /// buffer lengths `columns` give.
    pub(super) fn new<B: BufferOut>(
        schema: &SchemaRef,
        rows: usize,
        columns: &[Column<B>],
        what: &str,
    ) -> Result<Self> {
        let arrow = |e: arrow_schema::ArrowError| Error::Snapshot(format!("encoding {what}: {e}"));
        let schema_message = FileWriter::try_new(Vec::new(), schema)
            .map_err(arrow)?
            .get_ref()
            .clone();
        let mut nodes = Vec::with_capacity(columns.len());
        let mut buffers = Vec::with_capacity(columns.len() * 3);
        let mut offset = 0u64;
        for column in columns {
            nodes.push(arrow_ipc::FieldNode::new(rows as i64, column.nulls as i64));
            for len in column.buffer_lens() {
                buffers.push(arrow_ipc::Buffer::new(offset as i64, len as i64));
                offset += padded(len);
            }
        }
        let body_len = offset;
        let metadata = batch_message(rows, &nodes, &buffers, body_len);
        let padded_header = padded(metadata.len() as u64 + 8);
        let mut head = schema_message.clone();
        head.extend_from_slice(&CONTINUATION);
        head.extend_from_slice(&((padded_header - 8) as i32).to_le_bytes());
        head.extend_from_slice(&metadata);
        head.extend_from_slice(&PADDING[..(padded_header - 8) as usize - metadata.len()]);
        let block = arrow_ipc::Block::new(
            schema_message.len() as i64,
            padded_header as i32,
            body_len as i64,
        );
        let footer = footer(schema, block);
        let mut tail = CONTINUATION.to_vec();
        tail.extend_from_slice(&0i32.to_le_bytes());
        tail.extend_from_slice(&footer);
        tail.extend_from_slice(&(footer.len() as i32).to_le_bytes());
        tail.extend_from_slice(b"ARROW1");
        Ok(Self { head, tail })
    }
}

impl<B: BufferOut> Column<B> {
    /// The lengths of the batch's buffers of this column, in order: the
    /// validity (empty without nulls, as `FileWriter` writes it), then the
    /// offsets if any, then the values.
    fn buffer_lens(&self) -> Vec<u64> {
        let mut lens = vec![if self.nulls > 0 {
            self.validity.len()
        } else {
            0
        }];
        lens.extend(self.offsets.as_ref().map(|s| s.len()));
        lens.push(self.values.len());
        lens
    }

    /// Appends `array`'s rows; `upto` is the row count after it.
    pub(super) fn push(&mut self, array: &dyn Array, upto: usize) -> Result<()> {
        let data = array.to_data();
        let (offset, len) = (data.offset(), data.len());
        match data.nulls() {
            Some(nulls) if nulls.null_count() > 0 => {
                self.nulls += nulls.null_count();
                self.validity
                    .append(&bits(nulls.inner().inner(), nulls.offset(), len))?;
            }
            _ => self.validity.append(&ones(len))?,
        }
        match self.layout {
            Layout::Fixed(width) => {
                let values = &data.buffers()[0];
                self.values
                    .append(&values.as_slice()[offset * width..(offset + len) * width])?;
            }
            Layout::Bits => {
                self.values.append(&bits(&data.buffers()[0], offset, len))?;
            }
            Layout::Bytes => self.push_bytes::<i32>(&data, upto)?,
            Layout::LargeBytes => self.push_bytes::<i64>(&data, upto)?,
        }
        Ok(())
    }

    fn push_bytes<O>(&mut self, data: &arrow_data::ArrayData, upto: usize) -> Result<()>
    where
        O: arrow_array::OffsetSizeTrait + arrow_buffer::ToByteSlice,
    {
        let all: &[O] = data.buffers()[0].typed_data();
        let own = &all[data.offset()..=data.offset() + data.len()];
        let (start, end) = (own[0].as_usize(), own[own.len() - 1].as_usize());
        let base = self.value_bytes;
        let last = base + (end - start) as u64;
        if O::from_usize(last as usize).is_none() {
            return Err(Error::Config(format!(
                "a streamed column's values reach {last} bytes by row {upto}, past what its \
                 32-bit offsets hold; use a large (64-bit offset) type"
            )));
        }
        let at = |o: O| O::from_usize(o.as_usize() - start + base as usize).expect("checked above");
        // The first chunk writes the batch's leading offset 0.
        let skip = usize::from(self.offsets.as_ref().is_some_and(|s| s.len() > 0));
        let offsets: Vec<O> = own[skip..].iter().map(|&o| at(o)).collect();
        self.offsets
            .as_mut()
            .expect("a bytes column has offsets")
            .append(offsets.to_byte_slice())?;
        self.values
            .append(&data.buffers()[1].as_slice()[start..end])?;
        self.value_bytes = last;
        Ok(())
    }
}

/// `len` bits of `buffer` from bit `offset`, from bit 0 of the bytes
/// returned, the bits past `len` in the last byte cleared.
fn bits(buffer: &Buffer, offset: usize, len: usize) -> Vec<u8> {
    let sliced = buffer.bit_slice(offset, len);
    let mut out = sliced.as_slice()[..bit_util::ceil(len, 8)].to_vec();
    clear_tail(&mut out, len);
    out
}

/// `len` set bits (a validity of no nulls).
fn ones(len: usize) -> Vec<u8> {
    let mut out = vec![0xff; bit_util::ceil(len, 8)];
    clear_tail(&mut out, len);
    out
}

fn clear_tail(bytes: &mut [u8], len: usize) {
    if len % 8 != 0 {
        if let Some(last) = bytes.last_mut() {
            *last &= (1u8 << (len % 8)) - 1;
        }
    }
}

pub(super) fn padded(len: u64) -> u64 {
    len.div_ceil(ALIGNMENT as u64) * ALIGNMENT as u64
}

fn describe(schema: &arrow_schema::Schema) -> String {
    (schema.fields().iter())
        .map(|f| format!("{}: {}", f.name(), f.data_type()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The record batch message's flatbuffer, built in `arrow_ipc`'s order
/// (`IpcDataGenerator::record_batch_to_bytes`, no compression) so that its
/// bytes are the same.
fn batch_message(
    rows: usize,
    nodes: &[arrow_ipc::FieldNode],
    buffers: &[arrow_ipc::Buffer],
    body_len: u64,
) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let buffers = fbb.create_vector(buffers);
    let nodes = fbb.create_vector(nodes);
    let root = {
        let mut batch = arrow_ipc::RecordBatchBuilder::new(&mut fbb);
        batch.add_length(rows as i64);
        batch.add_nodes(nodes);
        batch.add_buffers(buffers);
        batch.finish().as_union_value()
    };
    let mut message = arrow_ipc::MessageBuilder::new(&mut fbb);
    message.add_version(arrow_ipc::MetadataVersion::V5);
    message.add_header_type(arrow_ipc::MessageHeader::RecordBatch);
    message.add_bodyLength(body_len as i64);
    message.add_header(root);
    let root = message.finish();
    fbb.finish(root, None);
    fbb.finished_data().to_vec()
}

/// The file's footer as `FileWriter::finish` builds it: no dictionaries,
/// one record batch.
fn footer(schema: &arrow_schema::Schema, block: arrow_ipc::Block) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let dictionaries = fbb.create_vector::<arrow_ipc::Block>(&[]);
    let record_batches = fbb.create_vector(&[block]);
    let mut tracker = DictionaryTracker::new(true);
    let schema = IpcSchemaEncoder::new()
        .with_dictionary_tracker(&mut tracker)
        .schema_to_fb_offset(&mut fbb, schema);
    let root = {
        let mut footer = arrow_ipc::FooterBuilder::new(&mut fbb);
        footer.add_version(arrow_ipc::MetadataVersion::V5);
        footer.add_schema(schema);
        footer.add_dictionaries(dictionaries);
        footer.add_recordBatches(record_batches);
        footer.finish()
    };
    fbb.finish(root, None);
    fbb.finished_data().to_vec()
}

#[cfg(test)]
#[path = "streamed_tests.rs"]
pub(super) mod tests;
