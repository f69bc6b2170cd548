//! The router's side of the gRPC contract: connects to every rank of the model, sends each read
//! batch to all of them, and keeps rank 0's answer (ranks compute together; rank 0 holds the result).

use std::path::{Path, PathBuf};
use std::time::Duration;

use decision_proto::v1::{self as pb, decision_shard_client::DecisionShardClient};
use futures::future::join_all;
use tonic::transport::Channel;

use crate::error::DecisionError;

/// How long a health probe at startup or after a timed-out request waits for every rank's Health
/// RPC: each runs one tiny forward pass.
pub const HEALTH_TIMEOUT: Duration = Duration::from_secs(5);

/// How long `/health` waits for the ranks: it must answer within 1 s whatever they do (a monitor
/// with a short timeout otherwise sees a timeout, not a 503). The probe runs off the shard's model
/// thread, so a long batch does not delay it; a frozen or gone rank is what misses this.
pub const HEALTH_ROUTE_TIMEOUT: Duration = Duration::from_millis(800);

#[derive(Clone)]
pub struct ShardSet {
    clients: Vec<DecisionShardClient<Channel>>,
    pub info: pb::InfoResponse,
}

impl ShardSet {
    /// Connects to rank 0 at `{base}-0`, learns the world size from it, then connects to the other ranks.
    pub async fn connect(base: &Path) -> Result<Self, ShardConnectError> {
        let first = decision_proto::rank_socket(base, 0);
        let mut rank0 = connect_with_retry(&first).await?;
        let info = rank0
            .info(pb::InfoRequest {})
            .await
            .map_err(|s| ShardConnectError::Info {
                socket: first.clone(),
                message: s.message().to_owned(),
            })?
            .into_inner();
        let mut clients = vec![rank0];
        for rank in 1..info.world_size.max(1) {
            clients.push(connect_with_retry(&decision_proto::rank_socket(base, rank)).await?);
        }
        Ok(ShardSet {
            clients,
            info: info.clone(),
        })
    }

    /// No ranks at all: for tests of the HTTP surface that never read. Its Info has a batch budget,
    /// as every shard's has, so a router without `--max-batch-prefill-tokens` starts over it.
    #[cfg(test)]
    pub(crate) fn detached() -> Self {
        ShardSet {
            clients: Vec::new(),
            info: pb::InfoResponse {
                batch_token_budget: 4096,
                batch_budget_rule: "detached: no shards".into(),
                ..Default::default()
            },
        }
    }

    pub fn world_size(&self) -> usize {
        self.clients.len()
    }

    /// A real Health RPC on every rank, each within `HEALTH_TIMEOUT` (a frozen rank never answers).
    pub async fn health(&self) -> Result<(), DecisionError> {
        self.health_within(HEALTH_TIMEOUT).await
    }

    /// A real Health RPC on every rank, each within `limit`.
    pub async fn health_within(&self, limit: Duration) -> Result<(), DecisionError> {
        let calls = self.clients.iter().cloned().map(|mut c| async move {
            tokio::time::timeout(limit, c.health(pb::HealthRequest {})).await
        });
        for (rank, result) in join_all(calls).await.into_iter().enumerate() {
            let Ok(result) = result else {
                return Err(DecisionError::ShardUnavailable(format!(
                    "rank {rank} did not answer a health probe within {} s",
                    limit.as_secs_f64()
                )));
            };
            let probe = result
                .map_err(|s| {
                    DecisionError::ShardUnavailable(format!("rank {rank}: {}", s.message()))
                })?
                .into_inner()
                .probe;
            if !probe.is_finite() {
                return Err(DecisionError::ShardUnavailable(format!(
                    "rank {rank}: health probe is not finite"
                )));
            }
        }
        Ok(())
    }

    /// One batch of reads, fanned out to every rank; rank 0's results are returned.
    pub async fn read(&self, mut reads: Vec<pb::Read>) -> Result<pb::ReadResponse, DecisionError> {
        crate::read::share_prefixes(&mut reads);
        let request = pb::ReadRequest { reads };
        // The batch's trace context rides along, so the shards' spans join the request's trace.
        let span = tracing::Span::current();
        let calls = self.clients.iter().cloned().map(|mut c| {
            let mut request = tonic::Request::new(request.clone());
            crate::telemetry::inject(&span, request.metadata_mut());
            async move { c.read(request).await }
        });
        let mut first = None;
        let mut failure: Option<DecisionError> = None;
        for (rank, result) in join_all(calls).await.into_iter().enumerate() {
            match result {
                Ok(response) if rank == 0 => first = Some(response.into_inner()),
                Ok(_) => {}
                // A rank that is gone explains its peers' failed reads (a broken collective): it is
                // the error reported, whichever rank failed first.
                Err(status) => {
                    let error = status_error(rank, status);
                    let gone = matches!(error, DecisionError::ShardUnavailable(_));
                    if failure.is_none()
                        || (gone && !matches!(failure, Some(DecisionError::ShardUnavailable(_))))
                    {
                        failure = Some(error);
                    }
                }
            }
        }
        if let Some(error) = failure {
            return Err(error);
        }
        first.ok_or_else(|| DecisionError::Internal("no shard answered".into()))
    }
}

fn status_error(rank: usize, status: tonic::Status) -> DecisionError {
    match status.code() {
        tonic::Code::InvalidArgument => DecisionError::Internal(format!(
            "rank {rank} refused the read: {}",
            status.message()
        )),
        // A medium the shard's processor cannot take: the message starts with the request position
        // the router labelled it with (`images.0: …`), which the 400 names.
        tonic::Code::FailedPrecondition => crate::read::media_error(status.message()),
        tonic::Code::Unavailable | tonic::Code::Cancelled | tonic::Code::DeadlineExceeded => {
            DecisionError::ShardUnavailable(format!("rank {rank}: {}", status.message()))
        }
        // No status from the shard at all: the connection broke under the call (the process died,
        // or its socket closed). Which code tonic gives that depends on where in the call it broke
        // (`Unknown` "transport error", `Internal` "h2 protocol error", ...); for the caller it is
        // always a shard that went away.
        _ if std::error::Error::source(&status).is_some() => {
            DecisionError::ShardUnavailable(format!(
                "rank {rank}: the connection broke during the call: {}",
                transport_detail(&status)
            ))
        }
        _ => DecisionError::Shard(format!("rank {rank}: {}", status.message())),
    }
}

/// The status message with the innermost cause of a transport failure ("connection reset by peer").
fn transport_detail(status: &tonic::Status) -> String {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    let mut last = None;
    while let Some(e) = cause {
        last = Some(e.to_string());
        cause = e.source();
    }
    match last {
        Some(root) if root != status.message() => format!("{}: {root}", status.message()),
        _ => status.message().to_owned(),
    }
}

/// Why the router could not reach its shards at startup.
#[derive(Debug, thiserror::Error)]
pub enum ShardConnectError {
    #[error("cannot connect to shard at {}: {last}", socket.display())]
    Unreachable { socket: PathBuf, last: String },
    #[error("Info on {}: {message}", socket.display())]
    Info { socket: PathBuf, message: String },
}

async fn connect_with_retry(
    path: &Path,
) -> Result<DecisionShardClient<Channel>, ShardConnectError> {
    let mut last = String::new();
    for _ in 0..40 {
        match decision_proto::connect_uds(path).await {
            Ok(client) => return Ok(client),
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(ShardConnectError::Unreachable {
        socket: path.to_owned(),
        last,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_medium_the_shard_cannot_take_is_a_400_naming_its_position() {
        let error = status_error(
            0,
            tonic::Status::failed_precondition("images.1: cannot decode the image: truncated"),
        );
        match &error {
            DecisionError::BadRequest { param, message } => {
                assert_eq!(param.as_deref(), Some("images.1"));
                assert!(message.starts_with("images.1: cannot decode"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(error.status(), axum::http::StatusCode::BAD_REQUEST);
        // A connection that broke under the call (no status from the shard) is a shard gone.
        let broken = tonic::Status::from_error(Box::new(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "connection reset by peer",
        )));
        match status_error(1, broken) {
            DecisionError::ShardUnavailable(message) => {
                assert!(
                    message.starts_with("rank 1: the connection broke"),
                    "{message}"
                )
            }
            other => panic!("{other:?}"),
        }
        // A status the shard itself sent stays a failed read.
        assert!(matches!(
            status_error(0, tonic::Status::internal("boom")),
            DecisionError::Shard(_)
        ));
        // A refusal of the read itself stays the router's bug (500), never the client's.
        assert!(matches!(
            status_error(0, tonic::Status::invalid_argument("read 0: bad")),
            DecisionError::Internal(_)
        ));
    }
}
