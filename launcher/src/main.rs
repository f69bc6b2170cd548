//! `decision-launcher`: one command that serves a model. It resolves the model, starts the shard(s)
//! and the router, supervises them, and shuts everything down cleanly (see `--help`).

mod allocator;
mod binaries;
mod child;
mod config;
mod download;
mod export;
mod launch;
mod logging;
mod mkl_dispatch;
mod model;
mod reference;
mod router;
mod shard;

use std::process::ExitCode;

use clap::CommandFactory as _;

use crate::config::Config;

// A current-thread runtime on purpose: PR_SET_PDEATHSIG (see child.rs) is tied to the thread that
// spawned a child, so every spawn must happen on the main thread, which lives as long as we do.
// The launcher only moves log lines and polls health; one thread is plenty.
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let config = Config::parse_cli();
    if config.print_flags {
        println!("{}", Config::flags_json());
        return ExitCode::SUCCESS;
    }
    if config.print_configuration_reference {
        print!("{}", reference::configuration_markdown());
        return ExitCode::SUCCESS;
    }
    if let Err(err) = config.validate() {
        Config::command()
            .error(clap::error::ErrorKind::ValueValidation, err)
            .exit();
    }
    logging::init(
        config.router.json_output,
        config.shard_log_level.tracing_level(),
    );
    match launch::run(&config).await {
        Ok(_) => ExitCode::SUCCESS,
        // Already logged by `run`, before the shutdown it caused.
        Err(_) => ExitCode::FAILURE,
    }
}
