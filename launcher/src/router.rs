//! The router's command line: every setting it needs as an explicit flag, except the API key,
//! which travels in its environment so it never shows in `ps`.

use std::ffi::OsString;
use std::path::Path;

use crate::child::ChildSpec;
use crate::config::{flag_value, Config};

/// The environment variable the router reads its API key from.
pub const API_KEY_ENV: &str = "API_KEY";

/// `decision-router --model-dir … --shard-uds-path … --hostname … --port … --served-model-name …
/// --compat … [--max-batch-prefill-tokens …] --max-batch-wait-ms … [--max-input-tokens …]
/// --max-queued-reads … [--media-allow-hosts …] --media-fetch-timeout-secs … --max-media-items …
/// --max-image-items … --max-audio-items … --max-video-items … --max-media-bytes …
/// --max-image-pixels … --max-video-seconds … --max-video-frames … --max-audio-seconds …
/// [--json-output]`.
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
    ];
    // Forwarded only when set: unset, the router follows the shard's budget (the shards get the
    // same value: shard.rs).
    if let Some(tokens) = config.max_batch_prefill_tokens {
        args.extend([
            "--max-batch-prefill-tokens".into(),
            tokens.to_string().into(),
        ]);
    }
    args.extend([
        "--max-batch-wait-ms".into(),
        config.max_batch_wait_ms.to_string().into(),
    ]);
    // Forwarded only when set: the router defines the default (router/src/limits.rs).
    if let Some(tokens) = config.max_input_tokens {
        args.extend(["--max-input-tokens".into(), tokens.to_string().into()]);
    }
    args.extend([
        "--max-queued-reads".into(),
        config.max_queued_reads.to_string().into(),
    ]);
    let hosts: Vec<&str> = config
        .media_allow_hosts
        .iter()
        .map(|h| h.trim())
        .filter(|h| !h.is_empty())
        .collect();
    if !hosts.is_empty() {
        args.push("--media-allow-hosts".into());
        args.push(hosts.join(",").into());
    }
    for (flag, value) in [
        (
            "--media-fetch-timeout-secs",
            config.media_fetch_timeout_secs.to_string(),
        ),
        ("--max-media-items", config.max_media_items.to_string()),
        ("--max-image-items", config.max_image_items.to_string()),
        ("--max-audio-items", config.max_audio_items.to_string()),
        ("--max-video-items", config.max_video_items.to_string()),
        ("--max-media-bytes", config.max_media_bytes.to_string()),
        ("--max-image-pixels", config.max_image_pixels.to_string()),
        ("--max-video-seconds", config.max_video_seconds.to_string()),
        ("--max-video-frames", config.max_video_frames.to_string()),
        ("--max-audio-seconds", config.max_audio_seconds.to_string()),
    ] {
        args.push(flag.into());
        args.push(value.into());
    }
    for (flag, value) in [
        (
            "--request-timeout-secs",
            config.request_timeout_secs.to_string(),
        ),
        (
            "--header-read-timeout-secs",
            config.header_read_timeout_secs.to_string(),
        ),
        (
            "--body-read-timeout-secs",
            config.body_read_timeout_secs.to_string(),
        ),
        (
            "--keep-alive-timeout-secs",
            config.keep_alive_timeout_secs.to_string(),
        ),
        ("--max-connections", config.max_connections.to_string()),
        // The router answers every request it accepted before this grace ends (at SIGTERM it
        // answers what is still in flight 503 at the grace less 3 s), so the SIGKILL at the grace
        // finds it gone.
        (
            "--shutdown-grace-secs",
            config.shutdown_grace_secs.to_string(),
        ),
    ] {
        args.push(flag.into());
        args.push(value.into());
    }
    if config.public_ops {
        args.push("--public-ops".into());
    }
    // A path is no secret: the router reads the key from it.
    if let Some(path) = &config.api_key_file {
        args.push("--api-key-file".into());
        args.push(path.clone().into());
    }
    if let Some(endpoint) = config.otlp_endpoint(|name| std::env::var(name).ok()) {
        args.push("--otlp-endpoint".into());
        args.push(endpoint.into());
    }
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
            "--media-allow-hosts",
            "cdn.example,*",
            "--media-fetch-timeout-secs",
            "3",
            "--max-media-items",
            "6",
            "--max-image-items",
            "5",
            "--max-audio-items",
            "2",
            "--max-video-items",
            "1",
            "--max-media-bytes",
            "1048576",
            "--max-image-pixels",
            "4000000",
            "--max-video-seconds",
            "30.5",
            "--max-video-frames",
            "64",
            "--max-audio-seconds",
            "15",
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
                "--media-allow-hosts",
                "cdn.example,*",
                "--media-fetch-timeout-secs",
                "3",
                "--max-media-items",
                "6",
                "--max-image-items",
                "5",
                "--max-audio-items",
                "2",
                "--max-video-items",
                "1",
                "--max-media-bytes",
                "1048576",
                "--max-image-pixels",
                "4000000",
                "--max-video-seconds",
                "30.5",
                "--max-video-frames",
                "64",
                "--max-audio-seconds",
                "15",
                "--request-timeout-secs",
                "120",
                "--header-read-timeout-secs",
                "10",
                "--body-read-timeout-secs",
                "60",
                "--keep-alive-timeout-secs",
                "20",
                "--max-connections",
                "1024",
                "--shutdown-grace-secs",
                "10",
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
    fn operations_flags_reach_the_router_and_a_key_file_travels_as_its_path() {
        let config = config(&[
            "--api-key-file",
            "/run/secrets/key",
            "--public-ops",
            "--request-timeout-secs",
            "30",
            "--header-read-timeout-secs",
            "4",
            "--body-read-timeout-secs",
            "7",
            "--keep-alive-timeout-secs",
            "2",
            "--max-connections",
            "64",
            "--shutdown-grace-secs",
            "30",
            "--otlp-endpoint",
            "http://collector:4317",
        ]);
        let spec = spec(Path::new("decision-router"), &config, Path::new("/m"), "m");
        let after = |flag: &str| {
            let at = spec.args.iter().position(|a| a == flag).expect(flag);
            spec.args[at + 1].clone()
        };
        assert_eq!(after("--api-key-file"), "/run/secrets/key");
        assert_eq!(after("--request-timeout-secs"), "30");
        assert_eq!(after("--header-read-timeout-secs"), "4");
        assert_eq!(after("--body-read-timeout-secs"), "7");
        assert_eq!(after("--keep-alive-timeout-secs"), "2");
        assert_eq!(after("--max-connections"), "64");
        assert_eq!(after("--shutdown-grace-secs"), "30");
        assert_eq!(after("--otlp-endpoint"), "http://collector:4317");
        assert!(spec.args.contains(&OsString::from("--public-ops")));
        assert!(spec.env.is_empty(), "no key in the environment either");
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
        // Fetching stays off: no allow-list flag at all, the limits at their defaults.
        assert!(!spec.args.contains(&OsString::from("--media-allow-hosts")));
        assert!(!spec.args.contains(&OsString::from("--public-ops")));
        // The token limit's default is the router's own; the batch budget's is the shard's.
        assert!(!spec.args.contains(&OsString::from("--max-input-tokens")));
        assert!(!spec
            .args
            .contains(&OsString::from("--max-batch-prefill-tokens")));
        let after = |flag: &str| {
            let at = spec.args.iter().position(|a| a == flag).expect(flag);
            spec.args[at + 1].clone()
        };
        assert_eq!(after("--max-media-bytes"), "20971520");
        assert_eq!(after("--max-video-seconds"), "60");
    }
}
