//! Media inputs: turns a request's image, audio and video URLs into bytes under the operator's
//! limits (`MediaPolicy`), reading `data:` URLs always and fetching `http(s)` ones only from allowed hosts.
//!
//! `resolve` checks every count and every URL before it fetches anything, then fetches a few items
//! at a time and returns them in request order: images, then audio, then videos. Every error names
//! the item (`images.1`): a count over a limit is a validation error like `max_questions`, bytes or
//! pixels over a limit a 413, and anything else about an item (its URL, its data, a fetch that
//! failed or timed out, a host not allowed) a 400.

mod data_url;
mod fetch;
mod image;
mod policy;
#[cfg(test)]
mod tests;

use std::fmt;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use reqwest::Url;
use sha2::{Digest, Sha256};

use crate::error::{DecisionError, FieldError};
use crate::ir::{Media, Modality};

pub use fetch::{FetchError, Fetcher, MAX_REDIRECTS};
pub use image::{ImageFormat, ImageHeader, ImageHeaderError};
pub use policy::{AllowList, HostRule, MediaPolicy, PolicyError};

/// Items of one request fetched at once.
pub const MAX_CONCURRENT_FETCHES: usize = 4;

/// Blobs at least this large are hashed off the async workers.
const HASH_INLINE_BYTES: usize = 1 << 20;

/// One media item's bytes, ready for the shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MediaBlob {
    pub modality: Modality,
    /// Position within its field (`images[index]`).
    pub index: usize,
    pub bytes: Bytes,
    pub sha256: [u8; 32],
    /// Images: the format read from the header (`image/png`). Audio and video: the type the data URL
    /// or the server declared, without parameters; `None` when none was or it was a generic octet stream.
    pub mime: Option<String>,
}

/// Where an item sits in the request: `images.1`, or for an image sent as a message part (the
/// OpenAI shape) that part, `input[0].content[2]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Position {
    pub modality: Modality,
    pub index: usize,
    /// `(message, part)` of the `input` content part the item came from, when it came from one.
    pub part: Option<(usize, usize)>,
}

impl Position {
    /// Item `index` of `modality` in `media`, placed where the request sent it.
    pub fn of(media: &Media, modality: Modality, index: usize) -> Self {
        let part = match modality {
            Modality::Image => media.image_parts.get(index).copied(),
            Modality::Audio | Modality::Video => None,
        };
        Position {
            modality,
            index,
            part,
        }
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.part {
            Some((message, part)) => write!(f, "input[{message}].content[{part}]"),
            None => write!(f, "{}.{}", self.modality.field(), self.index),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MediaError {
    /// `limit_name` is the limit's name (`max_image_items`, `max_media_items`); `field` is where the
    /// count passes it.
    #[error("at most {limit} {what} per request ({limit_name}), got {got}")]
    TooMany {
        field: Modality,
        what: &'static str,
        limit: usize,
        got: usize,
        limit_name: &'static str,
    },
    #[error("{at}: {} the limit of {limit} bytes (max_media_bytes)", size_words(.len))]
    TooLarge {
        at: Position,
        len: Option<u64>,
        limit: usize,
    },
    #[error("{at}: a {width}x{height} image is {} pixels, over the limit of {limit} (max_image_pixels)", pixels(.width, .height))]
    TooManyPixels {
        at: Position,
        width: u64,
        height: u64,
        limit: u64,
    },
    #[error("{at}: {reason}")]
    Invalid { at: Position, reason: String },
    #[error("{at}: {error}")]
    Fetch { at: Position, error: FetchError },
    #[error("media: {0}")]
    Internal(String),
}

fn size_words(len: &Option<u64>) -> String {
    match len {
        Some(len) => format!("{len} bytes, over"),
        None => "larger than".to_owned(),
    }
}

fn pixels(width: &u64, height: &u64) -> u64 {
    width.saturating_mul(*height)
}

impl From<MediaError> for DecisionError {
    fn from(error: MediaError) -> Self {
        match &error {
            MediaError::TooMany { field, .. } => DecisionError::Invalid(vec![FieldError::new(
                vec!["body".into(), field.field().into()],
                "too_long",
                error.to_string(),
            )]),
            MediaError::TooLarge { at, .. } | MediaError::TooManyPixels { at, .. } => {
                DecisionError::MediaTooLarge {
                    param: at.to_string(),
                    message: error.to_string(),
                }
            }
            MediaError::Invalid { at, .. } | MediaError::Fetch { at, .. } => {
                DecisionError::BadRequest {
                    param: Some(at.to_string()),
                    message: error.to_string(),
                }
            }
            MediaError::Internal(_) => DecisionError::Internal(error.to_string()),
        }
    }
}

/// The request's media as bytes, in field order (images, audio, videos) and request order within
/// each; the first error in that order refuses the request.
pub async fn resolve(
    media: &Media,
    policy: &MediaPolicy,
    fetcher: &Fetcher,
) -> Result<Vec<MediaBlob>, DecisionError> {
    resolve_items(media, policy, fetcher)
        .await
        .map_err(DecisionError::from)
}

/// Where an item's bytes come from, once its URL has passed every check that needs no network.
enum Source {
    Data(data_url::DataUrl),
    Http(Url),
}

async fn resolve_items(
    media: &Media,
    policy: &MediaPolicy,
    fetcher: &Fetcher,
) -> Result<Vec<MediaBlob>, MediaError> {
    check_counts(media, policy)?;
    let mut sources = Vec::new();
    for modality in Modality::ALL {
        for (index, url) in media.of(modality).iter().enumerate() {
            let at = Position::of(media, modality, index);
            sources.push((at, source(at, url, policy, fetcher)?));
        }
    }
    futures::stream::iter(sources)
        .map(|(at, source)| async move {
            let (bytes, declared) = match source {
                Source::Data(data) => (Bytes::from(data.bytes), data.mime),
                Source::Http(url) => {
                    let fetched = fetcher
                        .fetch(url, policy.max_item_bytes)
                        .await
                        .map_err(|error| fetch_failed(at, error))?;
                    let declared = fetched.content_type.as_deref().and_then(essence);
                    check_declared(at, declared.as_deref())?;
                    (fetched.bytes, declared)
                }
            };
            blob(at, bytes, declared, policy).await
        })
        .buffered(MAX_CONCURRENT_FETCHES)
        .try_collect()
        .await
}

fn check_counts(media: &Media, policy: &MediaPolicy) -> Result<(), MediaError> {
    for modality in Modality::ALL {
        let (limit, limit_name) = policy.max_of(modality);
        let got = media.of(modality).len();
        if got > limit {
            return Err(MediaError::TooMany {
                field: modality,
                what: match modality {
                    Modality::Image => "images",
                    Modality::Audio => "audio clips",
                    Modality::Video => "videos",
                },
                limit,
                got,
                limit_name,
            });
        }
    }
    let total: usize = Modality::ALL.iter().map(|m| media.of(*m).len()).sum();
    if total > policy.max_items {
        let mut seen = 0;
        let field = Modality::ALL
            .into_iter()
            .find(|m| {
                seen += media.of(*m).len();
                seen > policy.max_items
            })
            .unwrap_or(Modality::Video);
        return Err(MediaError::TooMany {
            field,
            what: "media items",
            limit: policy.max_items,
            got: total,
            limit_name: "max_media_items",
        });
    }
    Ok(())
}

/// An item's URL, checked without the network: a data URL decoded, an http(s) URL's host allowed.
fn source(
    at: Position,
    url: &str,
    policy: &MediaPolicy,
    fetcher: &Fetcher,
) -> Result<Source, MediaError> {
    let invalid = |reason: String| MediaError::Invalid { at, reason };
    if data_url::is_data_url(url) {
        let data = data_url::parse(url, policy.max_item_bytes).map_err(|e| match e {
            data_url::DataUrlError::TooLarge { len, limit } => MediaError::TooLarge {
                at,
                len: len.map(|l| l as u64),
                limit,
            },
            other => invalid(format!("invalid data URL: {other}")),
        })?;
        check_declared(at, data.mime.as_deref())?;
        return Ok(Source::Data(data));
    }
    let parsed = Url::parse(url).map_err(|_| {
        invalid(format!(
            "not a URL or data URL ({})",
            modality_hint(at.modality)
        ))
    })?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(invalid(format!(
            "{}: URLs are not read; send an http(s) URL or a data: URL",
            parsed.scheme()
        )));
    }
    fetcher
        .check(&parsed)
        .map_err(|error| fetch_failed(at, error))?;
    Ok(Source::Http(parsed))
}

fn modality_hint(modality: Modality) -> &'static str {
    match modality {
        Modality::Image => "e.g. data:image/png;base64,...",
        Modality::Audio => "e.g. data:audio/wav;base64,...",
        Modality::Video => "e.g. data:video/mp4;base64,...",
    }
}

/// Counts a failed fetch under its reason and names the item.
fn fetch_failed(at: Position, error: FetchError) -> MediaError {
    metrics::counter!("decision_media_fetch_failures_total", "reason" => error.reason())
        .increment(1);
    match error.innermost() {
        FetchError::TooLarge { len, limit } => MediaError::TooLarge {
            at,
            len: *len,
            limit: *limit,
        },
        _ => MediaError::Fetch { at, error },
    }
}

/// `type/subtype` of a Content-Type, lowercase, without parameters.
fn essence(content_type: &str) -> Option<String> {
    let essence = content_type.split(';').next()?.trim().to_ascii_lowercase();
    (!essence.is_empty()).then_some(essence)
}

/// A declared media type must be of the field's kind; generic octet streams are fine (object stores
/// serve everything as one), and so is none at all.
fn check_declared(at: Position, mime: Option<&str>) -> Result<(), MediaError> {
    let Some(mime) = mime else { return Ok(()) };
    let top = mime.split('/').next().unwrap_or_default();
    let fits = top == at.modality.noun()
        || matches!(mime, "application/octet-stream" | "binary/octet-stream")
        || (at.modality != Modality::Image
            && matches!(mime, "application/ogg" | "application/mp4"));
    if fits {
        Ok(())
    } else {
        Err(MediaError::Invalid {
            at,
            reason: format!(
                "its media type is {mime}, not {} type",
                match at.modality {
                    Modality::Image => "an image",
                    Modality::Audio => "an audio",
                    Modality::Video => "a video",
                }
            ),
        })
    }
}

/// The item's bytes checked for what the router can check (an image's header and pixels), hashed.
async fn blob(
    at: Position,
    bytes: Bytes,
    declared: Option<String>,
    policy: &MediaPolicy,
) -> Result<MediaBlob, MediaError> {
    if bytes.len() > policy.max_item_bytes {
        return Err(MediaError::TooLarge {
            at,
            len: Some(bytes.len() as u64),
            limit: policy.max_item_bytes,
        });
    }
    let mime = match at.modality {
        Modality::Image => {
            let header = image::read_header(&bytes).map_err(|e| MediaError::Invalid {
                at,
                reason: e.to_string(),
            })?;
            if header.pixels() > policy.max_image_pixels {
                return Err(MediaError::TooManyPixels {
                    at,
                    width: header.width,
                    height: header.height,
                    limit: policy.max_image_pixels,
                });
            }
            Some(header.format.mime().to_owned())
        }
        _ => declared.filter(|m| !m.ends_with("/octet-stream")),
    };
    let sha256 = if bytes.len() < HASH_INLINE_BYTES {
        Sha256::digest(&bytes).into()
    } else {
        let hashed = bytes.clone();
        tokio::task::spawn_blocking(move || Sha256::digest(&hashed).into())
            .await
            .map_err(|e| MediaError::Internal(format!("hashing {at} failed: {e}")))?
    };
    metrics::counter!("decision_media_items_total", "modality" => at.modality.noun()).increment(1);
    Ok(MediaBlob {
        modality: at.modality,
        index: at.index,
        bytes,
        sha256,
        mime,
    })
}
