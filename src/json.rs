//! JSON written the way Python's `json.dump(obj, f, indent=2)` writes it,
//! which is how compressed-tensors and transformers write config.json and
//! the index: floats in Python's `repr` (`1e-06`, `10000.0`), non-ASCII
//! escaped (`ensure_ascii`), no newline at the end. Tools that diff their
//! own output against ours see the same bytes.

use std::io::{self, Write};

use serde_json::ser::{Formatter, PrettyFormatter};

/// [`text`] of file `name`'s contents, an error naming it when `v` cannot
/// be written.
pub(crate) fn file(name: &str, v: &impl serde::Serialize) -> crate::error::Result<Vec<u8>> {
    text(v).map_err(|e| {
        crate::error::Error::new(
            crate::error::Rule::Io,
            std::path::Path::new(name),
            "cannot write JSON",
        )
        .caused_by(e)
    })
}

/// `v` as Python's `json.dumps(v, indent=2)`.
pub(crate) fn text(v: &impl serde::Serialize) -> serde_json::Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, Python(PrettyFormatter::new()));
    v.serialize(&mut ser)?;
    Ok(out)
}

/// Python's `repr` of a finite float: the shortest digits that read back
/// as `x`, in fixed notation when the decimal point falls within 16 digits
/// of them, else as `d.ddde±XX`.
pub(crate) fn python_float(x: f64) -> String {
    // Rust's `{:e}` gives the same shortest digits: `d.ddde<exp>`.
    let sci = format!("{:e}", x.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let exp: i32 = exp.parse().unwrap_or(0);
    let sign = if x.is_sign_negative() { "-" } else { "" };
    // The decimal point sits after `point` digits.
    let point = exp + 1;
    let n = digits.len() as i32;
    let body = if (-3..=16).contains(&point) {
        if point <= 0 {
            format!("0.{}{digits}", "0".repeat((-point) as usize))
        } else if point < n {
            format!(
                "{}.{}",
                &digits[..point as usize],
                &digits[point as usize..]
            )
        } else {
            format!("{digits}{}.0", "0".repeat((point - n) as usize))
        }
    } else {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let e = point - 1;
        format!(
            "{first}{frac}e{}{:02}",
            if e < 0 { '-' } else { '+' },
            e.unsigned_abs()
        )
    };
    format!("{sign}{body}")
}

/// serde_json's pretty printer with Python's floats and `ensure_ascii`.
struct Python<'a>(PrettyFormatter<'a>);

/// `Formatter` methods of [`Python`] that are its pretty printer's: each
/// passes its writer (and `first`, where it takes one) on to it.
macro_rules! forward_to_pretty {
    ($($name:ident $(($arg:ident: $ty:ty))?),* $(,)?) => {$(
        fn $name<W: ?Sized + Write>(&mut self, w: &mut W $(, $arg: $ty)?) -> io::Result<()> {
            self.0.$name(w $(, $arg)?)
        }
    )*};
}

impl Formatter for Python<'_> {
    fn write_f64<W: ?Sized + Write>(&mut self, w: &mut W, x: f64) -> io::Result<()> {
        w.write_all(python_float(x).as_bytes())
    }

    fn write_f32<W: ?Sized + Write>(&mut self, w: &mut W, x: f32) -> io::Result<()> {
        self.write_f64(w, x as f64)
    }

    fn write_string_fragment<W: ?Sized + Write>(&mut self, w: &mut W, s: &str) -> io::Result<()> {
        for c in s.chars() {
            if c.is_ascii() {
                w.write_all(&[c as u8])?;
            } else {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    write!(w, "\\u{u:04x}")?;
                }
            }
        }
        Ok(())
    }

    // The layout (indents, newlines) is the pretty printer's.
    forward_to_pretty! {
        begin_array, end_array, begin_array_value(first: bool), end_array_value,
        begin_object, end_object, begin_object_key(first: bool), begin_object_value,
        end_object_value,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_read_as_python_repr() {
        for (x, want) in [
            (1e-6, "1e-06"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (0.02, "0.02"),
            (10000.0, "10000.0"),
            (1.5, "1.5"),
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.25e17, "1.25e+17"),
            (-2.5e-7, "-2.5e-07"),
            (1e100, "1e+100"),
            (123456.789, "123456.789"),
        ] {
            assert_eq!(python_float(x), want, "{x}");
        }
    }

    #[test]
    fn text_is_python_json_dumps_indent_2() {
        let v = serde_json::json!({"a": [1, 2.0, {}], "é": "ü🙂", "e": [], "n": null});
        let got = String::from_utf8(text(&v).unwrap()).unwrap();
        let want = "{\n  \"a\": [\n    1,\n    2.0,\n    {}\n  ],\n  \"\\u00e9\": \"\\u00fc\\ud83d\\ude42\",\n  \"e\": [],\n  \"n\": null\n}";
        assert_eq!(got, want);
    }
}
