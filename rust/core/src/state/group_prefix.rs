//! How a composite key begins with its group: what lets a spilling
//! [`super::StateTable`] read or delete a group whose rows are partly in
//! sorted runs. Runs are sorted by key bytes, so the keys that begin with
//! one prefix are one contiguous range of each run, found by two binary
//! searches (`RunSet::scan_prefixes`) instead of a scan.
//!
//! transformWithState's list and map state and its timers are keyed by
//! `encode_keys([grouping key..., sub-key...])`, and arrow-row's encoding
//! of several columns is the columns' encodings one after another: a row's
//! key begins with the encoding of its grouping key.

use std::sync::Arc;

use arrow_array::{Array, ArrayRef};
use arrow_schema::DataType;

use super::encode::encode_keys;
use super::runs::keys::KeyColumn;
use super::runs::KeyRef;
use crate::error::{Error, Result};

/// What a group's rows' keys begin with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupPrefix {
    /// The group value's own bytes: a binary group column that holds the
    /// grouping key already encoded (transformWithState's `__group`).
    Value,
    /// The group value's [`encode_keys`] encoding: the grouping key column
    /// itself, whatever its key type.
    Encoding,
}

impl GroupPrefix {
    /// `"value"` or `"encoding"`.
    pub fn parse(text: &str) -> Result<Self> {
        match text {
            "value" => Ok(Self::Value),
            "encoding" => Ok(Self::Encoding),
            _ => Err(Error::Config(format!(
                "group prefix '{text}' is neither 'value' (the keys begin with the group \
                 column's bytes) nor 'encoding' (they begin with encode_keys of the group \
                 column)"
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Value => "value",
            Self::Encoding => "encoding",
        }
    }

    /// Refuses a table this prefix cannot describe: the keys must be bytes,
    /// and a `Value` prefix needs a binary group column.
    pub(crate) fn check(self, key: (&str, &DataType), group: (&str, &DataType)) -> Result<()> {
        if !matches!(key.1, DataType::Binary | DataType::LargeBinary) {
            return Err(Error::Config(format!(
                "a group prefix needs binary keys (composite keys from encode_keys); key \
                 column '{}' is {}",
                key.0, key.1
            )));
        }
        if self == Self::Value && !matches!(group.1, DataType::Binary | DataType::LargeBinary) {
            return Err(Error::Config(format!(
                "group prefix 'value' needs a binary group column; '{}' is {}: use 'encoding' \
                 if the keys begin with encode_keys of it",
                group.0, group.1
            )));
        }
        Ok(())
    }

    /// One prefix per group value (a key-typed array without nulls).
    pub(crate) fn prefixes(self, groups: &dyn Array) -> Result<ArrayRef> {
        match self {
            Self::Value => Ok(arrow_array::make_array(groups.to_data())),
            Self::Encoding => {
                let column = arrow_array::make_array(groups.to_data());
                Ok(Arc::new(encode_keys(&[column])?))
            }
        }
    }

    /// Refuses rows whose key does not begin with their group's prefix:
    /// a spilling table would not find them by group.
    pub(crate) fn check_rows(
        self,
        key: (&str, &dyn Array),
        group: (&str, &dyn Array),
    ) -> Result<()> {
        let prefixes = self.prefixes(group.1)?;
        let keys = KeyColumn::new(key.1)?;
        let wanted = KeyColumn::new(prefixes.as_ref())?;
        for i in 0..keys.len() {
            let (KeyRef::Bytes(k), KeyRef::Bytes(p)) = (keys.at(i), wanted.at(i)) else {
                unreachable!("checked: binary keys and prefixes");
            };
            if !k.starts_with(p) {
                return Err(Error::Config(format!(
                    "row {i}: key {} in '{}' does not begin with the {} of its group {} in \
                     '{}' (group prefix '{}'): build composite keys with encode_keys([group \
                     columns..., other key columns...])",
                    keys.at(i),
                    key.0,
                    if self == Self::Value {
                        "bytes"
                    } else {
                        "encoding"
                    },
                    KeyColumn::new(group.1)?.at(i),
                    group.0,
                    self.name()
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{BinaryArray, Int64Array, StringArray};

    #[test]
    fn encoding_prefixes_begin_composite_keys() {
        let users = Int64Array::from(vec![7, -1]);
        let seqs = Int64Array::from(vec![0, 3]);
        let composite = encode_keys(&[Arc::new(users.clone()), Arc::new(seqs)]).unwrap();
        let prefix = GroupPrefix::Encoding;
        prefix
            .check_rows(("k", &composite), ("user", &users))
            .unwrap();
        let swapped = Int64Array::from(vec![-1, 7]);
        let err = prefix
            .check_rows(("k", &composite), ("user", &swapped))
            .unwrap_err()
            .to_string();
        assert!(err.contains("row 0") && err.contains("group -1"), "{err}");
        // The group column's own bytes are not its encoding.
        let names = StringArray::from(vec!["x"]);
        let keyed = encode_keys(&[Arc::new(names.clone())]).unwrap();
        GroupPrefix::Encoding
            .check_rows(("k", &keyed), ("name", &names))
            .unwrap();
        let raw = BinaryArray::from_iter_values([b"x"]);
        assert!(GroupPrefix::Value
            .check_rows(("k", &keyed), ("name", &raw))
            .is_err());
    }

    #[test]
    fn refuses_what_a_prefix_cannot_describe() {
        assert!(GroupPrefix::parse("bytes").is_err());
        assert_eq!(GroupPrefix::parse("value").unwrap(), GroupPrefix::Value);
        let int = ("k", &DataType::Int64);
        let bin = ("k", &DataType::Binary);
        let err = GroupPrefix::Encoding
            .check(int, ("g", &DataType::Int64))
            .unwrap_err();
        assert!(err.to_string().contains("binary keys"), "{err}");
        let err = GroupPrefix::Value
            .check(bin, ("g", &DataType::Int64))
            .unwrap_err();
        assert!(err.to_string().contains("use 'encoding'"), "{err}");
        GroupPrefix::Value
            .check(bin, ("g", &DataType::LargeBinary))
            .unwrap();
    }
}
