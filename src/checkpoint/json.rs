//! The one JSON check serde_json does not make: a key written twice in one
//! object. serde_json keeps the last value silently, so a header or an index
//! that maps one name twice would be read as if it did not.

use std::cell::RefCell;
use std::collections::HashSet;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

/// Where a value sits: the root, or a key or an item under its parent's
/// place. The dotted text is made only for a key that repeats, so walking
/// costs no more than reading (a long key above a long array is not copied
/// once per item).
enum Place<'p> {
    Root,
    Key(&'p Place<'p>, &'p str),
    Item(&'p Place<'p>, usize),
}

impl Place<'_> {
    /// `a.b[3].c`, from the root down.
    fn text(&self) -> String {
        let mut up = Vec::new();
        let mut at = self;
        loop {
            match at {
                Place::Root => break,
                Place::Key(parent, _) | Place::Item(parent, _) => {
                    up.push(at);
                    at = parent;
                }
            }
        }
        let mut out = String::new();
        for p in up.iter().rev() {
            match p {
                Place::Key(_, key) if out.is_empty() => out.push_str(key),
                Place::Key(_, key) => {
                    out.push('.');
                    out.push_str(key);
                }
                Place::Item(_, i) => out.push_str(&format!("[{i}]")),
                Place::Root => {}
            }
        }
        out
    }
}

/// Walks any JSON value at place `.0`; the first key an object repeats is
/// recorded in `.1` (out of band: serde's error is only text) and stops it.
struct Walk<'p, 'f>(&'p Place<'p>, &'f RefCell<Option<String>>);

impl<'de> DeserializeSeed<'de> for Walk<'_, '_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        // Hashed: an object of n keys is checked in time linear in n.
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            let place = Place::Key(self.0, &key);
            if seen.contains(key.as_str()) {
                *self.1.borrow_mut() = Some(place.text());
                return Err(serde::de::Error::custom("duplicate key"));
            }
            map.next_value_seed(Walk(&place, self.1))?;
            seen.insert(key);
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut i = 0;
        while seq
            .next_element_seed(Walk(&Place::Item(self.0, i), self.1))?
            .is_some()
        {
            i += 1;
        }
        Ok(())
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
}

/// The dotted path of the first key repeated inside one object of `text`,
/// if any (`None` too for text that is not JSON: parsing reports that).
pub(crate) fn duplicate_key(text: &[u8]) -> Option<String> {
    let found = RefCell::new(None);
    let mut de = serde_json::Deserializer::from_slice(text);
    // Deep nesting is refused by serde_json's own recursion limit.
    let _ = Walk(&Place::Root, &found).deserialize(&mut de);
    found.into_inner()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_repeated_keys_at_any_depth() {
        assert_eq!(duplicate_key(br#"{"a": 1, "b": 2}"#), None);
        assert_eq!(duplicate_key(br#"{"a": 1, "a": 2}"#), Some("a".into()));
        assert_eq!(
            duplicate_key(br#"{"weight_map": {"x": "1", "y": "2", "x": "3"}}"#),
            Some("weight_map.x".into())
        );
        assert_eq!(
            duplicate_key(br#"{"t": [{"k": 1}, {"k": 1, "k": 2}]}"#),
            Some("t[1].k".into())
        );
        assert_eq!(
            duplicate_key(br#"[{"a": 1, "a": 2}]"#),
            Some("[0].a".into())
        );
        assert_eq!(
            duplicate_key(br#"{"k": [[0], [1, {"x": [{}, {"y": 1, "y": 2}]}]]}"#),
            Some("k[1][1].x[1].y".into())
        );
        assert_eq!(duplicate_key(b"{not json"), None);
    }
}
