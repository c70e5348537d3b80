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

    fn array(&self, key: &str, what: &str) -> Result<Option<&'a MetaArray>> {
        self.get(key)
            .map(|v| match v {
                MetaValue::Array(items) => Ok(items),
                _ => Err(Self::wrong(key, what, v)),
            })
            .transpose()
    }

    /// The refusal of an array whose items are not `what`.
    fn holds(key: &str, what: &str, items: &MetaArray) -> Error {
        let first = items.get(0).map_or_else(String::new, |v| v.to_string());
        bad(format!("{key} holds {first}, not {what}"))
    }

    pub(super) fn strings(&self, key: &str) -> Result<Option<Vec<&'a str>>> {
        let what = "an array of strings";
        self.array(key, what)?
            .map(|items| match items {
                MetaArray::String(s) => Ok(s.iter().collect()),
                // An empty array is one of strings too.
                _ if items.is_empty() => Ok(Vec::new()),
                _ => Err(Self::holds(key, what, items)),
            })
            .transpose()
    }

    pub(super) fn ints(&self, key: &str) -> Result<Option<Vec<i64>>> {
        let what = "an array of integers";
        self.array(key, what)?
            .map(|items| {
                Ok(match items {
                    MetaArray::I8(v) => v.iter().map(|&x| x.into()).collect(),
                    MetaArray::I16(v) => v.iter().map(|&x| x.into()).collect(),
                    MetaArray::I32(v) => v.iter().map(|&x| x.into()).collect(),
                    MetaArray::I64(v) => v.clone(),
                    MetaArray::U8(v) => v.iter().map(|&x| x.into()).collect(),
                    MetaArray::U16(v) => v.iter().map(|&x| x.into()).collect(),
                    MetaArray::U32(v) => v.iter().map(|&x| x.into()).collect(),
                    _ if items.is_empty() => Vec::new(),
                    _ => return Err(Self::holds(key, what, items)),
                })
            })
            .transpose()
    }

    pub(super) fn floats(&self, key: &str) -> Result<Option<Vec<f64>>> {
        let what = "an array of numbers";
        self.array(key, what)?
            .map(|items| {
                Ok(match items {
                    MetaArray::F32(v) => v.iter().map(|&x| x.into()).collect(),
                    MetaArray::F64(v) => v.clone(),
                    _ if items.is_empty() => Vec::new(),
                    _ => return Err(Self::holds(key, what, items)),
                })
            })
            .transpose()
    }
}
