//! Generated client for the router <-> shard contract (`decision.proto`), plus the unix-socket
//! connector both the router and the launcher use to reach a shard.

pub mod v1 {
    tonic::include_proto!("decision.v1");
}

use std::path::{Path, PathBuf};

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};
use v1::decision_shard_client::DecisionShardClient;

/// The socket path of one rank: `{base}-{rank}`, the convention the launcher and shards share.
pub fn rank_socket(base: &Path, rank: u32) -> PathBuf {
    let mut name = base.as_os_str().to_owned();
    name.push(format!("-{rank}"));
    PathBuf::from(name)
}

/// Opens a gRPC channel over a unix domain socket.
pub async fn connect_uds(
    path: &Path,
) -> Result<DecisionShardClient<Channel>, tonic::transport::Error> {
    let path = path.to_owned();
    // The URI is ignored by the connector; tonic requires a syntactically valid one.
    let channel = Endpoint::try_from("http://[::]:50051")?
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }))
        .await?;
    Ok(DecisionShardClient::new(channel)
        .max_decoding_message_size(256 << 20)
        .max_encoding_message_size(256 << 20))
}
