//! JSON-shaped values between serde and Python: a manifest entry, a
//! summary, an engine's fields cross the boundary as the dicts, lists,
//! strings and numbers `json.loads` would give, not as JSON text.
//!
//! To Python, a value is serialised and read back into Python objects as it
//! is parsed, so a struct's dict keeps the struct's field order (a
//! `serde_json::Value` would sort the keys). From Python, an object is read
//! into a `serde_json::Value` with `json.dumps`'s rules for which types are
//! JSON, then deserialised.

use std::fmt;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde::de::{DeserializeOwned, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde::Serialize;
use serde_json::{Map, Number, Value};

use snapcut_core::Error;

use crate::errors::to_py as error;

/// `value` as the Python object `json.loads(json.dumps(value))` would give.
pub fn to_py<'py, T: Serialize>(py: Python<'py>, value: &T) -> PyResult<Bound<'py, PyAny>> {
    let text = serde_json::to_string(value)
        .map_err(|e| PyValueError::new_err(format!("not serialisable as JSON: {e}")))?;
    let mut de = serde_json::Deserializer::from_str(&text);
    Seed(py)
        .deserialize(&mut de)
        .map_err(|e| PyValueError::new_err(format!("building a Python value: {e}")))
}

/// A `T` from a JSON-shaped Python object; `what` names it when its shape is
/// not a `T` (a `SnapshotError`, as a malformed manifest is). A Python
/// object that is not JSON at all is a `TypeError`, as in `json.dumps`.
pub fn from_py<T: DeserializeOwned>(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<T> {
    serde_json::from_value(value_of(obj, what)?).map_err(|e| malformed(what, e))
}

/// The JSON value of a Python object (`None`, bool, int, float, str, and
/// dicts with str keys, lists and tuples of those).
fn value_of(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Value> {
    if obj.is_none() {
        return Ok(Value::Null);
    }
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if obj.is_instance_of::<PyInt>() {
        if let Ok(i) = obj.extract::<i64>() {
            return Ok(Value::from(i));
        }
        if let Ok(u) = obj.extract::<u64>() {
            return Ok(Value::from(u));
        }
        // Past 64 bits JSON text would have been read as a float too.
        return float(obj.extract::<f64>()?, what);
    }
    if let Ok(f) = obj.cast::<PyFloat>() {
        return float(f.value(), what);
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(Value::String(s.to_str()?.to_owned()));
    }
    if let Ok(d) = obj.cast::<PyDict>() {
        let mut map = Map::new();
        for (k, v) in d.iter() {
            let key = k.cast::<PyString>().map_err(|_| {
                PyTypeError::new_err(format!(
                    "{what}: keys must be str, not {}",
                    k.get_type()
                        .name()
                        .map_or_else(|_| "?".into(), |n| n.to_string())
                ))
            })?;
            map.insert(key.to_str()?.to_owned(), value_of(&v, what)?);
        }
        return Ok(Value::Object(map));
    }
    if let Ok(l) = obj.cast::<PyList>() {
        return l.iter().map(|v| value_of(&v, what)).collect();
    }
    if let Ok(t) = obj.cast::<PyTuple>() {
        return t.iter().map(|v| value_of(&v, what)).collect();
    }
    Err(PyTypeError::new_err(format!(
        "{what}: object of type {} is not JSON serializable",
        obj.get_type()
            .name()
            .map_or_else(|_| "?".into(), |n| n.to_string())
    )))
}

fn float(f: f64, what: &str) -> PyResult<Value> {
    Number::from_f64(f)
        .map(Value::Number)
        .ok_or_else(|| malformed(what, format!("{f} is not a JSON number")))
}

/// The error of a value whose shape is not the one `what` has.
fn malformed(what: &str, why: impl fmt::Display) -> PyErr {
    error(Error::Snapshot(format!("malformed {what}: {why}")))
}

/// Builds Python objects from a serde data stream, in its order.
struct Seed<'py>(Python<'py>);

impl<'de, 'py> DeserializeSeed<'de> for Seed<'py> {
    type Value = Bound<'py, PyAny>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

/// A Python error while building, as the deserializer's error.
fn custom<E: serde::de::Error>(e: PyErr) -> E {
    E::custom(e)
}

impl<'de, 'py> Visitor<'de> for Seed<'py> {
    type Value = Bound<'py, PyAny>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        Ok(self.0.None().into_bound(self.0))
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        self.visit_unit()
    }

    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }

    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Self::Value, E> {
        Ok(PyBool::new(self.0, v).to_owned().into_any())
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
        // Integers always convert (the error type is `Infallible`).
        Ok(v.into_pyobject(self.0)
            .unwrap_or_else(|e| match e {})
            .into_any())
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(v.into_pyobject(self.0)
            .unwrap_or_else(|e| match e {})
            .into_any())
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Self::Value, E> {
        Ok(PyFloat::new(self.0, v).into_any())
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(PyString::new(self.0, v).into_any())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let list = PyList::empty(self.0);
        while let Some(v) = seq.next_element_seed(Seed(self.0))? {
            list.append(v).map_err(custom)?;
        }
        Ok(list.into_any())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let dict = PyDict::new(self.0);
        while let Some(k) = map.next_key::<String>()? {
            let v = map.next_value_seed(Seed(self.0))?;
            dict.set_item(k, v).map_err(custom)?;
        }
        Ok(dict.into_any())
    }
}
