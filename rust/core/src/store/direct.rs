//! A checkpoint file written once, front to back, with direct I/O
//! (`O_DIRECT`) where the filesystem takes it: the bytes go from one
//! aligned buffer, reused by the writing thread, to the device, never
//! through the page cache.
//!
//! Why (issue 37): a checkpoint's files are written once and read only by
//! a restore or a compaction, yet a buffered write puts every byte in the
//! page cache first, in pages the kernel must find. On a virtual machine
//! whose guest hands free pages back to its host (virtio-balloon free-page
//! reporting, as on this project's machines) a page the guest has not used
//! for ~2 s costs a host fault to touch again: there a buffered write of a
//! 500 MB checkpoint cost ~1 s of CPU, against ~0.1 s through warm pages
//! and ~0.08 s with `O_DIRECT` (`bench/results/state_store/direct_io/`).
//! RocksDB offers the same for flushes and compactions
//! (`use_direct_io_for_flush_and_compaction`).
//!
//! Durability is unchanged: direct I/O skips the cache, not the device's
//! own, so the store still fsyncs (or `syncfs`es) before a manifest counts.
//! Where `O_DIRECT` is refused (tmpfs before Linux 6.6, some network filesystems, other
//! systems than Linux) the file is written through the page cache as
//! before; the bytes are the same either way.

use std::cell::RefCell;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;

/// Alignment of a direct write's buffer address, length and file offset:
/// a page, a multiple of every logical block size Linux supports for it.
const ALIGN: usize = 4096;

/// Bytes a direct write hands the device at a time (and the buffer's size).
const CHUNK: usize = 4 << 20;

/// A page-aligned byte buffer of [`CHUNK`] bytes.
struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
}

// SAFETY: the buffer owns its allocation; nothing else points into it.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    fn layout() -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(CHUNK, ALIGN).expect("a valid layout")
    }

    fn new() -> Self {
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(Self::layout()) };
        let ptr = std::ptr::NonNull::new(raw)
            .unwrap_or_else(|| std::alloc::handle_alloc_error(Self::layout()));
        Self { ptr }
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` points to CHUNK bytes this buffer owns, initialised
        // (zeroed) at allocation.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), CHUNK) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Self::layout()) }
    }
}

thread_local! {
    /// The writing thread's buffer, kept between files so its pages stay
    /// the thread's (a fresh one each file would touch new pages: the cost
    /// this module avoids).
    static SPARE: RefCell<Option<AlignedBuf>> = const { RefCell::new(None) };
}

/// How an [`OutputFile`] writes.
enum Mode {
    /// The bytes not yet written: `.1` of them at the buffer's start.
    Direct(AlignedBuf, usize),
    Buffered(io::BufWriter<File>),
}

/// A new file written sequentially: through the page cache, or directly
/// (see the module's notes). Call [`OutputFile::finish`] to write the end;
/// dropping it without doing so leaves the file short.
pub(crate) struct OutputFile {
    file: File,
    mode: Mode,
}

impl OutputFile {
    /// Creates (or replaces) the file at `path`; `direct`: try `O_DIRECT`.
    pub(crate) fn create(path: &Path, direct: bool) -> io::Result<Self> {
        if direct {
            if let Some(file) = open_direct(path)? {
                let buf = SPARE
                    .with(|s| s.borrow_mut().take())
                    .unwrap_or_else(AlignedBuf::new);
                return Ok(Self {
                    file,
                    mode: Mode::Direct(buf, 0),
                });
            }
        }
        let file = File::create(path)?;
        let mode = Mode::Buffered(io::BufWriter::with_capacity(1 << 20, file.try_clone()?));
        Ok(Self { file, mode })
    }

    /// Whether the file is being written with direct I/O.
    #[cfg(test)]
    fn is_direct(&self) -> bool {
        matches!(self.mode, Mode::Direct(..))
    }

    /// Writes what is left (the last, partial block through the page
    /// cache: a direct write takes whole blocks only) and returns the
    /// file, for the caller's fsync.
    pub(crate) fn finish(mut self) -> io::Result<File> {
        if let Mode::Direct(_, held) = &self.mode {
            self.write_held(held / ALIGN * ALIGN)?;
        }
        let Self { mut file, mode } = self;
        match mode {
            Mode::Direct(mut buf, held) => {
                // What is held is less than a block.
                let tail =
                    set_direct(&file, false).and_then(|()| file.write_all(&buf.bytes()[..held]));
                SPARE.with(|s| *s.borrow_mut() = Some(buf));
                tail?;
            }
            Mode::Buffered(b) => {
                b.into_inner().map_err(|e| e.into_error())?;
            }
        }
        Ok(file)
    }

    /// Writes the first `len` held bytes (a multiple of [`ALIGN`]) directly
    /// at the file's offset (also one) and moves the rest to the buffer's
    /// start. Should the filesystem refuse a direct write after all (or
    /// write part of a block), the held bytes go through the page cache
    /// and so does the rest of the file.
    fn write_held(&mut self, len: usize) -> io::Result<()> {
        let Mode::Direct(buf, held) = &mut self.mode else {
            return Ok(());
        };
        let mut done = 0;
        while done < len {
            match self.file.write(&buf.bytes()[done..len]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) if n % ALIGN == 0 => done += n,
                // A short direct write leaves the offset unaligned.
                Ok(n) => return self.fall_back(done + n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return self.fall_back(done),
                Err(e) => return Err(e),
            }
        }
        buf.bytes().copy_within(len..*held, 0);
        *held -= len;
        Ok(())
    }

    /// Switches to writing through the page cache, the held bytes from
    /// `written` on first.
    fn fall_back(&mut self, written: usize) -> io::Result<()> {
        set_direct(&self.file, false)?;
        let out = io::BufWriter::with_capacity(1 << 20, self.file.try_clone()?);
        if let Mode::Direct(mut buf, held) = std::mem::replace(&mut self.mode, Mode::Buffered(out))
        {
            let rest = self.write_all(&buf.bytes()[written..held]);
            SPARE.with(|s| *s.borrow_mut() = Some(buf));
            rest?;
        }
        Ok(())
    }
}

impl Write for OutputFile {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = match &mut self.mode {
            Mode::Buffered(b) => return b.write(data),
            Mode::Direct(buf, held) => {
                let n = data.len().min(CHUNK - *held);
                buf.bytes()[*held..*held + n].copy_from_slice(&data[..n]);
                *held += n;
                n
            }
        };
        if matches!(self.mode, Mode::Direct(_, CHUNK)) {
            self.write_held(CHUNK)?;
        }
        Ok(n)
    }

    /// Buffered mode flushes its buffer; direct mode holds a partial block
    /// until [`OutputFile::finish`] (a direct write takes whole blocks).
    fn flush(&mut self) -> io::Result<()> {
        match &mut self.mode {
            Mode::Buffered(b) => b.flush(),
            Mode::Direct(..) => Ok(()),
        }
    }
}

/// Opens `path` for direct writing, created or truncated; `None` where
/// this filesystem or system does not take `O_DIRECT`.
#[cfg(target_os = "linux")]
fn open_direct(path: &Path) -> io::Result<Option<File>> {
    use std::os::unix::fs::OpenOptionsExt;
    #[cfg(test)]
    if tests::REFUSE_OPEN.with(std::cell::Cell::get) {
        return refused(Err(io::Error::from_raw_os_error(libc::EINVAL)));
    }
    refused(
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_DIRECT)
            .open(path),
    )
}

/// An open with `O_DIRECT`: the file, `None` where the filesystem refuses
/// the flag (open(2) says so with EINVAL), or the open's other error.
#[cfg(target_os = "linux")]
fn refused(opened: io::Result<File>) -> io::Result<Option<File>> {
    match opened {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(not(target_os = "linux"))]
fn open_direct(_path: &Path) -> io::Result<Option<File>> {
    Ok(None)
}

/// Sets or clears `O_DIRECT` on an open file.
#[cfg(target_os = "linux")]
fn set_direct(file: &File, on: bool) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    // SAFETY: fcntl reads and sets the flags of a descriptor `file` keeps
    // open; no memory is passed.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    let flags = if on {
        flags | libc::O_DIRECT
    } else {
        flags & !libc::O_DIRECT
    };
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn set_direct(_file: &File, _on: bool) -> io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        /// Makes this thread's `O_DIRECT` opens refused, as a filesystem
        /// that does not take the flag refuses them.
        pub(super) static REFUSE_OPEN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_file_whose_direct_open_is_refused_is_written_through_the_page_cache() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data = pattern(CHUNK + 5_000);
        REFUSE_OPEN.with(|r| r.set(true));
        let direct = write_in(&path, true, &data, 70_000);
        REFUSE_OPEN.with(|r| r.set(false));
        assert!(!direct);
        assert_eq!(std::fs::read(&path).unwrap(), data);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn only_einval_means_the_filesystem_refuses_o_direct() {
        let einval = io::Error::from_raw_os_error(libc::EINVAL);
        assert!(refused(Err(einval)).unwrap().is_none());
        // Any other error is the open's own, not a refusal to fall back on.
        let denied = io::Error::from_raw_os_error(libc::EACCES);
        let err = refused(Err(denied)).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EACCES));
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no-such-dir").join("f");
        assert!(OutputFile::create(&missing, true).is_err());
    }

    fn pattern(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 31 % 251) as u8).collect()
    }

    fn write_in(path: &Path, direct: bool, data: &[u8], piece: usize) -> bool {
        let mut out = OutputFile::create(path, direct).unwrap();
        let was_direct = out.is_direct();
        for part in data.chunks(piece.max(1)) {
            out.write_all(part).unwrap();
        }
        out.flush().unwrap();
        let file = out.finish().unwrap();
        file.sync_all().unwrap();
        was_direct
    }

    #[test]
    fn writes_the_same_bytes_directly_and_through_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        // Around the chunk and block edges, and odd pieces.
        for len in [
            0,
            1,
            ALIGN - 1,
            ALIGN,
            ALIGN + 1,
            CHUNK - 1,
            CHUNK,
            CHUNK + 4097,
            3 * CHUNK + 5,
        ] {
            let data = pattern(len);
            for (direct, piece) in [(true, 1000), (true, CHUNK + 3), (false, 777)] {
                let path = dir.path().join(format!("f-{len}-{direct}-{piece}"));
                write_in(&path, direct, &data, piece);
                assert_eq!(
                    std::fs::read(&path).unwrap(),
                    data,
                    "{len} bytes, direct {direct}"
                );
            }
        }
    }

    #[test]
    fn replaces_a_longer_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        write_in(&path, true, &pattern(3 * CHUNK), 65536);
        let short = pattern(ALIGN + 10);
        write_in(&path, true, &short, 100);
        assert_eq!(std::fs::read(&path).unwrap(), short);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_direct_write_the_kernel_refuses_goes_on_through_the_page_cache() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let mut out = OutputFile::create(&path, true).unwrap();
        if !out.is_direct() {
            return; // this filesystem takes no O_DIRECT: nothing to refuse
        }
        let data = pattern(3 * CHUNK + 123);
        out.write_all(&data[..10_000]).unwrap();
        // Not a whole number of blocks: EINVAL from the kernel.
        out.write_held(5_000).unwrap();
        assert!(!out.is_direct());
        out.write_all(&data[10_000..]).unwrap();
        out.finish().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), data);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_direct_file_is_direct_where_the_filesystem_takes_it() {
        // Whatever the temporary directory's filesystem: direct where it
        // takes O_DIRECT (ext4, xfs, btrfs; tmpfs since Linux 6.6),
        // buffered where not.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let direct = write_in(&path, true, &pattern(CHUNK + 1), 4096);
        let fs_takes_it = open_direct(&dir.path().join("probe")).unwrap().is_some();
        assert_eq!(direct, fs_takes_it);
        assert!(!write_in(&path, false, &pattern(10), 4));
    }
}
