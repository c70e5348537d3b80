//! Typed reads of a GGUF file's tokenizer metadata.

use super::bad;
use crate::error::{Error, Result};
use crate::gguf::{MetaArray, MetaValue};

/// Typed reads of the metadata; a value of the wrong type is a Rule::Gguf error.
pub(super) struct Meta<'a>(pub(super) &'a [(String, MetaValue)]);

impl<'a> Meta<'a> {
    pub(super) fn get(&self, key: &str) -> Option<&'a MetaValue> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    fn wrong(key: &str, what: &str, v: &MetaValue) -> Error {
        bad(format!("{key} is {v}, not {what}"))
    }

    pub(super) fn string(&self, key: &str) -> Result<Option<&'a str>> {
        self.get(key)
            .map(|v| v.as_str().ok_or_else(|| Self::wrong(key, "a string", v)))
            .transpose()
    }

    pub(super) fn uint(&self, key: &str) -> Result<Option<u64>> {
        self.get(key)
            .map(|v| v.as_u64().ok_or_else(|| Self::wrong(key, "a token id", v)))
            .transpose()
    }

    pub(super) fn bool(&self, key: &str) -> Result<Option<bool>> {
        self.get(key)
            .map(|v| match v {
                MetaValue::Bool(b) => Ok(*b),
                _ => Err(Self::wrong(key, "a bool", v)),
            })
            .transpose()
    }

    /// The array at `key` as `what`, which `items` reads (`None`: an array
    /// of another type; an empty one is of every type).
    fn array<T>(
        &self,
        key: &str,
        what: &str,
        items: impl FnOnce(&'a MetaArray) -> Option<Vec<T>>,
    ) -> Result<Option<Vec<T>>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let MetaValue::Array(array) = v else {
            return Err(Self::wrong(key, what, v));
        };
        match items(array) {
            Some(read) => Ok(Some(read)),
            None if array.is_empty() => Ok(Some(Vec::new())),
            None => {
                let first = array.get(0).map_or_else(String::new, |v| v.to_string());
                Err(bad(format!("{key} holds {first}, not {what}")))
            }
        }
    }

    pub(super) fn strings(&self, key: &str) -> Result<Option<Vec<&'a str>>> {
        self.array(key, "an array of strings", |items| match items {
            MetaArray::String(s) => Some(s.iter().collect()),
            _ => None,
        })
    }

    pub(super) fn ints(&self, key: &str) -> Result<Option<Vec<i64>>> {
        fn all<T: Copy + Into<i64>>(v: &[T]) -> Option<Vec<i64>> {
            Some(v.iter().map(|&x| x.into()).collect())
        }
        self.array(key, "an array of integers", |items| match items {
            MetaArray::I8(v) => all(v),
            MetaArray::I16(v) => all(v),
            MetaArray::I32(v) => all(v),
            MetaArray::I64(v) => all(v),
            MetaArray::U8(v) => all(v),
            MetaArray::U16(v) => all(v),
            MetaArray::U32(v) => all(v),
            _ => None,
        })
    }

    pub(super) fn floats(&self, key: &str) -> Result<Option<Vec<f64>>> {
        self.array(key, "an array of numbers", |items| match items {
            MetaArray::F32(v) => Some(v.iter().map(|&x| x.into()).collect()),
            MetaArray::F64(v) => Some(v.clone()),
            _ => None,
        })
    }
}
