use clap::Parser;
use decision_router::{config::Config, http};

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
    let endpoint = config.flags.otlp_endpoint();
    let otlp = endpoint
        .as_deref()
        .map(|e| (e, config.flags.otlp_service_name.as_str()));
    let _telemetry = match decision_router::telemetry::init(config.flags.json_output, otlp) {
        Ok(telemetry) => telemetry,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = config.flags.load_api_key_file() {
        tracing::error!("{e}");
        std::process::exit(2);
    }
    if let Err(e) = http::run(config).await {
        tracing::error!("{e}");
        drop(_telemetry);
        std::process::exit(1);
    }
}
