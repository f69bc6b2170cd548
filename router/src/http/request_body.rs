//! Reading a request's body under `--max-body-bytes`, and refusing one over it so that the refusal
//! reaches the client.
//!
//! A body over the limit is refused with 413. Refusing it unread and closing the connection lets the
//! kernel reset it with the upload still arriving, and a proxy in between (docker's port proxy is one)
//! may drop the 413 with the reset. So the rest of a refused body is read and discarded first, up to
//! [`DRAIN_BYTES`] more (and within `--body-read-timeout-secs`, which `body_clock` applies), and the
//! refusal closes the connection. A body declared longer than the limit plus [`DRAIN_BYTES`] is refused
//! unread: reading it would cost more than a lost reply.

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap};
use bytes::BytesMut;
use http_body::Body as _;
use http_body_util::BodyExt as _;

use super::body_clock;
use crate::error::DecisionError;

/// How much of a refused body is read and discarded past the limit before the refusal is sent.
pub const DRAIN_BYTES: usize = 64 << 20;

/// The whole body, if it has at most `limit` bytes (after any `Content-Encoding` was undone).
pub async fn read(mut body: Body, limit: usize) -> Result<Bytes, DecisionError> {
    let too_large = DecisionError::BodyTooLarge { limit };
    let declared = usize::try_from(body.size_hint().lower()).unwrap_or(usize::MAX);
    if declared > limit.saturating_add(DRAIN_BYTES) {
        return Err(too_large);
    }
    // A body declared over the limit is refused whatever it holds: its bytes are read and dropped, never kept
    // (kept, each refused body cost a buffer of the whole limit while it arrived).
    let refused = declared > limit;
    let mut kept = BytesMut::with_capacity(if refused { 0 } else { declared });
    let mut seen = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(frame) => frame,
            // Over the limit already: that is the answer, whatever stopped the rest.
            Err(_) if seen > limit => return Err(too_large),
            Err(error) => return Err(unreadable(&error)),
        };
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        seen = seen.saturating_add(data.len());
        if seen <= limit && !refused {
            kept.extend_from_slice(&data);
        } else if seen > limit.saturating_add(DRAIN_BYTES) {
            return Err(too_large);
        } else if !kept.is_empty() {
            kept = BytesMut::new();
        }
    }
    if seen > limit {
        return Err(too_large);
    }
    Ok(kept.freeze())
}

/// A body declared over `limit` by a client that waits for `100 Continue` before sending it (curl does past
/// 1 MiB): refused at once, unread. hyper sends `100 Continue` only once the body is read, so none of it is on its
/// way and no reset can overtake the 413.
pub fn refused_unsent(headers: &HeaderMap, limit: usize) -> Option<DecisionError> {
    let waits = headers
        .get(header::EXPECT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("100-continue"));
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    match declared {
        Some(length) if waits && length > limit as u64 => {
            Some(DecisionError::BodyTooLarge { limit })
        }
        _ => None,
    }
}

fn unreadable(error: &axum::Error) -> DecisionError {
    match body_clock::too_slow(error) {
        Some(limit) => DecisionError::BodyTooSlow {
            limit_secs: limit.as_secs(),
        },
        None => DecisionError::BadRequest {
            param: None,
            message: format!("cannot read the request body: {error}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use futures::StreamExt as _;

    use super::*;

    /// A body of `chunks` chunks of `size` bytes that counts the bytes taken from it.
    fn counted(chunks: usize, size: usize, taken: Arc<AtomicUsize>) -> Body {
        let stream = futures::stream::iter(0..chunks).map(move |_| {
            taken.fetch_add(size, Ordering::SeqCst);
            Ok::<_, std::io::Error>(Bytes::from(vec![b'x'; size]))
        });
        Body::from_stream(stream)
    }

    #[tokio::test]
    async fn a_body_within_the_limit_reads_whole() {
        let taken = Arc::new(AtomicUsize::new(0));
        let bytes = read(counted(4, 1000, taken.clone()), 4000).await.unwrap();
        assert_eq!(bytes.len(), 4000);
        assert_eq!(read(Body::empty(), 0).await.unwrap().len(), 0);
    }

    #[tokio::test]
    async fn a_refused_body_is_read_to_its_end_before_the_refusal() {
        // 3 MB of a body whose length is not declared (chunked), against a 1 MB limit.
        let taken = Arc::new(AtomicUsize::new(0));
        let error = read(counted(300, 10_000, taken.clone()), 1_000_000)
            .await
            .unwrap_err();
        assert!(matches!(
            error,
            DecisionError::BodyTooLarge { limit: 1_000_000 }
        ));
        assert_eq!(
            taken.load(Ordering::SeqCst),
            3_000_000,
            "the rest was left unread"
        );
        // A declared length over the limit is drained the same way.
        let error = read(Body::from(vec![b'x'; 2_000_001]), 2_000_000)
            .await
            .unwrap_err();
        assert!(matches!(error, DecisionError::BodyTooLarge { .. }));
    }

    #[tokio::test]
    async fn draining_stops_past_the_drain_bound() {
        let chunk = 1 << 20;
        let taken = Arc::new(AtomicUsize::new(0));
        let chunks = DRAIN_BYTES / chunk + 100;
        let error = read(counted(chunks, chunk, taken.clone()), chunk)
            .await
            .unwrap_err();
        assert!(matches!(error, DecisionError::BodyTooLarge { .. }));
        let taken = taken.load(Ordering::SeqCst);
        assert!(
            taken > DRAIN_BYTES && taken <= DRAIN_BYTES + 2 * chunk,
            "{taken} bytes read"
        );
    }

    #[tokio::test]
    async fn a_declared_length_past_the_drain_bound_is_refused_unread() {
        // A body that says it is 1 GB and yields nothing if polled.
        struct Declared;
        impl http_body::Body for Declared {
            type Data = Bytes;
            type Error = std::io::Error;
            fn poll_frame(
                self: std::pin::Pin<&mut Self>,
                _: &mut std::task::Context<'_>,
            ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, std::io::Error>>>
            {
                panic!("a body declared past the drain bound was read")
            }
            fn size_hint(&self) -> http_body::SizeHint {
                http_body::SizeHint::with_exact(1 << 30)
            }
        }
        let error = read(Body::new(Declared), 8 << 20).await.unwrap_err();
        assert!(matches!(error, DecisionError::BodyTooLarge { limit } if limit == 8 << 20));
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_stops_arriving_is_too_slow_unless_already_too_large() {
        let stalled = |first: Vec<u8>| {
            let stream = futures::stream::iter([Ok::<_, std::io::Error>(Bytes::from(first))])
                .chain(futures::stream::pending());
            Body::from_stream(stream)
        };
        let timed = |body: Body| async move {
            let app = axum::Router::new()
                .route(
                    "/",
                    axum::routing::post(|body: Body| async move {
                        match read(body, 100).await {
                            Ok(_) => "read".to_string(),
                            Err(e) => e.to_string(),
                        }
                    }),
                )
                .layer(axum::middleware::from_fn(|request, next| {
                    body_clock::limit_body(Duration::from_secs(2), request, next)
                }));
            let request = axum::extract::Request::post("/").body(body).unwrap();
            let response = tower::ServiceExt::oneshot(app, request).await.unwrap();
            let bytes = response.into_body().collect().await.unwrap().to_bytes();
            String::from_utf8(bytes.to_vec()).unwrap()
        };
        let slow = timed(stalled(b"{\"state\":".to_vec())).await;
        assert!(slow.contains("did not arrive within 2 s"), "{slow}");
        let large = timed(stalled(vec![b' '; 101])).await;
        assert!(
            large.contains("larger than the limit of 100 bytes"),
            "{large}"
        );
    }
}
