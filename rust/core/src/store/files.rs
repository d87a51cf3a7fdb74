//! File-level I/O (the rules are in [`super::format`]): writing an encoded
//! Arrow IPC file, checked reads, and the atomic write (temp + fsync + rename + directory fsync).

use std::fs::{self, File};
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow_array::RecordBatch;
use arrow_buffer::Buffer;
use arrow_schema::Schema;

use super::direct::OutputFile;
use super::format::{
    check_file, check_file_in_slices, encode_ipc_into, missing_file, EncodeError, Written,
};
use super::manifest::FileEntry;
use super::mapped::{map_file_pages, MappedPages};
use crate::error::{Error, Result};

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
    /// bench/results/store_cost/syncfs/). `syncfs` also writes back other
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
    /// Write files with direct I/O where the filesystem takes it
    /// ([`super::direct`]).
    direct: bool,
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
            direct: false,
        }
    }

    /// Files written under this policy go to the device with direct I/O
    /// where the filesystem takes it (`on`), or through the page cache.
    pub fn with_direct_io(mut self, on: bool) -> Self {
        self.direct = on;
        self
    }

    /// Whether files are written with direct I/O where possible.
    pub fn direct_io(&self) -> bool {
        self.direct
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
    pub(crate) fn file(&self, f: &File) -> std::io::Result<()> {
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
    write_encoded(path, fsync, |out, what| {
        encode_ipc_into(out, schema, batches, what)
    })
}

/// Creates (or replaces) the file at `path`, has `encode` write it through
/// a buffer (given the file's name for its errors), then flushes it and
/// fsyncs it if `fsync` says so.
pub(crate) fn write_encoded(
    path: &Path,
    fsync: &Fsync,
    encode: impl FnOnce(OutputFile, &str) -> std::result::Result<(OutputFile, Written), EncodeError>,
) -> Result<Written> {
    let what = path.display().to_string();
    let io = |e: std::io::Error| Error::io(format!("writing {what}"), e);
    let out = OutputFile::create(path, fsync.direct).map_err(io)?;
    let (out, written) = encode(out, &what).map_err(|e| match e {
        EncodeError::Io(e) => io(e),
        EncodeError::Format(e) => e,
    })?;
    let file = out.finish().map_err(io)?;
    fsync.file(&file).map_err(io)?;
    Ok(written)
}

/// Writes `bytes` as the file at `path`, fsynced if `fsync` says so (a
/// filter beside a state file: published, like it, by the manifest).
pub fn write_file(path: &Path, bytes: &[u8], fsync: &Fsync) -> Result<()> {
    let io = |e: std::io::Error| Error::io(format!("writing {}", path.display()), e);
    let mut file = File::create(path).map_err(io)?;
    file.write_all(bytes).map_err(io)?;
    fsync.file(&file).map_err(io)
}

/// Reads a file of a checkpoint, checking it against its manifest entry
/// first (size and checksum): a corrupt file is an error, never silently read.
pub fn read_checked(dir: &Path, entry: &FileEntry, checkpoint: u64) -> Result<Vec<u8>> {
    let path = dir.join(&entry.path);
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(missing_file(checkpoint, &path.display().to_string()))
        }
        Err(e) => return Err(Error::io(format!("reading {}", path.display()), e)),
    };
    check_file(entry, &bytes, checkpoint, &path.display().to_string())?;
    Ok(bytes)
}

/// As [`read_checked`], through a read-only mapping ([`super::mapped`]): the
/// file's pages are page cache, not heap, and its arrays can point into it.
/// The checksum reads every page once.
pub fn map_checked(dir: &Path, entry: &FileEntry, checkpoint: u64) -> Result<Buffer> {
    map_checked_pages(dir, entry, checkpoint).map(|(buffer, _)| buffer)
}

/// Bytes of a mapped file checksummed between two releases of its pages.
const CHECK_SLICE: usize = 16 << 20;

/// As [`map_checked`], with the mapping's pages: the pages the checksum
/// reads are let go of every [`CHECK_SLICE`] bytes, so a reader that goes
/// through the file once (a compaction) holds only what it reads next.
pub(crate) fn map_checked_pages(
    dir: &Path,
    entry: &FileEntry,
    checkpoint: u64,
) -> Result<(Buffer, Option<MappedPages>)> {
    let path = dir.join(&entry.path);
    let what = path.display().to_string();
    let (buffer, pages) =
        map_file_pages(&path, &what)?.ok_or_else(|| missing_file(checkpoint, &what))?;
    let release = || pages.iter().for_each(MappedPages::release);
    check_file_in_slices(entry, &buffer, checkpoint, &what, CHECK_SLICE, release)?;
    Ok((buffer, pages))
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

    #[test]
    fn an_ipc_file_is_the_same_bytes_written_directly_or_through_the_cache() {
        use arrow_array::{Int64Array, RecordBatch};
        use std::sync::Arc;
        let dir = tempfile::tempdir().unwrap();
        // ~12 MB: several direct chunks and a partial last block.
        let keys = Int64Array::from_iter_values(0..1_500_000);
        let batch = RecordBatch::try_from_iter([("key", Arc::new(keys) as _)]).unwrap();
        let mut files = Vec::new();
        for direct in [false, true] {
            let path = dir.path().join(format!("{direct}.arrow"));
            let fsync = Fsync::new(FsyncMode::PerFile).with_direct_io(direct);
            assert_eq!(fsync.direct_io(), direct);
            let written =
                write_ipc(&path, &batch.schema(), std::slice::from_ref(&batch), &fsync).unwrap();
            let bytes = fs::read(&path).unwrap();
            assert_eq!(written.bytes, bytes.len() as u64);
            assert_eq!(written.crc32c, crc32c::crc32c(&bytes));
            files.push(bytes);
        }
        assert_eq!(files[0], files[1]);
    }
}
