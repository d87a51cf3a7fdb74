//! Checking what a restore relies on: one file against its entry, and a
//! whole checkpoint (`snapcut snapshots verify`, the backend's reads).

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use snapcut_core::store::format;

use super::io::Io;
use super::{entry_dict, entry_of};
use crate::errors::IntoPyResult;

/// Checks a file's bytes against its manifest entry: size and crc32c.
/// `data`: `bytes` or any contiguous unsigned-byte buffer (a mapped file's
/// `memoryview(...).cast("B")`), read in place.
#[pyfunction]
fn check_file(
    py: Python<'_>,
    data: PyBuffer<u8>,
    entry: &Bound<'_, PyAny>,
    checkpoint: u64,
    path: &str,
) -> PyResult<()> {
    let entry = entry_of(entry)?;
    if !data.is_c_contiguous() {
        return Err(PyValueError::new_err(format!(
            "checking {path}: the file's bytes are not one contiguous buffer; pass bytes or a \
             contiguous memoryview"
        )));
    }
    // SAFETY: `data` holds the exporter's buffer (and so its memory) until
    // it drops at the end of this call; the slice is only read, and a
    // `bytes` or a read-only mapping is never written meanwhile.
    let bytes =
        unsafe { std::slice::from_raw_parts(data.buf_ptr() as *const u8, data.len_bytes()) };
    py.detach(|| format::check_file(&entry, bytes, checkpoint, path))
        .map_py()
}

/// The error of a file a manifest lists but the root does not hold.
#[pyfunction]
fn missing_file(checkpoint: u64, path: &str) -> PyErr {
    crate::errors::to_py(format::missing_file(checkpoint, path))
}

/// Why a file that matches its checksum still cannot be read as listed, or None.
#[pyfunction]
fn check_structure(
    py: Python<'_>,
    data: &[u8],
    entry: &Bound<'_, PyAny>,
) -> PyResult<Option<String>> {
    let entry = entry_of(entry)?;
    Ok(py.detach(|| format::check_structure(&entry, data)))
}

/// `([(checkpoint, file entry)], [problems])` of a verify plan.
type VerifyPlan<'py> = (Vec<(u64, Bound<'py, PyAny>)>, Vec<String>);

/// What verifying checkpoint `checkpoint_id` reads (`format::plan_verify`):
/// every file of it, the state files of the bases its chains need and the
/// run files only its runs list (a compaction's output), and
/// its structural problems (a base whose manifest `manifest_of(id)` cannot
/// give is one).
#[pyfunction]
fn verify_plan<'py>(
    py: Python<'py>,
    checkpoint_id: u64,
    manifest: &[u8],
    manifest_of: &Bound<'py, PyAny>,
) -> PyResult<VerifyPlan<'py>> {
    let m = format::parse_manifest(manifest, "manifest", checkpoint_id).map_py()?;
    let io = Io::new(manifest_of);
    let (plan, bases) = format::plan_verify_with(checkpoint_id, &m, |id| io.manifest(id));
    io.finish(Ok(()))?;
    let mut files = plan
        .files
        .iter()
        .map(|&(cid, i)| {
            let owner = match bases.get(&cid) {
                Some(Ok(b)) => b,
                _ => &m,
            };
            Ok((cid, entry_dict(py, &owner.files[i])?))
        })
        .collect::<PyResult<Vec<_>>>()?;
    for (cid, f) in &plan.runs {
        files.push((*cid, entry_dict(py, f)?));
    }
    Ok((files, plan.problems))
}

/// Verifies checkpoint `checkpoint_id` as a restore relies on it
/// (`format::verify_with`): `manifest_of(id)` gives a base's manifest
/// bytes, `check(id, entry)` reads and checks one file.
#[pyfunction]
fn verify(
    checkpoint_id: u64,
    manifest: &[u8],
    manifest_of: &Bound<'_, PyAny>,
    check: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let m = format::parse_manifest(manifest, "manifest", checkpoint_id).map_py()?;
    let (bases, files) = (Io::new(manifest_of), Io::new(check));
    let r = format::verify_with(
        checkpoint_id,
        &m,
        |id| bases.manifest(id),
        |id, f| files.check(id, f),
    );
    let r = files.finish(Ok(r))?;
    bases.finish(r)
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(check_file, m)?)?;
    m.add_function(wrap_pyfunction!(missing_file, m)?)?;
    m.add_function(wrap_pyfunction!(check_structure, m)?)?;
    m.add_function(wrap_pyfunction!(verify_plan, m)?)?;
    m.add_function(wrap_pyfunction!(verify, m)?)?;
    Ok(())
}
