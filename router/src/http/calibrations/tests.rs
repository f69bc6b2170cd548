use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{json, Value};

use super::super::state::AppState;
use super::super::testing::{call, get, post_json, state_reading_from_with, text, HeldShard};
use std::sync::Arc;

async fn send(state: &Arc<AppState>, request: Request<Body>) -> (StatusCode, Value) {
    let response = call(state, request).await;
    let status = response.status();
    let body = text(response).await;
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

async fn post(state: &Arc<AppState>, path: &str, body: &Value) -> (StatusCode, Value) {
    send(state, post_json(path, &body.to_string())).await
}

fn delete(path: &str) -> Request<Body> {
    Request::delete(path).body(Body::empty()).unwrap()
}

/// A server whose shard answers every batch (each label's log-probability -1).
fn server(flags: &[&str]) -> Arc<AppState> {
    let shard = HeldShard::new();
    shard.released.add_permits(1);
    state_reading_from_with(shard, flags)
}

fn question() -> Value {
    json!({"type": "choice", "instructions": "Which team?", "criteria": {"billing": null, "tech": null, "sales": null}})
}

fn set(n: usize) -> Value {
    let teams = ["billing", "tech", "sales"];
    let examples: Vec<Value> = (0..n)
        .map(|i| {
            json!({"state": format!("ticket {i}"), "questions": {"team": question()}, "answers": {"team": teams[i % 3]}})
        })
        .collect();
    json!({"name": "tickets", "examples": examples, "seed": 7})
}

fn ask(calibration: Value) -> Value {
    json!({"state": "ticket", "x_calibration": calibration, "questions": {"team": question()}})
}

/// A document as an export writes it, with biases: over reads that are all equal (the stand-in's),
/// a calibrated answer is `softmax(biases)` by name.
fn document(id: &str, state: &AppState, biases: [f64; 3]) -> Value {
    let provenance = state.decider.calibrations.server.clone().unwrap();
    let request = crate::api::systemone::parse(
        &ask(Value::Null),
        &state.decider.limits,
        state.config.flags.compat,
    )
    .unwrap();
    let signature = crate::label_prior::Signature::form(&request.questions[0]).hex();
    json!({"kind": "decision-inference.calibration", "version": 1, "calibration": {
        "id": id, "name": "hand-made", "created": 5, "model": provenance.model,
        "model_fingerprint": provenance.model_fingerprint, "prompt_format": provenance.prompt_format,
        "debias": "off", "seed": 0, "holdout_fraction": 0.3, "n": 40, "n_fit": 28, "n_holdout": 12,
        "signatures": [{"signature": signature, "kind": "choice", "labels": ["billing", "sales", "tech"],
            "method": "temperature+bias", "temperature": 1.5,
            "biases": {"billing": biases[0], "sales": biases[1], "tech": biases[2]},
            "n": 40, "n_fit": 28, "n_holdout": 12,
            "before": {"ece": 0.3, "log_loss": 1.2}, "after": {"ece": 0.1, "log_loss": 1.0}}]}})
}

/// The tests: a set is read and fitted, stored under `--data-dir`, and a restarted server
/// (a new one on the same folder) lists it and answers with it.
#[tokio::test]
async fn a_set_is_fitted_stored_and_survives_a_restart() {
    let dir = std::env::temp_dir().join(format!("calib-http-{}", uuid::Uuid::new_v4()));
    let flags = ["--data-dir", dir.to_str().unwrap()];
    let first = server(&flags);
    let (status, fit) = post(&first, "/v1/calibrations", &set(12)).await;
    assert_eq!(status, StatusCode::CREATED, "{fit}");
    let id = fit["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("cal-"), "{fit}");
    assert_eq!(fit["name"], "tickets");
    assert_eq!(
        fit["prompt_format"],
        json!({"name": "vllm", "version": 101})
    );
    assert_eq!(fit["model"], "m");
    assert_eq!(
        (
            fit["n"].clone(),
            fit["n_fit"].clone(),
            fit["n_holdout"].clone()
        ),
        (json!(12), json!(8), json!(4))
    );
    let signature = &fit["signatures"][0];
    assert_eq!(signature["kind"], "choice");
    assert_eq!(signature["labels"], json!(["billing", "sales", "tech"]));
    // 8 fitted answers of 3 labels: fewer than 30 per label, so no biases. Over equal reads no
    // temperature changes a probability, so none lowers the held-out log-loss: the fit keeps 'none'
    // and says what the temperature scored.
    assert_eq!(signature["method"], "none", "{fit}");
    assert_eq!(signature["temperature"], json!(1.0));
    assert!(signature.get("biases").is_none());
    assert_eq!(signature["before"], signature["after"]);
    let reason = signature["reason"].as_str().unwrap();
    assert!(reason.starts_with("method 'temperature'"), "{reason}");
    for side in ["before", "after"] {
        assert!(
            signature[side]["ece"].is_f64() && signature[side]["log_loss"].is_f64(),
            "{fit}"
        );
    }
    // Equal reads: every answer is a third, whatever the fit.
    assert!((signature["before"]["log_loss"].as_f64().unwrap() - 3f64.ln()).abs() < 1e-12);
    let (_, listed) = send(&first, get("/v1/calibrations")).await;
    assert_eq!(listed["calibrations"][0]["id"], json!(id));
    assert_eq!(listed["calibrations"][0]["n_signatures"], 1);
    assert!(listed["calibrations"][0].get("signatures").is_none());
    let (_, answered_first) = post(&first, "/v1/systemone", &ask(json!(id))).await;
    drop(first);

    let restarted = server(&flags);
    let (status, again) = send(&restarted, get(&format!("/v1/calibrations/{id}"))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(again, fit);
    let (status, answered) = post(&restarted, "/v1/systemone", &ask(json!(id))).await;
    assert_eq!(status, StatusCode::OK, "{answered}");
    assert_eq!(answered["answers"], answered_first["answers"]);
    let report = &answered["x_diagnostics"]["team"]["calibration"];
    assert_eq!(report["id"], Value::Null, "{answered}");
    let why = report["reason"].as_str().unwrap();
    assert!(why.contains(&id) && why.contains("uncalibrated"), "{why}");
    let (status, _) = send(&restarted, delete(&format!("/v1/calibrations/{id}"))).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, gone) = send(&restarted, get(&format!("/v1/calibrations/{id}"))).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{gone}");
    assert_eq!(
        send(&restarted, delete(&format!("/v1/calibrations/{id}")))
            .await
            .0,
        StatusCode::NOT_FOUND
    );
    drop(restarted);
    assert_eq!(server(&flags).decider.calibrations.list().len(), 0);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The test: export on one server, import on a second: identical answers there.
#[tokio::test]
async fn export_then_import_on_a_second_server_gives_identical_answers() {
    let first = server(&[]);
    let (status, imported) = post(
        &first,
        "/v1/calibrations/import",
        &document("cal-shared", &first, [0.7, -0.2, -0.5]),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{imported}");
    let (status, answered) = post(&first, "/v1/systemone", &ask(json!("cal-shared"))).await;
    assert_eq!(status, StatusCode::OK, "{answered}");
    let p = &answered["answers"]["team"]["probabilities"];
    let want = crate::probability::softmax(&[0.7, -0.2, -0.5], 1.0);
    for (name, w) in ["billing", "sales", "tech"].iter().zip(&want) {
        assert!((p[name].as_f64().unwrap() - w).abs() < 1e-12, "{answered}");
    }
    assert_eq!(answered["answers"]["team"]["choice"], "billing");
    let (status, exported) = send(&first, get("/v1/calibrations/cal-shared/export")).await;
    assert_eq!(status, StatusCode::OK);

    let second = server(&[]);
    let (status, copy) = post(&second, "/v1/calibrations/import", &exported).await;
    assert_eq!(status, StatusCode::CREATED, "{copy}");
    assert_eq!(copy, imported);
    let (_, answered_there) = post(&second, "/v1/systemone", &ask(json!("cal-shared"))).await;
    assert_eq!(answered_there["answers"], answered["answers"]);
    assert_eq!(answered_there["x_diagnostics"], answered["x_diagnostics"]);
    // Importing the same document again changes nothing; another fit under its id is a 409.
    assert_eq!(
        post(&second, "/v1/calibrations/import", &exported).await.0,
        StatusCode::OK
    );
    let mut altered = exported.clone();
    altered["calibration"]["name"] = json!("another");
    let (status, conflict) = post(&second, "/v1/calibrations/import", &altered).await;
    assert_eq!(status, StatusCode::CONFLICT, "{conflict}");
    // `auto` finds it by signature; a question it has no fit for says so, uncalibrated.
    let (_, auto) = post(&second, "/v1/systemone", &ask(json!("auto"))).await;
    assert_eq!(auto["answers"], answered["answers"]);
    let other = json!({"state": "s", "x_calibration": "auto", "questions": {"u": {"type": "noul", "instructions": "Urgent?"}}});
    let (_, unmatched) = post(&second, "/v1/systemone", &other).await;
    assert_eq!(
        unmatched["x_diagnostics"]["u"]["calibration"]["id"],
        Value::Null
    );
    assert!(unmatched["x_diagnostics"]["u"]["calibration"]["reason"]
        .as_str()
        .unwrap()
        .contains("no calibration"));
    assert_eq!(unmatched["answers"]["u"]["noul"], 0.5);
}

/// The test: a fit for another model is refused naming `x_calibration`, on every shape;
/// `auto` passes it over.
#[tokio::test]
async fn a_fit_for_another_model_is_refused_naming_x_calibration() {
    let state = server(&[]);
    let mut foreign = document("cal-foreign", &state, [0.0; 3]);
    foreign["calibration"]["model_fingerprint"] = json!("ffffffffffffffff");
    assert_eq!(
        post(&state, "/v1/calibrations/import", &foreign).await.0,
        StatusCode::CREATED
    );
    let (status, refused) = post(&state, "/v1/systemone", &ask(json!("cal-foreign"))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let message = refused["detail"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("x_calibration: ") && message.contains("ffffffffffffffff"),
        "{message}"
    );
    let openai = json!({"model": "m", "input": "s", "x_calibration": "cal-foreign", "questions": [{"type": "predicate", "instructions": "?"}]});
    let (status, refused) = post(&state, "/v1/decisions", &openai).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(refused["error"]["param"], "x_calibration", "{refused}");
    let sglang = json!({"input": "s", "x_calibration": "cal-foreign", "questions": [{"id": "q", "type": "yes_no", "question": "?"}]});
    let (status, refused) = post(&state, "/v1/decisions", &sglang).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    assert!(refused.to_string().contains("x_calibration"), "{refused}");
    let (status, auto) = post(&state, "/v1/systemone", &ask(json!("auto"))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        auto["x_diagnostics"]["team"]["calibration"]["id"],
        Value::Null
    );
}

/// Every new field is validated, each refusal naming it.
#[tokio::test]
async fn every_new_field_is_refused_naming_it() {
    let state = server(&[]);
    let with = |key: &str, value: Value| {
        let mut body = set(4);
        body[key] = value;
        body
    };
    let example = |change: &dyn Fn(&mut Value)| {
        let mut body = set(4);
        change(&mut body["examples"][1]);
        body
    };
    let cases: Vec<(Value, &str)> = vec![
        (with("name", json!("  ")), "name"),
        (with("name", json!(3)), "name"),
        (with("examples", json!([])), "examples"),
        (with("examples", json!({})), "examples"),
        (with("holdout_fraction", json!(0)), "holdout_fraction"),
        (with("holdout_fraction", json!(1.0)), "holdout_fraction"),
        (with("holdout_fraction", json!("0.3")), "holdout_fraction"),
        (with("seed", json!(-1)), "seed"),
        (with("seed", json!(1.5)), "seed"),
        (with("x_debias", json!("shuffle")), "x_debias"),
        (with("extra", json!(1)), "extra"),
        (
            example(&|e| {
                e.as_object_mut().unwrap().remove("answers");
            }),
            "examples.1.answers",
        ),
        (example(&|e| e["answers"] = json!([])), "examples.1.answers"),
        (
            example(&|e| e["answers"]["team"] = json!("legal")),
            "examples.1.answers.team",
        ),
        (
            example(&|e| e["answers"]["other"] = json!("tech")),
            "examples.1.answers.other",
        ),
        (
            example(&|e| e["x_calibration"] = json!("auto")),
            "examples.1.x_calibration",
        ),
        (
            example(&|e| e["x_debias"] = json!("rotate")),
            "examples.1.x_debias",
        ),
        (
            example(&|e| e["questions"]["team"]["type"] = json!("ranking")),
            "examples.1.questions.team.type",
        ),
        (example(&|e| *e = json!("text")), "examples.1"),
        // Three answers of a signature: one short of the minimum.
        (set(3), "examples"),
    ];
    for (body, field) in cases {
        let (status, refused) = post(&state, "/v1/calibrations", &body).await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{field}: {refused}"
        );
        let locs: Vec<String> = refused["detail"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                d["loc"].as_array().unwrap()[1..]
                    .iter()
                    .map(|l| l.to_string().trim_matches('"').to_owned())
                    .collect::<Vec<_>>()
                    .join(".")
            })
            .collect();
        assert!(locs.contains(&field.to_owned()), "{field}: {refused}");
    }
    // A noul's answer is a boolean, a score's a level index in range.
    let typed = |q: Value, a: Value| json!({"name": "n", "examples": (0..4).map(|_| json!({"state": "s", "questions": {"q": q.clone()}, "answers": {"q": a.clone()}})).collect::<Vec<_>>()});
    for (q, a) in [
        (json!({"type": "noul", "instructions": "?"}), json!("yes")),
        (
            json!({"type": "score", "criteria": ["low", "high"]}),
            json!(2),
        ),
        (
            json!({"type": "score", "criteria": ["low", "high"]}),
            json!("1"),
        ),
    ] {
        let (status, refused) = post(&state, "/v1/calibrations", &typed(q, a)).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(
            refused["detail"][0]["loc"],
            json!(["body", "examples", 0, "answers", "q"]),
            "{refused}"
        );
    }
    // x_calibration on each decision shape.
    for bad in [json!(5), json!("not an id!"), json!("")] {
        let (status, refused) = post(&state, "/v1/systemone", &ask(bad.clone())).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(
            refused["detail"][0]["loc"],
            json!(["body", "x_calibration"]),
            "{refused}"
        );
        let openai = json!({"model": "m", "input": "s", "x_calibration": bad, "questions": [{"type": "predicate", "instructions": "?"}]});
        let (status, refused) = post(&state, "/v1/decisions", &openai).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(refused["error"]["param"], "x_calibration", "{refused}");
    }
    // `/v1/score` has no questions to calibrate: the field is unknown there, and said so.
    let score = json!({"query": [1, 2], "items": [[3]], "label_token_ids": [7, 8], "x_calibration": "auto"});
    let (status, refused) = post(&state, "/v1/score", &score).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(refused.to_string().contains("x_calibration"), "{refused}");
    let (status, refused) = post(&state, "/v1/systemone", &ask(json!("cal-missing"))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(refused["detail"]["message"]
        .as_str()
        .unwrap()
        .starts_with("x_calibration: no calibration 'cal-missing'"));
    // Import: what the document says it is, and numbers a server could have written.
    let good = document("cal-doc", &state, [0.1, 0.0, -0.1]);
    let broken = |f: &dyn Fn(&mut Value)| {
        let mut d = good.clone();
        f(&mut d);
        d
    };
    for (doc, field) in [
        (broken(&|d| d["kind"] = json!("other")), vec!["kind"]),
        (broken(&|d| d["version"] = json!(2)), vec!["version"]),
        (
            broken(&|d| {
                d.as_object_mut().unwrap().remove("calibration");
            }),
            vec!["calibration"],
        ),
        (
            broken(&|d| d["calibration"]["extra"] = json!(1)),
            vec!["calibration"],
        ),
        (
            broken(&|d| d["calibration"]["id"] = json!("no spaces")),
            vec!["calibration", "id"],
        ),
        (
            broken(&|d| d["calibration"]["signatures"][0]["temperature"] = json!(0.0)),
            vec!["calibration", "signatures", "0", "temperature"],
        ),
        (
            broken(&|d| {
                d["calibration"]["signatures"][0]["biases"]
                    .as_object_mut()
                    .unwrap()
                    .remove("tech");
            }),
            vec!["calibration", "signatures", "0", "biases"],
        ),
    ] {
        let (status, refused) = post(&state, "/v1/calibrations/import", &doc).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
        let loc: Vec<String> = refused["detail"][0]["loc"].as_array().unwrap()[1..]
            .iter()
            .map(|l| l.to_string().trim_matches('"').to_owned())
            .collect();
        assert_eq!(loc, field, "{refused}");
    }
}

/// The extension is refused where the profile refuses fields it does not know (vLLM's OpenAI
/// shape, SGLang's own), as `x_debias` is.
#[tokio::test]
async fn strict_profiles_refuse_x_calibration_as_an_unknown_field() {
    let vllm = server(&["--compat", "vllm"]);
    let body = json!({"model": "m", "input": "s", "x_calibration": "auto", "questions": [{"type": "predicate", "instructions": "?"}]});
    let (status, refused) = post(&vllm, "/v1/decisions", &body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(refused["error"]["param"], "x_calibration", "{refused}");
    assert!(refused["error"]["message"]
        .as_str()
        .unwrap()
        .contains("Unrecognized request argument supplied: x_calibration"));
    let sglang = server(&["--compat", "sglang"]);
    let body = json!({"input": "s", "x_calibration": "auto", "questions": [{"id": "q", "type": "yes_no", "question": "?"}]});
    let (status, refused) = post(&sglang, "/v1/decisions", &body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    assert!(refused.to_string().contains("x_calibration"));
}

/// Calibrated answers on the `/v1/decisions` shapes carry `x_calibration` on each answer; without
/// the field, no answer mentions calibration.
#[tokio::test]
async fn decisions_shapes_report_on_each_answer_and_nothing_without_the_field() {
    let state = server(&[]);
    let openai = json!({"model": "m", "input": "s", "x_calibration": "auto", "questions": [{"type": "predicate", "instructions": "?"}]});
    let (status, answered) = post(&state, "/v1/decisions", &openai).await;
    assert_eq!(status, StatusCode::OK, "{answered}");
    assert_eq!(
        answered["answers"][0]["x_calibration"]["id"],
        Value::Null,
        "{answered}"
    );
    let sglang = json!({"input": "s", "x_calibration": "auto", "questions": [{"id": "q", "type": "yes_no", "question": "?"}]});
    let (_, answered) = post(&state, "/v1/decisions", &sglang).await;
    assert_eq!(
        answered["answers"]["q"]["x_calibration"]["id"],
        Value::Null,
        "{answered}"
    );
    // A fit calibrates reads at temperature 1: the SGLang shape's own temperature with it is refused.
    let mut warmer = sglang.clone();
    warmer["temperature"] = json!(2.0);
    let (status, refused) = post(&state, "/v1/decisions", &warmer).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        refused
            .to_string()
            .contains("x_calibration: a calibration fits reads at temperature 1"),
        "{refused}"
    );
    warmer["temperature"] = json!(1.0);
    assert_eq!(
        post(&state, "/v1/decisions", &warmer).await.0,
        StatusCode::OK
    );
    for (path, body) in super::super::testing::DECISION_BODIES {
        let response = call(&state, post_json(path, body)).await;
        assert!(!text(response).await.contains("calibration"), "{path}");
    }
}

#[tokio::test]
async fn the_routes_need_the_api_key() {
    let state = state_reading_from_with(HeldShard::new(), &["--api-key", "k"]);
    for request in [
        get("/v1/calibrations"),
        get("/v1/calibrations/cal-x"),
        get("/v1/calibrations/cal-x/export"),
        delete("/v1/calibrations/cal-x"),
        post_json("/v1/calibrations", "{}"),
        post_json("/v1/calibrations/import", "{}"),
    ] {
        assert_eq!(
            call(&state, request).await.status(),
            StatusCode::UNAUTHORIZED
        );
    }
}
