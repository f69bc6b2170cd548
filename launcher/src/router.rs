//! The router's command line: every setting it needs as an explicit flag, except the API key,
//! which travels in its environment so it never shows in `ps`.

use std::ffi::OsString;
use std::path::Path;

use crate::child::ChildSpec;
use crate::config::{flag_value, Config};

/// The environment variable the router reads its API key from.
pub const API_KEY_ENV: &str = "API_KEY";

/// `decision-router --model-dir … --shard-uds-path … --hostname … --port … --served-model-name …
/// --compat … --max-batch-prefill-tokens … --max-batch-wait-ms … --max-input-tokens …
/// --max-queued-reads … [--json-output]`.
pub fn spec(
    program: &Path,
    config: &Config,
    model_dir: &Path,
    served_model_name: &str,
) -> ChildSpec {
    let mut args: Vec<OsString> = vec![
        "--model-dir".into(),
        model_dir.into(),
        // The base path: the router derives each rank's socket with the same `rank_socket` rule.
        "--shard-uds-path".into(),
        config.uds_path.clone().into(),
        "--hostname".into(),
        config.hostname.clone().into(),
        "--port".into(),
        config.port.to_string().into(),
        "--served-model-name".into(),
        served_model_name.into(),
        "--compat".into(),
        flag_value(&config.compat).into(),
        "--max-batch-prefill-tokens".into(),
        config.max_batch_prefill_tokens.to_string().into(),
        "--max-batch-wait-ms".into(),
        config.max_batch_wait_ms.to_string().into(),
        "--max-input-tokens".into(),
        config.max_input_tokens.to_string().into(),
        "--max-queued-reads".into(),
        config.max_queued_reads.to_string().into(),
    ];
    if config.json_output {
        args.push("--json-output".into());
    }
    // Set it when given, and otherwise make sure no stray API_KEY from our own environment leaks in.
    let (env, env_remove) = match &config.api_key {
        Some(key) => (
            vec![(API_KEY_ENV.to_owned(), key.expose().to_owned())],
            Vec::new(),
        ),
        None => (Vec::new(), vec![API_KEY_ENV.to_owned()]),
    };
    ChildSpec {
        name: "router".into(),
        program: program.to_owned(),
        args,
        env,
        env_remove,
        span: tracing::info_span!("router"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_for_test as config;

    #[test]
    fn router_argv_has_every_setting_and_no_secret() {
        let config = config(&[
            "--port",
            "8080",
            "--hostname",
            "127.0.0.1",
            "--uds-path",
            "/run/ds",
            "--compat",
            "vllm",
            "--api-key",
            "s3cret",
            "--max-batch-prefill-tokens",
            "4096",
            "--max-batch-wait-ms",
            "5",
            "--max-input-tokens",
            "1024",
            "--max-queued-reads",
            "64",
            "--json-output",
        ]);
        let spec = spec(
            Path::new("/bin/decision-router"),
            &config,
            Path::new("/models/m"),
            "my-model",
        );
        assert_eq!(
            spec.args,
            [
                "--model-dir",
                "/models/m",
                "--shard-uds-path",
                "/run/ds",
                "--hostname",
                "127.0.0.1",
                "--port",
                "8080",
                "--served-model-name",
                "my-model",
                "--compat",
                "vllm",
                "--max-batch-prefill-tokens",
                "4096",
                "--max-batch-wait-ms",
                "5",
                "--max-input-tokens",
                "1024",
                "--max-queued-reads",
                "64",
                "--json-output",
            ]
            .map(OsString::from)
        );
        assert!(spec
            .args
            .iter()
            .all(|arg| !arg.to_string_lossy().contains("s3cret")));
        assert_eq!(
            spec.env,
            vec![(API_KEY_ENV.to_owned(), "s3cret".to_owned())]
        );
    }

    #[test]
    fn without_a_key_the_router_inherits_none() {
        let spec = spec(
            Path::new("decision-router"),
            &config(&[]),
            Path::new("/m"),
            "m",
        );
        assert!(spec.env.is_empty());
        assert_eq!(spec.env_remove, vec![API_KEY_ENV.to_owned()]);
        assert!(!spec.args.contains(&OsString::from("--json-output")));
    }
}
