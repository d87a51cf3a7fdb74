//! An Arrow IPC file's bytes: encoding batches into one (counting its size
//! and CRC-32C as it streams, so its manifest entry needs no second pass)
//! and decoding one without copying its buffers.

use std::io::Write;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_buffer::Buffer;
use arrow_ipc::convert::fb_to_schema;
use arrow_ipc::reader::{read_footer_length, FileDecoder};
use arrow_ipc::root_as_footer;
use arrow_ipc::writer::FileWriter;
use arrow_schema::{Schema, SchemaRef};

use crate::error::{Error, Result};

/// What encoding one file produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Written {
    pub rows: u64,
    pub bytes: u64,
    pub crc32c: u32,
}

/// Counts bytes and updates the CRC as they stream through.
pub(crate) struct Checksummed<W> {
    inner: W,
    crc: u32,
    bytes: u64,
}

impl<W> Checksummed<W> {
    pub(crate) fn new(inner: W) -> Self {
        Self {
            inner,
            crc: 0,
            bytes: 0,
        }
    }

    /// The destination back, and what went through: `rows` rows.
    pub(crate) fn done(self, rows: u64) -> (W, Written) {
        let written = Written {
            rows,
            bytes: self.bytes,
            crc32c: self.crc,
        };
        (self.inner, written)
    }
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
    let sink = Checksummed::new(out);
    let mut writer = FileWriter::try_new(sink, schema).map_err(arrow)?;
    let mut rows = 0;
    for batch in batches {
        writer.write(batch).map_err(arrow)?;
        rows += batch.num_rows() as u64;
    }
    Ok(writer.into_inner().map_err(arrow)?.done(rows))
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

/// As [`decode_ipc`], of bytes already in a buffer (a mapped file).
pub fn decode_buffer(buffer: Buffer, what: &str) -> Result<(SchemaRef, Vec<RecordBatch>)> {
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
