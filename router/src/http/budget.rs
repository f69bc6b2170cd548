//! A request's time budget: `--request-timeout-secs`, or less when the client says how long it will
//! wait, so that work it would give up on is refused at once (529 + Retry-After) instead of run and
//! thrown away.
//!
//! `X-Request-Timeout` (seconds) is this server's header. The OpenAI and Anthropic SDKs send their
//! own timeout as `X-Stainless-Timeout` on every request; it is honoured too. The shortest applies.

use std::time::Duration;

use axum::http::HeaderMap;

use crate::error::DecisionError;
use crate::limits::Budget;

/// This server's budget header, in seconds.
pub const REQUEST_TIMEOUT_HEADER: &str = "x-request-timeout";
/// The Stainless-generated SDKs' (OpenAI, Anthropic) timeout header, in seconds.
pub const STAINLESS_TIMEOUT_HEADER: &str = "x-stainless-timeout";

/// The budget of a request with these headers under `flag` (`--request-timeout-secs`; `None` when
/// off). A malformed `X-Request-Timeout` is a 400 naming it; a malformed `X-Stainless-Timeout` is
/// ignored (it is the SDK's, not a request to this server).
pub(super) fn of(
    headers: &HeaderMap,
    flag: Option<Duration>,
) -> Result<Option<Budget>, DecisionError> {
    let mut budget = flag.map(|limit| Budget {
        limit,
        source: Budget::FLAG,
    });
    let asked = match headers.get(REQUEST_TIMEOUT_HEADER) {
        Some(value) => Some(value.to_str().ok().and_then(seconds).ok_or_else(|| {
            DecisionError::BadRequest {
                param: Some(REQUEST_TIMEOUT_HEADER.into()),
                message: format!(
                    "{REQUEST_TIMEOUT_HEADER}: a positive number of seconds, got {value:?}"
                ),
            }
        })?)
        .map(|limit| Budget {
            limit,
            source: "x-request-timeout header",
        }),
        None => None,
    };
    let sdk = headers
        .get(STAINLESS_TIMEOUT_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(seconds)
        .map(|limit| Budget {
            limit,
            source: "x-stainless-timeout header",
        });
    for candidate in [asked, sdk].into_iter().flatten() {
        if budget.is_none_or(|b| candidate.limit < b.limit) {
            budget = Some(candidate);
        }
    }
    Ok(budget)
}

/// A positive, finite number of seconds (`10`, `2.5`).
fn seconds(text: &str) -> Option<Duration> {
    let secs: f64 = text.trim().parse().ok()?;
    (secs.is_finite() && secs > 0.0)
        .then(|| Duration::try_from_secs_f64(secs).ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn the_shortest_of_the_flag_and_the_headers_applies() {
        let flag = Some(Duration::from_secs(120));
        assert_eq!(
            of(&headers(&[]), flag).unwrap(),
            Some(Budget {
                limit: Duration::from_secs(120),
                source: "request_timeout_secs"
            })
        );
        assert_eq!(of(&headers(&[]), None).unwrap(), None);
        let asked = of(&headers(&[("x-request-timeout", "2.5")]), flag).unwrap();
        assert_eq!(asked.unwrap().limit, Duration::from_millis(2500));
        assert_eq!(asked.unwrap().source, "x-request-timeout header");
        // A longer ask never extends the flag.
        let longer = of(&headers(&[("x-request-timeout", "600")]), flag).unwrap();
        assert_eq!(longer.unwrap().source, "request_timeout_secs");
        // With the flag off, the header alone.
        let alone = of(&headers(&[("x-request-timeout", "3")]), None).unwrap();
        assert_eq!(alone.unwrap().limit, Duration::from_secs(3));
        // The SDKs' header, the shortest of the three.
        let sdk = of(
            &headers(&[("x-request-timeout", "30"), ("x-stainless-timeout", "10")]),
            flag,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (sdk.limit, sdk.source),
            (Duration::from_secs(10), "x-stainless-timeout header")
        );
    }

    #[test]
    fn a_malformed_budget_is_a_400_naming_the_header_and_a_malformed_sdk_one_is_ignored() {
        for bad in ["0", "-1", "soon", "NaN", "inf"] {
            match of(&headers(&[("x-request-timeout", bad)]), None) {
                Err(DecisionError::BadRequest { param, message }) => {
                    assert_eq!(param.as_deref(), Some("x-request-timeout"));
                    assert!(message.contains("positive number of seconds"), "{message}");
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
        let flag = Some(Duration::from_secs(120));
        let ignored = of(&headers(&[("x-stainless-timeout", "never")]), flag).unwrap();
        assert_eq!(ignored.unwrap().source, "request_timeout_secs");
    }
}
