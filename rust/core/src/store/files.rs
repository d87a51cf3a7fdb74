//! File-level I/O: Arrow IPC files with a running CRC-32C, checked reads,
//! and the atomic write (temp + fsync + rename + directory fsync).

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_buffer::Buffer;
use arrow_ipc::convert::fb_to_schema;
use arrow_ipc::reader::{read_footer_length, FileDecoder};
use arrow_ipc::root_as_footer;
use arrow_ipc::writer::FileWriter;
use arrow_schema::{Schema, SchemaRef};

use super::manifest::FileEntry;
use crate::error::{Error, Result};

/// What writing one file produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Written {
    pub rows: u64,
    pub bytes: u64,
    pub crc32c: u32,
}

/// Counts bytes and updates the CRC as they stream to the file.
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

/// How a store makes a checkpoint durable before its manifest counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FsyncMode {
    /// Nothing is fsynced: a checkpoint lives in the OS page cache until the
    /// kernel writes it back. It survives the process being killed, not an
    /// OS crash or a power loss (what Flink gives when it checkpoints to a
    /// local directory: it closes its files without syncing them).
    Off,
    /// Every file, the checkpoint's directory and the root are fsynced, one
    /// by one: one device flush each.
    PerFile,
    /// The default. Linux 5.8 or later: one `syncfs` of the root's
    /// filesystem makes every file of the checkpoint (and the manifest's
    /// temporary copy) durable at once, then the directory is fsynced after
    /// the manifest's rename: two device flushes a checkpoint whatever its
    /// number of files (a 100 ms interval on a virtio disk:
    /// bench/results/peers-snapcut-syncfs/). `syncfs` also writes back other
    /// dirty files of that filesystem. Elsewhere, and before Linux 5.8
    /// (whose `syncfs` does not report write-back errors): as `PerFile`.
    #[default]
    Syncfs,
}

impl std::str::FromStr for FsyncMode {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "off" => Ok(Self::Off),
            "per-file" => Ok(Self::PerFile),
            "syncfs" => Ok(Self::Syncfs),
            other => Err(Error::Config(format!(
                "fsync mode {other:?} is not one of 'per-file', 'syncfs', 'off'"
            ))),
        }
    }
}

/// A store's [`FsyncMode`] at work, counting the sync calls it makes.
#[derive(Debug)]
pub struct Fsync {
    mode: FsyncMode,
    calls: AtomicU64,
}

impl Fsync {
    pub fn new(mode: FsyncMode) -> Self {
        let mode = match mode {
            FsyncMode::Syncfs if !syncfs_reports_errors() => FsyncMode::PerFile,
            m => m,
        };
        Self {
            mode,
            calls: AtomicU64::new(0),
        }
    }

    /// The mode in effect (`Syncfs` where it is not available: `PerFile`).
    pub fn mode(&self) -> FsyncMode {
        self.mode
    }

    /// Sync calls made so far (fsync of files and directories, syncfs).
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// Makes a file just written durable: now (`PerFile`) or at the next
    /// [`Fsync::barrier`] (`Syncfs`).
    fn file(&self, f: &File) -> std::io::Result<()> {
        if self.mode != FsyncMode::PerFile {
            return Ok(());
        }
        self.calls.fetch_add(1, Ordering::Relaxed);
        f.sync_all()
    }

    /// Makes everything written so far on `dir`'s filesystem durable, the
    /// files and the directory entries alike (`Syncfs`; with `PerFile` it
    /// already is).
    pub fn barrier(&self, dir: &Path) -> Result<()> {
        if self.mode != FsyncMode::Syncfs {
            return Ok(());
        }
        self.calls.fetch_add(1, Ordering::Relaxed);
        let err = |e| Error::io(format!("syncing the filesystem of {}", dir.display()), e);
        let d = File::open(dir).map_err(err)?;
        syncfs(&d).map_err(err)
    }

    /// Makes durable the entries `dir` had before the last
    /// [`Fsync::barrier`]: with `Syncfs` the barrier already did, so only
    /// `PerFile` fsyncs the directory.
    pub fn dir_before_barrier(&self, dir: &Path) -> Result<()> {
        if self.mode != FsyncMode::PerFile {
            return Ok(());
        }
        self.dir(dir)
    }

    /// Makes a directory's entries (renames, new files) durable.
    pub fn dir(&self, dir: &Path) -> Result<()> {
        if self.mode == FsyncMode::Off {
            return Ok(());
        }
        self.calls.fetch_add(1, Ordering::Relaxed);
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| Error::io(format!("fsyncing directory {}", dir.display()), e))
    }
}

/// Whether this kernel's `syncfs` reports write-back errors (Linux 5.8+).
#[cfg(target_os = "linux")]
fn syncfs_reports_errors() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(|| {
        let release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        release_at_least(&release, (5, 8))
    })
}

/// Whether a kernel release string ("6.1.0-13-amd64") is at least `version`.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn release_at_least(release: &str, version: (u32, u32)) -> bool {
    let mut parts = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= version
}

#[cfg(not(target_os = "linux"))]
fn syncfs_reports_errors() -> bool {
    false
}

#[cfg(target_os = "linux")]
fn syncfs(f: &File) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: syncfs only reads the descriptor, which `f` keeps open.
    if unsafe { libc::syncfs(f.as_raw_fd()) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
fn syncfs(f: &File) -> std::io::Result<()> {
    f.sync_all()
}

/// Writes `batches` as one Arrow IPC file at `path`, fsynced if `fsync` says so.
pub fn write_ipc(
    path: &Path,
    schema: &Schema,
    batches: &[RecordBatch],
    fsync: &Fsync,
) -> Result<Written> {
    let io = |e: std::io::Error| Error::io(format!("writing {}", path.display()), e);
    let arrow =
        |e: arrow_schema::ArrowError| Error::Snapshot(format!("encoding {}: {e}", path.display()));
    let file = File::create(path).map_err(io)?;
    let sink = Checksummed {
        inner: file,
        crc: 0,
        bytes: 0,
    };
    let mut writer =
        FileWriter::try_new(BufWriter::with_capacity(1 << 20, sink), schema).map_err(arrow)?;
    let mut rows = 0;
    for batch in batches {
        writer.write(batch).map_err(|e| match e {
            arrow_schema::ArrowError::IoError(_, source) => io(source),
            other => arrow(other),
        })?;
        rows += batch.num_rows() as u64;
    }
    let buffered = writer.into_inner().map_err(arrow)?;
    let sink = buffered.into_inner().map_err(|e| io(e.into_error()))?;
    fsync.file(&sink.inner).map_err(io)?;
    Ok(Written {
        rows,
        bytes: sink.bytes,
        crc32c: sink.crc,
    })
}

/// Reads a file of a checkpoint, checking its size and checksum against the
/// manifest first: a corrupt file is an error, never silently read.
pub fn read_checked(dir: &Path, entry: &FileEntry, checkpoint: u64) -> Result<Vec<u8>> {
    let path = dir.join(&entry.path);
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Error::Snapshot(format!(
                "checkpoint {checkpoint}: file {} listed in the manifest is missing",
                path.display()
            )))
        }
        Err(e) => return Err(Error::io(format!("reading {}", path.display()), e)),
    };
    if bytes.len() as u64 != entry.bytes {
        return Err(Error::Snapshot(format!(
            "checkpoint {checkpoint}: file {} is {} bytes, the manifest says {}: truncated or overwritten",
            path.display(),
            bytes.len(),
            entry.bytes
        )));
    }
    let crc = crc32c::crc32c(&bytes);
    if crc != entry.crc32c {
        return Err(Error::Snapshot(format!(
            "checkpoint {checkpoint}: file {} fails its checksum (crc32c {crc:#010x}, manifest says \
             {:#010x}): corrupt",
            path.display(),
            entry.crc32c
        )));
    }
    Ok(bytes)
}

/// Decodes a checked Arrow IPC file without copying its buffers: the arrays
/// are slices of `bytes` (a restore of a large state reads it only once).
pub fn decode_ipc(bytes: Vec<u8>, what: &str) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    let err = |e: String| Error::Snapshot(format!("{what} is not a readable Arrow IPC file: {e}"));
    let buffer = Buffer::from_vec(bytes);
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

/// Writes `bytes` to `dir/name` atomically: a reader sees either no file or
/// the whole file, also across a crash (an OS crash only with `fsync` on).
pub fn write_atomic(
    dir: &Path,
    name: &str,
    tmp_name: &str,
    bytes: &[u8],
    fsync: &Fsync,
) -> Result<()> {
    let tmp = dir.join(tmp_name);
    let target = dir.join(name);
    let io = |what: &str, p: &Path, e| Error::io(format!("{what} {}", p.display()), e);
    let mut f = File::create(&tmp).map_err(|e| io("writing", &tmp, e))?;
    f.write_all(bytes).map_err(|e| io("writing", &tmp, e))?;
    fsync.file(&f).map_err(|e| io("fsyncing", &tmp, e))?;
    drop(f);
    fsync.barrier(dir)?;
    fs::rename(&tmp, &target).map_err(|e| io("renaming into", &target, e))?;
    fsync.dir(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_releases_compare_by_major_then_minor() {
        assert!(release_at_least("6.18.44-fc-v657\n", (5, 8)));
        assert!(release_at_least("5.8.0", (5, 8)));
        assert!(release_at_least("5.10.0-13-amd64", (5, 8)));
        assert!(!release_at_least("5.7.19", (5, 8)));
        assert!(!release_at_least("4.19.0", (5, 8)));
        assert!(!release_at_least("", (5, 8)));
    }

    #[test]
    fn syncfs_is_the_mode_in_effect_on_this_kernel() {
        let expected = if syncfs_reports_errors() {
            FsyncMode::Syncfs
        } else {
            FsyncMode::PerFile
        };
        assert_eq!(Fsync::new(FsyncMode::Syncfs).mode(), expected);
        assert_eq!(Fsync::new(FsyncMode::Off).mode(), FsyncMode::Off);
    }
}
