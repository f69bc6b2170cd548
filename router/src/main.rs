use clap::Parser;
use decision_router::{config::Config, server};

/// A request allocates and frees thousands of small objects (tokenizer encodings, JSON values, gRPC
/// messages); glibc's allocator spent about a third of the router's CPU on them.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() {
    let mut config = Config::parse();
    if config.print_openapi {
        print!("{}", decision_router::api::schema::openapi_json());
        return;
    }
    server::init_tracing(config.json_output);
    if let Err(e) = config.load_api_key_file() {
        tracing::error!("{e}");
        std::process::exit(2);
    }
    if let Err(e) = server::run(config).await {
        tracing::error!("{e}");
        std::process::exit(1);
    }
}
