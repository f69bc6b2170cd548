//! `data:` URLs (RFC 2397): the declared media type and the decoded bytes. Always accepted, whatever
//! the fetch rules, because they carry their bytes with them.

use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine;

/// Clients differ on padding and on the last symbol's spare bits; neither changes the bytes.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true),
);

#[derive(Debug, PartialEq, Eq)]
pub struct DataUrl {
    /// `type/subtype` in lowercase, without parameters; `None` when the URL declares none.
    pub mime: Option<String>,
    pub bytes: Vec<u8>,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum DataUrlError {
    #[error("a data URL needs a ',' before its data")]
    NoComma,
    #[error("'{0}' is not a media type (type/subtype)")]
    BadMediaType(String),
    #[error("its base64 data does not decode: {0}")]
    BadBase64(String),
    #[error("its data has a '%' not followed by two hex digits")]
    BadPercent,
    /// The decoded bytes would exceed the limit; `len` is the decoded length when known.
    #[error("its data is larger than {limit} bytes")]
    TooLarge { len: Option<usize>, limit: usize },
}

/// Whether a URL is a data URL (the scheme is case-insensitive).
pub fn is_data_url(url: &str) -> bool {
    url.get(..5)
        .is_some_and(|s| s.eq_ignore_ascii_case("data:"))
}

/// Decodes a data URL, refusing before decoding when its data cannot fit `max_bytes`.
pub fn parse(url: &str, max_bytes: usize) -> Result<DataUrl, DataUrlError> {
    let rest = url.get(5..).ok_or(DataUrlError::NoComma)?;
    let (header, data) = rest.split_once(',').ok_or(DataUrlError::NoComma)?;
    let mut params = header.split(';').map(str::trim);
    let media_type = params.next().unwrap_or_default().to_ascii_lowercase();
    let base64 = params.any(|p| p.eq_ignore_ascii_case("base64"));
    let mime = if media_type.is_empty() {
        None
    } else {
        match media_type.split_once('/') {
            Some((t, s)) if is_token(t) && is_token(s) => Some(media_type.clone()),
            _ => return Err(DataUrlError::BadMediaType(media_type)),
        }
    };
    let bytes = if base64 {
        // Four symbols are three bytes: refuse a data part that cannot fit before decoding it.
        if data.len() / 4 * 3 > max_bytes.saturating_add(3) {
            return Err(DataUrlError::TooLarge {
                len: None,
                limit: max_bytes,
            });
        }
        BASE64
            .decode(data.trim_end())
            .map_err(|e| DataUrlError::BadBase64(e.to_string()))?
    } else {
        percent_decode(data.as_bytes(), max_bytes)?
    };
    if bytes.len() > max_bytes {
        return Err(DataUrlError::TooLarge {
            len: Some(bytes.len()),
            limit: max_bytes,
        });
    }
    Ok(DataUrl { mime, bytes })
}

fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$&-^_.+".contains(&b))
}

fn percent_decode(data: &[u8], max_bytes: usize) -> Result<Vec<u8>, DataUrlError> {
    let mut out = Vec::with_capacity(data.len().min(max_bytes));
    let mut i = 0;
    while i < data.len() {
        let byte = if data[i] == b'%' {
            let hex = data
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or(DataUrlError::BadPercent)?;
            i += 3;
            hex
        } else {
            i += 1;
            data[i - 1]
        };
        if out.len() == max_bytes {
            return Err(DataUrlError::TooLarge {
                len: None,
                limit: max_bytes,
            });
        }
        out.push(byte);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_with_or_without_padding() {
        for url in [
            "data:image/png;base64,aGVsbG8=",
            "data:image/png;base64,aGVsbG8",
            "DATA:Image/PNG;BASE64,aGVsbG8=",
        ] {
            assert!(is_data_url(url));
            assert_eq!(
                parse(url, 100).unwrap(),
                DataUrl {
                    mime: Some("image/png".into()),
                    bytes: b"hello".to_vec()
                },
                "{url}"
            );
        }
    }

    #[test]
    fn parameters_and_percent_encoding() {
        assert_eq!(
            parse("data:audio/wav;name=a.wav;base64,AAE=", 10).unwrap(),
            DataUrl {
                mime: Some("audio/wav".into()),
                bytes: vec![0, 1]
            }
        );
        assert_eq!(
            parse("data:,a%20b%ff", 10).unwrap(),
            DataUrl {
                mime: None,
                bytes: b"a b\xff".to_vec()
            }
        );
        assert_eq!(parse("data:,%2", 10), Err(DataUrlError::BadPercent));
        assert_eq!(parse("data:,%zz", 10), Err(DataUrlError::BadPercent));
    }

    #[test]
    fn malformed_urls_are_named() {
        assert_eq!(
            parse("data:image/png;base64", 10),
            Err(DataUrlError::NoComma)
        );
        assert!(matches!(
            parse("data:image/png;base64,@@@@", 10),
            Err(DataUrlError::BadBase64(_))
        ));
        assert_eq!(
            parse("data:png;base64,AAAA", 10),
            Err(DataUrlError::BadMediaType("png".into()))
        );
        assert!(!is_data_url("dat"));
        assert!(!is_data_url("http://x/data:"));
    }

    #[test]
    fn size_is_checked_before_and_after_decoding() {
        // 12 symbols decode to 9 bytes.
        assert_eq!(
            parse("data:;base64,AAAAAAAAAAAA", 9).unwrap().bytes.len(),
            9
        );
        assert_eq!(
            parse("data:;base64,AAAAAAAAAAAA", 8),
            Err(DataUrlError::TooLarge {
                len: Some(9),
                limit: 8
            })
        );
        let huge = format!("data:;base64,{}", "A".repeat(4000));
        assert_eq!(
            parse(&huge, 100),
            Err(DataUrlError::TooLarge {
                len: None,
                limit: 100
            })
        );
        assert!(matches!(
            parse("data:,abcdef", 5),
            Err(DataUrlError::TooLarge { .. })
        ));
    }
}
