//! `docs/configuration.md`, generated from the flags' own definitions (clap: doc comments, env vars, defaults,
//! values), so the reference cannot disagree with the binary; a test fails when the checked-in file drifts.

use clap::CommandFactory as _;

use crate::config::Config;

const REGENERATE: &str =
    ".venv/bin/decision-launcher --print-configuration-reference > docs/configuration.md";

/// Every visible flag of `decision-launcher` (the router's flags included: the launcher flattens them) in Markdown.
pub fn configuration_markdown() -> String {
    let command = Config::command();
    let mut out = String::from(
        "# Configuration reference\n\n\
         Every flag of `decision-launcher`, generated from the flags' definitions (`launcher/src/config.rs`; the \
         router's flags, `router/src/config.rs::RouterFlags`, are launcher flags too and are handed on to the router). \
         Each flag can also be set through the environment variable shown; a flag on the command line wins. \
         Do not edit: after changing a flag run\n\n",
    );
    out.push_str(&format!("```bash\n{REGENERATE}\n```\n\n"));
    out.push_str("| flag | environment | default |\n|---|---|---|\n");
    let flags: Vec<_> = command
        .get_arguments()
        .filter(|arg| !arg.is_hide_set() && arg.get_long().is_some())
        .collect();
    for arg in &flags {
        let long = arg.get_long().unwrap_or_default();
        out.push_str(&format!(
            "| `--{long}` | {} | {} |\n",
            arg.get_env()
                .map(|env| format!("`{}`", env.to_string_lossy()))
                .unwrap_or_default(),
            defaults(arg).unwrap_or_default(),
        ));
    }
    for arg in &flags {
        let long = arg.get_long().unwrap_or_default();
        out.push_str(&format!("\n## `--{long}`\n\n"));
        let mut facts = Vec::new();
        if let Some(env) = arg.get_env() {
            facts.push(format!("env `{}`", env.to_string_lossy()));
        }
        if let Some(default) = defaults(arg) {
            facts.push(format!("default {default}"));
        }
        let values: Vec<String> = arg
            .get_possible_values()
            .iter()
            .filter(|v| !v.is_hide_set())
            .map(|v| format!("`{}`", v.get_name()))
            .collect();
        if !values.is_empty() && arg.get_action().takes_values() {
            facts.push(format!("one of {}", values.join(", ")));
        }
        if !facts.is_empty() {
            out.push_str(&format!("{}\n\n", facts.join(" · ")));
        }
        let help = arg
            .get_long_help()
            .or_else(|| arg.get_help())
            .map(|h| h.to_string())
            .unwrap_or_default();
        out.push_str(help.trim());
        out.push('\n');
    }
    out
}

fn defaults(arg: &clap::Arg) -> Option<String> {
    let values: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|v| format!("`{}`", v.to_string_lossy()))
        .collect();
    (!values.is_empty() && arg.get_action().takes_values()).then(|| values.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checked_in_reference_matches_the_flags() {
        let checked_in = include_str!("../../docs/configuration.md");
        assert!(
            checked_in == configuration_markdown(),
            "docs/configuration.md drifted from the flags: run `{REGENERATE}`"
        );
    }

    #[test]
    fn every_visible_flag_is_in_the_reference_with_its_env_var() {
        let reference = configuration_markdown();
        for flag in Config::flags_json().as_array().expect("a list") {
            let name = flag["flag"].as_str().expect("flag");
            if name == "--print-flags"
                || name == "--print-configuration-reference"
                || name == "--help"
            {
                continue;
            }
            assert!(reference.contains(&format!("## `{name}`")), "{name}");
            if let Some(env) = flag["env"].as_str() {
                assert!(reference.contains(&format!("env `{env}`")), "{name}: {env}");
            }
        }
        assert!(
            reference.contains("## `--model-id`") && reference.contains("## `--max-body-bytes`")
        );
        assert!(
            !reference.contains("## `--print-flags`"),
            "hidden flags stay out"
        );
    }
}
