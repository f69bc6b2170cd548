//! `--body-read-timeout-secs`: a request's body must arrive within a time of its head. The connection
//! layer (`connections.rs`) bounds heads and idle connections; this bounds the body, which a client
//! trickling bytes could otherwise hold open for good, before any deadline of the request started.

use std::future::Future as _;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use http_body::{Frame, SizeHint};
use tokio::time::Sleep;

/// The error a body yields when its time ran out; the extractors' rejection carries it as a source.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {} s", .0.as_secs())]
pub struct BodyTooSlow(pub Duration);

/// Whether a body could not be read because its time ran out, and if so the limit.
pub fn too_slow(error: &(dyn std::error::Error + 'static)) -> Option<Duration> {
    let mut cause = Some(error);
    while let Some(error) = cause {
        if let Some(BodyTooSlow(limit)) = error.downcast_ref::<BodyTooSlow>() {
            return Some(*limit);
        }
        cause = error.source();
    }
    None
}

/// Middleware: gives the request's body `limit` to arrive in full (a zero limit leaves it alone).
pub async fn limit_body(limit: Duration, request: Request, next: Next) -> Response {
    if limit.is_zero() {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let timed = Body::new(TimedBody {
        inner: body,
        deadline: Box::pin(tokio::time::sleep(limit)),
        limit,
        expired: false,
    });
    next.run(Request::from_parts(parts, timed)).await
}

struct TimedBody {
    inner: Body,
    deadline: Pin<Box<Sleep>>,
    limit: Duration,
    expired: bool,
}

impl http_body::Body for TimedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        if this.expired {
            return Poll::Ready(None);
        }
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        if this.deadline.as_mut().poll(cx).is_ready() {
            this.expired = true;
            return Poll::Ready(Some(Err(axum::Error::new(BodyTooSlow(this.limit)))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.expired || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::post;
    use axum::Router;
    use futures::StreamExt as _;
    use http_body_util::BodyExt as _;
    use tower::ServiceExt as _;

    fn app(limit: Duration) -> Router {
        Router::new()
            .route(
                "/",
                post(|body: Bytes| async move { format!("{} bytes", body.len()) }),
            )
            .layer(axum::middleware::from_fn(move |request, next| {
                limit_body(limit, request, next)
            }))
    }

    fn stalled_after(first: &'static [u8]) -> Body {
        let stream = futures::stream::iter([Ok::<_, std::io::Error>(Bytes::from_static(first))])
            .chain(futures::stream::pending());
        Body::from_stream(stream)
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_stops_arriving_fails_at_the_limit_naming_it() {
        let started = tokio::time::Instant::now();
        let request = Request::post("/")
            .body(stalled_after(b"{\"state\":"))
            .unwrap();
        let handler = |body: Result<Bytes, axum::extract::rejection::BytesRejection>| async move {
            let rejection = body.expect_err("a stalled body cannot be read");
            format!("{:?}", too_slow(&rejection).map(|d| d.as_secs()))
        };
        let router = Router::new()
            .route("/", post(handler))
            .layer(axum::middleware::from_fn(|request, next| {
                limit_body(Duration::from_secs(3), request, next)
            }));
        let response = router.oneshot(request).await.unwrap();
        let text = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(text, "Some(3)");
        assert_eq!(started.elapsed(), Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_in_time_reads_whole_and_a_zero_limit_waits_forever() {
        let request = Request::post("/").body(Body::from("0123456789")).unwrap();
        let response = app(Duration::from_secs(1)).oneshot(request).await.unwrap();
        let text = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(text, "10 bytes");
        // Without a limit a stalled body is still being waited for after an hour.
        let request = Request::post("/").body(stalled_after(b"x")).unwrap();
        let pending = app(Duration::ZERO).oneshot(request);
        assert!(tokio::time::timeout(Duration::from_secs(3600), pending)
            .await
            .is_err());
    }
}
