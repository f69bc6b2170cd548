//! The router's command line: every setting it needs as an explicit flag, except the API key,
//! which travels in its environment so it never shows in `ps`.

use std::ffi::OsString;
use std::path::Path;

use crate::child::ChildSpec;
use crate::config::Config;

/// The environment variable the router reads its API key from.
pub const API_KEY_ENV: &str = "API_KEY";

/// `decision-router --model-dir … --shard-uds-path … --served-model-name … [every router flag the
/// operator gave the launcher, as given]`. A flag not given keeps the router's default, which is
/// the launcher's too: both read the one declaration (`RouterFlags`).
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
        "--served-model-name".into(),
        served_model_name.into(),
    ];
    args.extend(config.router_argv.iter().cloned());
    // Set it when given, and otherwise make sure no stray API_KEY from our own environment leaks in.
    let (env, env_remove) = match &config.router.api_key {
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
    use clap::Parser as _;
    use decision_router::config::Config as RouterConfig;

    fn after(spec: &ChildSpec, flag: &str) -> OsString {
        let at = spec.args.iter().position(|a| a == flag).expect(flag);
        spec.args[at + 1].clone()
    }

    /// The router parses its argv into the very flags the launcher parsed, but for the two the
    /// launcher sets itself (the served name, resolved; the key, in the environment).
    fn router_sees(spec: &ChildSpec) -> RouterConfig {
        RouterConfig::try_parse_from(
            std::iter::once(OsString::from("decision-router")).chain(spec.args.clone()),
        )
        .expect("the router takes every flag the launcher hands on")
    }

    #[test]
    fn router_argv_has_every_given_setting_and_no_secret() {
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
            spec.args[..6],
            [
                "--model-dir",
                "/models/m",
                "--shard-uds-path",
                "/run/ds",
                "--served-model-name",
                "my-model",
            ]
            .map(OsString::from)
        );
        assert_eq!(after(&spec, "--media-allow-hosts"), "cdn.example,*");
        assert_eq!(after(&spec, "--max-video-seconds"), "30.5");
        assert!(spec.args.contains(&OsString::from("--json-output")));
        assert!(spec
            .args
            .iter()
            .all(|arg| !arg.to_string_lossy().contains("s3cret")));
        assert_eq!(
            spec.env,
            vec![(API_KEY_ENV.to_owned(), "s3cret".to_owned())]
        );
        let router = router_sees(&spec);
        let mut expected = config.router.clone();
        expected.served_model_name = Some("my-model".into());
        expected.api_key = None;
        assert_eq!(router.flags, expected);
        assert_eq!(router.shard_uds_path, Path::new("/run/ds"));
    }

    #[test]
    fn router_flags_the_launcher_once_refused_reach_the_router() {
        let config = config(&[
            "--max-body-bytes",
            "4096",
            "--otlp-service-name",
            "edge-router",
        ]);
        let spec = spec(Path::new("decision-router"), &config, Path::new("/m"), "m");
        assert_eq!(after(&spec, "--max-body-bytes"), "4096");
        assert_eq!(after(&spec, "--otlp-service-name"), "edge-router");
        let router = router_sees(&spec);
        assert_eq!(router.flags.max_body_bytes, 4096);
        assert_eq!(router.flags.otlp_service_name, "edge-router");
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
            "--otlp-endpoint",
            "http://collector:4317",
        ]);
        let spec = spec(Path::new("decision-router"), &config, Path::new("/m"), "m");
        assert_eq!(after(&spec, "--api-key-file"), "/run/secrets/key");
        assert_eq!(after(&spec, "--request-timeout-secs"), "30");
        assert_eq!(after(&spec, "--header-read-timeout-secs"), "4");
        assert_eq!(after(&spec, "--body-read-timeout-secs"), "7");
        assert_eq!(after(&spec, "--keep-alive-timeout-secs"), "2");
        assert_eq!(after(&spec, "--max-connections"), "64");
        assert_eq!(after(&spec, "--otlp-endpoint"), "http://collector:4317");
        assert!(spec.args.contains(&OsString::from("--public-ops")));
        assert!(spec.env.is_empty(), "no key in the environment either");
    }

    #[test]
    fn without_a_key_the_router_inherits_none_and_defaults_stay_the_routers() {
        let config = config(&[]);
        let spec = spec(Path::new("decision-router"), &config, Path::new("/m"), "m");
        assert!(spec.env.is_empty());
        assert_eq!(spec.env_remove, vec![API_KEY_ENV.to_owned()]);
        // Nothing given, nothing handed on: the router applies the one declared default.
        assert_eq!(spec.args.len(), 6, "{:?}", spec.args);
        let router = router_sees(&spec);
        let mut expected = config.router.clone();
        expected.served_model_name = Some("m".into());
        assert_eq!(router.flags, expected);
    }
}
