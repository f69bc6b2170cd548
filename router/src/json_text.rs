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

impl serde_json::ser::Formatter for PythonFormatter {
    fn begin_array_value<W: ?Sized + io::Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(self.item)
        }
    }
    fn begin_object_key<W: ?Sized + io::Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(self.item)
        }
    }
    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(self.key)
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
        let v: Value = serde_json::from_str(r#"{"ticket": "Refund not received", "days": 12, "tags": ["a", "b"], "x": null}"#).unwrap();
        assert_eq!(
            dumps(&v, Separators::Default),
            r#"{"ticket": "Refund not received", "days": 12, "tags": ["a", "b"], "x": null}"#
        );
        assert_eq!(dumps(&v, Separators::Compact), r#"{"ticket":"Refund not received","days":12,"tags":["a","b"],"x":null}"#);
    }

    #[test]
    fn keeps_key_order_and_non_ascii() {
        let v: Value = serde_json::from_str(r#"{"zé": "naïve ☃", "a": {"b": [1.5, true]}}"#).unwrap();
        assert_eq!(dumps(&v, Separators::Default), r#"{"zé": "naïve ☃", "a": {"b": [1.5, true]}}"#);
    }

    #[test]
    fn escapes_like_python() {
        let v = json!(["line\nbreak\t\"q\"\\", "\u{1}"]);
        assert_eq!(dumps(&v, Separators::Default), r#"["line\nbreak\t\"q\"\\", "\u0001"]"#);
    }

    #[test]
    fn strings_pass_through() {
        assert_eq!(text_or_json(&json!("plain"), Separators::Default), "plain");
        assert_eq!(text_or_json(&json!(null), Separators::Default), "null");
    }
}
