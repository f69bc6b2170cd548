//! One log stream for the whole deployment: the launcher's own events and every child's output,
//! re-emitted as tracing events (text or JSON lines) inside a span naming the child.

use serde_json::{Map, Value};
use tracing::Level;
use tracing_subscriber::EnvFilter;

/// Logs go to stdout (like TGI); `RUST_LOG` filters, `info` by default; `children`: see `filter`.
pub fn init(json: bool, children: Level) {
    let filter = filter(std::env::var("RUST_LOG").ok().as_deref(), children);
    // Colours only for a person at a terminal: `docker logs`, files and pipes get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_target(false);
    // A second init (only possible in tests) keeps the first subscriber; that is fine.
    let _ = if json {
        builder
            .json()
            .flatten_event(true)
            .with_span_list(false)
            .try_init()
    } else {
        builder.try_init()
    };
}

/// `RUST_LOG`'s directives (or `info`), plus, when the children were asked for lines more verbose
/// than info (`--shard-log-level debug`), a directive that lets those through: the shard writes
/// them, and they must not be dropped here. It names this module, where `emit_child_line` makes the
/// events, so the launcher's own debug events elsewhere stay filtered. At info or quieter the
/// filter is `RUST_LOG`'s alone.
fn filter(rust_log: Option<&str>, children: Level) -> EnvFilter {
    let base = rust_log
        .and_then(|directives| EnvFilter::try_new(directives).ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    if children <= Level::INFO {
        return base;
    }
    match format!("{}={children}", module_path!()).parse() {
        Ok(directive) => base.add_directive(directive),
        Err(_) => base,
    }
}

/// Emits one line a child wrote. A JSON log line (tracing's or Python's shape) keeps its level and
/// message; a plain line gets the level its first words name, or INFO.
pub fn emit_child_line(line: &str) {
    let (level, message) = parse_child_line(line);
    match level {
        Level::ERROR => tracing::error!("{message}"),
        Level::WARN => tracing::warn!("{message}"),
        Level::INFO => tracing::info!("{message}"),
        Level::DEBUG => tracing::debug!("{message}"),
        Level::TRACE => tracing::trace!("{message}"),
    }
}

fn parse_child_line(line: &str) -> (Level, String) {
    if let Some(parsed) = parse_json(line) {
        return parsed;
    }
    match level_in_words(line) {
        Some((level, rest)) => (level, rest.to_owned()),
        None => (Level::INFO, line.to_owned()),
    }
}

fn parse_json(line: &str) -> Option<(Level, String)> {
    if !line.trim_start().starts_with('{') {
        return None;
    }
    match serde_json::from_str::<Value>(line) {
        Ok(Value::Object(object)) => parse_json_line(object),
        _ => None,
    }
}

/// tracing-subscriber's JSON: `{"level":"INFO","fields":{"message":..,k:v},"target":..}`;
/// the shard's and other Python JSON loggers: `{"level"|"levelname":..,"message"|"msg":.., k:v}`.
/// Other fields follow the message as `k=v`, the way a text log shows them; a traceback follows on
/// its own lines. Timestamp and logger name are dropped: the launcher's event has its own.
fn parse_json_line(mut object: Map<String, Value>) -> Option<(Level, String)> {
    let level = ["level", "levelname", "severity"]
        .iter()
        .find_map(|key| object.get(*key).and_then(Value::as_str))
        .and_then(level_named)?;
    let mut fields = match object.remove("fields") {
        Some(Value::Object(fields)) => fields,
        _ => Map::new(),
    };
    let message = ["message", "msg"]
        .iter()
        .find_map(|key| fields.remove(*key).or_else(|| object.remove(*key)))?;
    // tracing's current span reads best the way its text format writes it: `request{id=..}: message`.
    let mut text = match object.remove("span") {
        Some(Value::Object(span)) => format!("{}: {}", span_text(span), plain(message)),
        _ => plain(message),
    };
    const DROPPED: [&str; 9] = [
        "timestamp",
        "time",
        "asctime",
        "level",
        "levelname",
        "severity",
        "target",
        "name",
        "spans",
    ];
    const TRACEBACKS: [&str; 3] = ["exception", "exc_info", "stack"];
    let mut tracebacks = Vec::new();
    let rest = fields
        .into_iter()
        .chain(object)
        .filter(|(key, _)| !DROPPED.contains(&key.as_str()));
    for (key, value) in rest {
        if TRACEBACKS.contains(&key.as_str()) {
            tracebacks.push(plain(value));
        } else {
            text.push_str(&format!(" {key}={}", plain(value)));
        }
    }
    for traceback in tracebacks {
        text.push('\n');
        text.push_str(traceback.trim_end());
    }
    Some((level, text))
}

fn span_text(mut span: Map<String, Value>) -> String {
    let name = span.remove("name").map(plain).unwrap_or_default();
    let fields: Vec<String> = span
        .into_iter()
        .map(|(k, v)| format!("{k}={}", plain(v)))
        .collect();
    if fields.is_empty() {
        name
    } else {
        format!("{name}{{{}}}", fields.join(" "))
    }
}

fn plain(value: Value) -> String {
    match value {
        Value::String(text) => text,
        other => other.to_string(),
    }
}

/// What an error report shows for a child's stderr line: JSON log lines as `LEVEL message`.
pub fn readable(line: &str) -> String {
    match parse_json(line) {
        Some((level, message)) => format!("{level} {message}"),
        None => line.to_owned(),
    }
}

fn level_named(word: &str) -> Option<Level> {
    Some(match word.to_ascii_uppercase().as_str() {
        "ERROR" | "CRITICAL" | "FATAL" => Level::ERROR,
        "WARN" | "WARNING" => Level::WARN,
        "INFO" => Level::INFO,
        "DEBUG" => Level::DEBUG,
        "TRACE" => Level::TRACE,
        _ => return None,
    })
}

/// `2024-01-01T00:00:00Z  WARN router: ...`, `ERROR:decision_server:...`, `[INFO] ...`,
/// `2024-01-01 00:00:00,123 - name - ERROR - ...`: the level is among the first words after the time.
/// When only a timestamp precedes it, that prefix is dropped too (the launcher's event has its own
/// time and level); otherwise the line is kept whole.
fn level_in_words(line: &str) -> Option<(Level, &str)> {
    let is_separator =
        |c: char| c.is_whitespace() || matches!(c, ':' | '[' | ']' | '|' | '-' | '(');
    let mut words = 0;
    let mut only_time_before = true;
    let mut start = None;
    for (at, c) in line
        .char_indices()
        .chain(std::iter::once((line.len(), ' ')))
    {
        match (start, is_separator(c)) {
            (None, false) => start = Some(at),
            (Some(from), true) => {
                start = None;
                let word = &line[from..at];
                if word.starts_with(|c: char| c.is_ascii_digit()) {
                    continue;
                }
                if let Some(level) = level_named(word) {
                    let rest = if only_time_before {
                        line[at..].trim_start_matches(|c: char| is_separator(c) && c != '(')
                    } else {
                        line
                    };
                    return Some((level, if rest.is_empty() { line } else { rest }));
                }
                only_time_before = false;
                words += 1;
                if words == 3 {
                    return None;
                }
            }
            _ => {}
        }
    }
    None
}

/// Children writing to a pipe may still colour their output; escape codes are noise in a re-emitted line.
pub fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        // CSI: ESC [ parameters... final byte in '@'..='~'. Other escapes: drop ESC and the next char.
        if chars.next_if_eq(&'[').is_some() {
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) {
                    break;
                }
            }
        } else {
            chars.next();
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a subscriber with `filter(rust_log, children)` prints for a shard's JSON line at `level`,
    /// re-emitted by `emit_child_line`, and for a launcher debug event outside this module.
    fn passed(rust_log: Option<&str>, children: Level, level: &str) -> (bool, bool) {
        #[derive(Clone, Default)]
        struct Sink(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Sink {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let sink = Sink::default();
        let writer = sink.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(filter(rust_log, children))
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            emit_child_line(&format!(
                r#"{{"level": "{level}", "message": "read batch", "packed_tokens": 860}}"#
            ));
            tracing::debug!(target: "decision_launcher::launch", "launcher detail");
        });
        let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        (
            text.contains("read batch"),
            text.contains("launcher detail"),
        )
    }

    #[test]
    fn shard_debug_lines_pass_the_filter_only_when_asked_for() {
        // The default: info lines pass, a shard's debug lines (were it to write them) do not.
        assert_eq!(passed(None, Level::INFO, "INFO"), (true, false));
        assert_eq!(passed(None, Level::INFO, "DEBUG"), (false, false));
        // --shard-log-level debug: the shard's debug lines pass; the launcher's own stay filtered.
        assert_eq!(passed(None, Level::DEBUG, "DEBUG"), (true, false));
        // With RUST_LOG as well, its directives keep applying to everything else.
        assert_eq!(passed(Some("warn"), Level::DEBUG, "DEBUG"), (true, false));
        assert_eq!(
            passed(
                Some("decision_launcher::launch=debug"),
                Level::DEBUG,
                "DEBUG"
            ),
            (true, true)
        );
        // Quieter shard levels leave RUST_LOG alone: `warn` still drops a child's info line.
        assert_eq!(passed(Some("warn"), Level::WARN, "INFO"), (false, false));
        assert_eq!(passed(Some("warn"), Level::WARN, "WARNING"), (true, false));
    }

    #[test]
    fn tracing_json_lines_keep_level_message_and_fields() {
        let line = r#"{"timestamp":"t","level":"WARN","fields":{"message":"queue full","queued":4096},"target":"decision_router::queue"}"#;
        assert_eq!(
            parse_child_line(line),
            (Level::WARN, "queue full queued=4096".to_owned())
        );
    }

    #[test]
    fn shard_json_lines_keep_fields_and_traceback() {
        let line = r#"{"timestamp": "t", "level": "ERROR", "target": "decision_server", "message": "serve failed", "uds_path": "/tmp/s-0", "exception": "Traceback (most recent call last):\n  File \"x.py\"\nOSError: boom\n"}"#;
        assert_eq!(
            parse_child_line(line),
            (
                Level::ERROR,
                "serve failed uds_path=/tmp/s-0\nTraceback (most recent call last):\n  File \"x.py\"\nOSError: boom"
                    .to_owned()
            )
        );
        assert_eq!(
            readable(line).lines().next(),
            Some("ERROR serve failed uds_path=/tmp/s-0")
        );
        assert_eq!(readable("plain words"), "plain words");
    }

    #[test]
    fn tracing_json_spans_become_a_prefix() {
        let line = r#"{"timestamp":"t","level":"INFO","message":"done","status":200,"target":"r","span":{"method":"GET","name":"request"},"spans":[{"method":"GET","name":"request"}]}"#;
        assert_eq!(
            parse_child_line(line),
            (
                Level::INFO,
                "request{method=GET}: done status=200".to_owned()
            )
        );
    }

    #[test]
    fn python_json_lines_keep_level_and_message() {
        let line = r#"{"levelname": "ERROR", "msg": "CUDA out of memory"}"#;
        assert_eq!(
            parse_child_line(line),
            (Level::ERROR, "CUDA out of memory".to_owned())
        );
    }

    #[test]
    fn plain_lines_get_the_level_they_name_or_info() {
        assert_eq!(
            parse_child_line("WARNING:decision_server:slow").0,
            Level::WARN
        );
        assert_eq!(
            parse_child_line("2025-01-01T00:00:00Z ERROR router: boom").0,
            Level::ERROR
        );
        assert_eq!(parse_child_line("[DEBUG] detail").0, Level::DEBUG);
        assert_eq!(
            parse_child_line("2025-01-01 00:00:00,123 - decision_server - CRITICAL - dead").0,
            Level::ERROR
        );
        assert_eq!(
            parse_child_line("Traceback (most recent call last):").0,
            Level::INFO
        );
        assert_eq!(parse_child_line("{not json").1, "{not json");
        assert_eq!(parse_child_line(r#"{"no": "level"}"#).0, Level::INFO);
    }

    #[test]
    fn ansi_colours_are_removed() {
        assert_eq!(
            strip_ansi("\u{1b}[2m2025\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m ready"),
            "2025  INFO ready"
        );
        assert_eq!(strip_ansi("plain"), "plain");
    }
}
