//! A [`super::StreamedFile`] whose size is known before its rows come: how
//! many rows, each column's nulls and its values' bytes. Its frame is then
//! known too, so each buffer is written straight to its place in the file
//! as the chunks come (a buffered positional write a buffer), and nothing
//! goes through a spool file: a streamed file's bytes are written once, not
//! twice. A full's time index is such a file (issue 37, format 5: an entry
//! a row with a time; a key's bytes known from the full). The bytes are
//! the same as a streamed file's (a test holds it to that); the checksum is
//! each buffer's, combined in the file's order.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_buffer::bit_util;
use arrow_schema::SchemaRef;

use super::files::Fsync;
use super::format::Written;
use super::streamed::{padded, push_chunk, BufferOut, Column, Frame, Layout, PADDING};
use crate::error::{Error, Result};

/// Bytes a buffer gathers before it is written to its place.
const WRITE_BYTES: usize = 1 << 20;

/// What a column will hold: its nulls and, for a (large) bytes column, its
/// values' bytes (0 for any other).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ColumnSize {
    pub nulls: usize,
    pub value_bytes: u64,
}

/// One buffer's place in the file and what was written to it so far.
struct Region {
    file: Arc<File>,
    path: Arc<PathBuf>,
    /// Where it begins in the file.
    start: u64,
    /// Its length as the frame says; `None`: not in the file (a validity
    /// of a column without nulls), its bytes counted and dropped.
    size: Option<u64>,
    len: u64,
    pending: Vec<u8>,
    crc: u32,
}

impl Region {
    fn flush(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let at = self.start + self.len - self.pending.len() as u64;
        (self.file.write_all_at(&self.pending, at))
            .map_err(|e| Error::io(format!("writing {}", self.path.display()), e))?;
        self.crc = crc32c::crc32c_append(self.crc, &self.pending);
        self.pending.clear();
        Ok(())
    }
}

impl BufferOut for Region {
    fn append(&mut self, bytes: &[u8]) -> Result<()> {
        self.len += bytes.len() as u64;
        let Some(size) = self.size else {
            return Ok(());
        };
        if self.len > size {
            return Err(Error::Config(format!(
                "{}: a buffer given {} bytes where its file was sized for {size}",
                self.path.display(),
                self.len
            )));
        }
        self.pending.extend_from_slice(bytes);
        if self.pending.len() >= WRITE_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    fn len(&self) -> u64 {
        self.len
    }
}

/// A file of one record batch of a known size, written a chunk at a time
/// ([`Self::push`]) into its place, then finished ([`Self::finish`]).
pub struct PresizedFile {
    schema: SchemaRef,
    file: Arc<File>,
    path: Arc<PathBuf>,
    rows: usize,
    sizes: Vec<ColumnSize>,
    columns: Vec<Column<Region>>,
    frame: Frame,
    pushed: usize,
    ragged: bool,
}

impl PresizedFile {
    /// Creates (or replaces) the file at `path` for a batch of `schema`
    /// with `rows` rows, its columns as `sizes` says (one a column); only
    /// flat columns, as a [`super::StreamedFile`]'s.
    pub fn create(
        path: &Path,
        schema: SchemaRef,
        rows: usize,
        sizes: &[ColumnSize],
    ) -> Result<Self> {
        let what = path.display().to_string();
        if sizes.len() != schema.fields().len() || rows == 0 {
            return Err(Error::Config(format!(
                "{what}: a presized file takes a size for each of its {} columns and at least \
                 one row; got {} sizes and {rows} rows",
                schema.fields().len(),
                sizes.len()
            )));
        }
        // Every column checked before the file is made: a refused schema
        // leaves nothing behind.
        let layouts = (schema.fields().iter())
            .map(|field| {
                Layout::of(field.data_type()).ok_or_else(|| {
                    Error::Config(format!(
                        "{what}: column '{}' of type {} is not flat (fixed-width, boolean, \
                         utf8 or binary); write the batch whole instead",
                        field.name(),
                        field.data_type()
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let file =
            Arc::new(File::create(path).map_err(|e| Error::io(format!("creating {what}"), e))?);
        let path = Arc::new(path.to_path_buf());
        // The frame from the buffers' lengths alone (nothing written yet).
        let mut columns = Vec::with_capacity(sizes.len());
        for (&layout, size) in layouts.iter().zip(sizes) {
            let lens = buffer_lens(layout, rows, *size);
            let region = |size: Option<u64>| Region {
                file: file.clone(),
                path: path.clone(),
                start: 0,
                size,
                len: 0,
                pending: Vec::new(),
                crc: 0,
            };
            columns.push(Column {
                layout,
                nulls: size.nulls,
                validity: region(lens[0]),
                offsets: lens[1].map(|l| region(Some(l))),
                values: region(lens[2]),
                value_bytes: 0,
            });
        }
        // `Frame::new` reads the regions' lengths: set them to the sizes.
        for column in &mut columns {
            for region in regions_mut(column) {
                region.len = region.size.unwrap_or(0);
            }
        }
        let frame = Frame::new(&schema, rows, &columns, &what)?;
        let mut at = frame.head.len() as u64;
        for column in &mut columns {
            column.nulls = 0;
            for region in regions_mut(column) {
                region.len = 0;
                if let Some(size) = region.size {
                    region.start = at;
                    at += padded(size);
                }
            }
        }
        Ok(Self {
            schema,
            file,
            path,
            rows,
            sizes: sizes.to_vec(),
            columns,
            frame,
            pushed: 0,
            ragged: false,
        })
    }

    /// Appends `chunk`, as [`super::StreamedFile::push`] does; more rows or
    /// bytes than the file was sized for are refused.
    pub fn push(&mut self, chunk: &RecordBatch) -> Result<()> {
        if self.pushed + chunk.num_rows() > self.rows {
            return Err(self.short_or_long(self.pushed + chunk.num_rows()));
        }
        push_chunk(
            &self.schema,
            &mut self.columns,
            self.pushed,
            &mut self.ragged,
            chunk,
        )?;
        self.pushed += chunk.num_rows();
        Ok(())
    }

    fn short_or_long(&self, rows: usize) -> Error {
        Error::Config(format!(
            "{}: a file sized for {} rows was given {rows}",
            self.path.display(),
            self.rows
        ))
    }

    /// Writes what is left (the buffers' padding, the frame), fsyncs the
    /// file if `fsync` says so, and returns what was written. A file given
    /// other than what it was sized for is an error (its bytes would not be
    /// the batch's).
    pub fn finish(mut self, fsync: &Fsync) -> Result<Written> {
        let what = self.path.display().to_string();
        if self.pushed != self.rows {
            return Err(self.short_or_long(self.pushed));
        }
        let io = |e| Error::io(format!("writing {what}"), e);
        let mut crc = crc32c::crc32c(&self.frame.head);
        let mut end = self.frame.head.len() as u64;
        for (column, size) in self.columns.iter_mut().zip(&self.sizes) {
            if column.nulls != size.nulls || column.value_bytes != size.value_bytes {
                return Err(Error::Config(format!(
                    "{what}: a column sized for {} nulls and {} value bytes was given {} and {}",
                    size.nulls, size.value_bytes, column.nulls, column.value_bytes
                )));
            }
            for region in regions_mut(column) {
                let Some(size) = region.size else { continue };
                region.flush()?;
                let pad = &PADDING[..(padded(size) - size) as usize];
                self.file
                    .write_all_at(pad, region.start + size)
                    .map_err(io)?;
                crc = crc32c::crc32c_combine(crc, region.crc, size as usize);
                crc = crc32c::crc32c_append(crc, pad);
                end = region.start + padded(size);
            }
        }
        self.file.write_all_at(&self.frame.head, 0).map_err(io)?;
        self.file.write_all_at(&self.frame.tail, end).map_err(io)?;
        crc = crc32c::crc32c_append(crc, &self.frame.tail);
        fsync.file(&self.file).map_err(io)?;
        Ok(Written {
            rows: self.rows as u64,
            bytes: end + self.frame.tail.len() as u64,
            crc32c: crc,
        })
    }
}

/// A column's buffers in the file's order: validity, offsets, values.
fn regions_mut(column: &mut Column<Region>) -> impl Iterator<Item = &mut Region> {
    [
        Some(&mut column.validity),
        column.offsets.as_mut(),
        Some(&mut column.values),
    ]
    .into_iter()
    .flatten()
}

/// The lengths of a column's validity (None: no nulls, not written),
/// offsets (None: no offsets) and values (None never) for `rows` rows.
fn buffer_lens(layout: Layout, rows: usize, size: ColumnSize) -> [Option<u64>; 3] {
    let bits = bit_util::ceil(rows, 8) as u64;
    let validity = (size.nulls > 0).then_some(bits);
    let rows = rows as u64;
    match layout {
        Layout::Fixed(width) => [validity, None, Some(rows * width as u64)],
        Layout::Bits => [validity, None, Some(bits)],
        Layout::Bytes => [validity, Some((rows + 1) * 4), Some(size.value_bytes)],
        Layout::LargeBytes => [validity, Some((rows + 1) * 8), Some(size.value_bytes)],
    }
}

#[cfg(test)]
#[path = "presized_tests.rs"]
mod tests;
