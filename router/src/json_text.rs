//! Renders JSON values as text exactly like Python's `json.dumps(x, ensure_ascii=False)`, the rule the
//! reference servers use for non-string states and descriptions (key order kept, non-ASCII kept).

use serde_json::Value;
use std::io;

/// Separators between items and between a key and its value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Separators {
    /// `", "` and `": "` — Python's default.
    Default,
    /// `","` and `":"` — `separators=(",", ":")`.
    Compact,
}

struct PythonFormatter {
    item: &'static [u8],
    key: &'static [u8],
}

impl PythonFormatter {
    fn separate<W: ?Sized + io::Write>(&self, w: &mut W, first: bool) -> io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(self.item)
        }
    }
}

impl serde_json::ser::Formatter for PythonFormatter {
    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.separate(w, first)
    }
    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.separate(w, first)
    }
    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(self.key)
    }
    fn write_f64<W: ?Sized + io::Write>(&mut self, w: &mut W, value: f64) -> io::Result<()> {
        w.write_all(python_float_repr(value).as_bytes())
    }
}

/// Python's `repr(float)`: the shortest round-trip digits, positional while the decimal exponent is in
/// (-4, 16], else `d.ddde±XX`; integral values keep a `.0`.
pub fn python_float_repr(value: f64) -> String {
    if value.is_nan() {
        return "NaN".into();
    }
    if value.is_infinite() {
        return if value > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        };
    }
    // Rust's LowerExp prints the shortest digits that round-trip, e.g. "-1.2345e-7".
    let sci = format!("{value:e}");
    let (mantissa, exponent) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let decpt = exponent + 1;
    if -4 < decpt && decpt <= 16 {
        let body = if decpt <= 0 {
            format!("0.{}{digits}", "0".repeat((-decpt) as usize))
        } else if (decpt as usize) >= digits.len() {
            format!("{digits}{}.0", "0".repeat(decpt as usize - digits.len()))
        } else {
            format!(
                "{}.{}",
                &digits[..decpt as usize],
                &digits[decpt as usize..]
            )
        };
        format!("{sign}{body}")
    } else {
        let (first, rest) = digits.split_at(1);
        let fraction = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let exp_sign = if exponent < 0 { '-' } else { '+' };
        format!("{sign}{first}{fraction}e{exp_sign}{:02}", exponent.abs())
    }
}

/// `json.dumps(value, ensure_ascii=False, indent=2)`: one item per line, two spaces a level, `": "`
/// between key and value, empty containers as `[]` / `{}` (serde's pretty layout is Python's).
pub fn dumps_indented(value: &Value) -> String {
    let mut out = Vec::new();
    let formatter = IndentedPython(serde_json::ser::PrettyFormatter::with_indent(b"  "));
    let mut ser = serde_json::Serializer::with_formatter(&mut out, formatter);
    // Serializing a Value into memory cannot fail.
    let _ = serde::Serialize::serialize(value, &mut ser);
    String::from_utf8(out).unwrap_or_default()
}

/// serde's pretty layout with Python's float text.
struct IndentedPython(serde_json::ser::PrettyFormatter<'static>);

impl serde_json::ser::Formatter for IndentedPython {
    fn begin_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.begin_array(w)
    }
    fn end_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_array(w)
    }
    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.0.begin_array_value(w, first)
    }
    fn end_array_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_array_value(w)
    }
    fn begin_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.begin_object(w)
    }
    fn end_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_object(w)
    }
    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.0.begin_object_key(w, first)
    }
    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.begin_object_value(w)
    }
    fn end_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_object_value(w)
    }
    fn write_f64<W: ?Sized + io::Write>(&mut self, w: &mut W, value: f64) -> io::Result<()> {
        w.write_all(python_float_repr(value).as_bytes())
    }
}

/// `json.dumps(value, ensure_ascii=False, separators=...)`.
pub fn dumps(value: &Value, separators: Separators) -> String {
    let (item, key): (&'static [u8], &'static [u8]) = match separators {
        Separators::Default => (b", ", b": "),
        Separators::Compact => (b",", b":"),
    };
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, PythonFormatter { item, key });
    // Serializing a Value into memory cannot fail.
    let _ = serde::Serialize::serialize(value, &mut ser);
    String::from_utf8(out).unwrap_or_default()
}

/// A string is used as is; anything else is its JSON text.
pub fn text_or_json(value: &Value, separators: Separators) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => dumps(other, separators),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn matches_python_default_separators() {
        let v: Value = serde_json::from_str(
            r#"{"ticket": "Refund not received", "days": 12, "tags": ["a", "b"], "x": null}"#,
        )
        .unwrap();
        assert_eq!(
            dumps(&v, Separators::Default),
            r#"{"ticket": "Refund not received", "days": 12, "tags": ["a", "b"], "x": null}"#
        );
        assert_eq!(
            dumps(&v, Separators::Compact),
            r#"{"ticket":"Refund not received","days":12,"tags":["a","b"],"x":null}"#
        );
    }

    #[test]
    fn keeps_key_order_and_non_ascii() {
        let v: Value =
            serde_json::from_str(r#"{"zé": "naïve ☃", "a": {"b": [1.5, true]}}"#).unwrap();
        assert_eq!(
            dumps(&v, Separators::Default),
            r#"{"zé": "naïve ☃", "a": {"b": [1.5, true]}}"#
        );
    }

    #[test]
    fn escapes_like_python() {
        let v = json!(["line\nbreak\t\"q\"\\", "\u{1}"]);
        assert_eq!(
            dumps(&v, Separators::Default),
            r#"["line\nbreak\t\"q\"\\", "\u0001"]"#
        );
    }

    #[test]
    fn floats_print_like_python_repr() {
        let cases = [
            (1e-07, "1e-07"),
            (1e20, "1e+20"),
            (0.1, "0.1"),
            (3.0, "3.0"),
            (-0.0, "-0.0"),
            (0.0001, "0.0001"),
            (0.00001234, "1.234e-05"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (123.456, "123.456"),
            (-2.5e-300, "-2.5e-300"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (12345678901234567.0, "1.2345678901234568e+16"),
        ];
        for (value, python) in cases {
            assert_eq!(python_float_repr(value), python, "{value}");
        }
        let v: Value = serde_json::from_str(
            r#"{"ratio": 1e-07, "volume": 1e+20, "price": 0.1, "count": 3.0, "n": 3}"#,
        )
        .unwrap();
        assert_eq!(
            dumps(&v, Separators::Default),
            r#"{"ratio": 1e-07, "volume": 1e+20, "price": 0.1, "count": 3.0, "n": 3}"#
        );
    }

    #[test]
    fn indented_like_python_indent_2() {
        let v: Value = serde_json::from_str(
            r#"{"ticket": "Refund ☃", "days": 12, "tags": ["a", 1.0], "empty": {}, "none": [], "x": null}"#,
        )
        .unwrap();
        // json.dumps(v, ensure_ascii=False, indent=2)
        assert_eq!(
            dumps_indented(&v),
            "{\n  \"ticket\": \"Refund ☃\",\n  \"days\": 12,\n  \"tags\": [\n    \"a\",\n    1.0\n  ],\n  \"empty\": {},\n  \"none\": [],\n  \"x\": null\n}"
        );
        assert_eq!(dumps_indented(&json!([])), "[]");
        assert_eq!(dumps_indented(&json!(1e-07)), "1e-07");
    }

    #[test]
    fn strings_pass_through() {
        assert_eq!(text_or_json(&json!("plain"), Separators::Default), "plain");
        assert_eq!(text_or_json(&json!(null), Separators::Default), "null");
    }
}
