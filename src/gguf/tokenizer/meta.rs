//! Typed reads of a GGUF file's tokenizer metadata.

use super::bad;
use crate::error::{Error, Result};
use crate::gguf::MetaValue;

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

    fn array(&self, key: &str, what: &str) -> Result<Option<&'a [MetaValue]>> {
        self.get(key)
            .map(|v| match v {
                MetaValue::Array(items) => Ok(items.as_slice()),
                _ => Err(Self::wrong(key, what, v)),
            })
            .transpose()
    }

    pub(super) fn strings(&self, key: &str) -> Result<Option<Vec<&'a str>>> {
        let what = "an array of strings";
        self.array(key, what)?
            .map(|items| {
                items
                    .iter()
                    .map(|v| {
                        v.as_str()
                            .ok_or_else(|| bad(format!("{key} holds {v}, not {what}")))
                    })
                    .collect()
            })
            .transpose()
    }

    pub(super) fn ints(&self, key: &str) -> Result<Option<Vec<i64>>> {
        let what = "an array of integers";
        self.array(key, what)?
            .map(|items| {
                items
                    .iter()
                    .map(|v| match *v {
                        MetaValue::I8(x) => Ok(x.into()),
                        MetaValue::I16(x) => Ok(x.into()),
                        MetaValue::I32(x) => Ok(x.into()),
                        MetaValue::I64(x) => Ok(x),
                        MetaValue::U8(x) => Ok(x.into()),
                        MetaValue::U16(x) => Ok(x.into()),
                        MetaValue::U32(x) => Ok(x.into()),
                        _ => Err(bad(format!("{key} holds {v}, not {what}"))),
                    })
                    .collect()
            })
            .transpose()
    }

    pub(super) fn floats(&self, key: &str) -> Result<Option<Vec<f64>>> {
        let what = "an array of numbers";
        self.array(key, what)?
            .map(|items| {
                items
                    .iter()
                    .map(|v| match *v {
                        MetaValue::F32(x) => Ok(x.into()),
                        MetaValue::F64(x) => Ok(x),
                        _ => Err(bad(format!("{key} holds {v}, not {what}"))),
                    })
                    .collect()
            })
            .transpose()
    }
}
