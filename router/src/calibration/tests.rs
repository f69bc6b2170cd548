use super::*;
use crate::ir::ChoiceOption;
use crate::probability;

fn server() -> Provenance {
    Provenance {
        model: "m".into(),
        model_fingerprint: "0123456789abcdef".into(),
        prompt_format: FormatName {
            name: "vllm".into(),
            version: 101,
        },
    }
}

fn choice(names: &[&str]) -> Question {
    Question {
        id: "team".into(),
        instructions: Some("Which team?".into()),
        kind: QuestionKind::Choice {
            options: names
                .iter()
                .map(|n| ChoiceOption {
                    name: n.to_string(),
                    description: None,
                })
                .collect(),
        },
    }
}

fn fit_for(question: &Question, id: &str, biases: Option<&[f64]>) -> Fit {
    let (labels, _) = labels(&question.kind);
    Fit {
        id: id.into(),
        name: "test".into(),
        created: 1,
        model: "m".into(),
        model_fingerprint: "0123456789abcdef".into(),
        prompt_format: FormatName {
            name: "vllm".into(),
            version: 101,
        },
        debias: "off".into(),
        seed: 0,
        holdout_fraction: 0.3,
        n: 10,
        n_fit: 7,
        n_holdout: 3,
        signatures: vec![SignatureFit {
            signature: Signature::form(question).hex(),
            kind: kind_name(&question.kind).into(),
            labels: labels.clone(),
            instructions: question.instructions.clone(),
            method: if biases.is_some() {
                METHOD_BIASES
            } else {
                METHOD_TEMPERATURE
            }
            .into(),
            temperature: 2.0,
            biases: biases.map(|b| labels.iter().cloned().zip(b.iter().copied()).collect()),
            n: 10,
            n_fit: 7,
            n_holdout: 3,
            before: Score {
                ece: 0.2,
                log_loss: 1.0,
            },
            after: Score {
                ece: 0.1,
                log_loss: 0.9,
            },
            reason: None,
        }],
    }
}

fn answer(p: Vec<f64>) -> Answer {
    probability::answer(p.iter().map(|x| x.ln()).collect(), 0.9, true, 1.0)
}

/// A fit applies by option name: the same question sent in another order gets the same calibrated
/// probability for each option, and the one the fit computes.
#[test]
fn a_fit_applies_by_label_name_whatever_the_order_sent() {
    let sent = choice(&["sales", "billing", "tech"]);
    let fit = Arc::new(fit_for(&sent, "cal-a", Some(&[0.5, -0.25, -0.25])));
    let resolved = Resolved::One(fit.clone());
    let mut answers = vec![answer(vec![0.2, 0.5, 0.3])];
    let read = answers[0].probabilities.clone();
    let reports = resolved.apply(std::slice::from_ref(&sent), &mut answers);
    assert_eq!(
        reports,
        vec![CalibrationReport::Applied {
            id: "cal-a".into(),
            signature: Signature::form(&sent).hex()
        }]
    );
    // By hand, in the fit's (sorted) order billing, sales, tech: softmax(ln p / 2 + b).
    let want = probability::softmax(
        &[
            read[1].ln() / 2.0 + 0.5,
            read[0].ln() / 2.0 - 0.25,
            read[2].ln() / 2.0 - 0.25,
        ],
        1.0,
    );
    let got = &answers[0].probabilities;
    for (g, w) in [got[1], got[0], got[2]].iter().zip(&want) {
        assert!((g - w).abs() < 1e-15, "{got:?} vs {want:?}");
    }
    let reordered = choice(&["tech", "sales", "billing"]);
    // The same read, listed tech, sales, billing.
    let mut other = vec![answer(vec![0.3, 0.2, 0.5])];
    other[0].probabilities = vec![read[2], read[0], read[1]];
    resolved.apply(std::slice::from_ref(&reordered), &mut other);
    assert_eq!(other[0].probabilities, vec![got[2], got[0], got[1]]);
}

#[test]
fn an_answer_no_fit_matches_says_why_and_is_left_alone() {
    let fitted = choice(&["a", "b"]);
    let other = choice(&["a", "b", "c"]);
    let fit = Arc::new(fit_for(&fitted, "cal-a", None));
    let mut answers = vec![answer(vec![0.2, 0.5, 0.3])];
    let before = answers[0].clone();
    let reports = Resolved::One(fit.clone()).apply(std::slice::from_ref(&other), &mut answers);
    let CalibrationReport::None { reason } = &reports[0] else {
        panic!("{reports:?}")
    };
    assert!(
        reason.contains("cal-a") && reason.contains(&Signature::form(&other).hex()),
        "{reason}"
    );
    assert_eq!(answers[0], before);
    let reports = Resolved::Auto(vec![fit]).apply(std::slice::from_ref(&other), &mut answers);
    assert!(
        matches!(&reports[0], CalibrationReport::None { reason } if reason.contains("no calibration of this model"))
    );
}

#[test]
fn auto_takes_the_newest_fit_of_this_model_holding_the_signature() {
    let q = choice(&["a", "b"]);
    let book = Book::open(None, Some(server())).unwrap();
    let mut old = fit_for(&q, "cal-old", None);
    old.created = 1;
    let mut new = fit_for(&q, "cal-new", None);
    new.created = 2;
    let mut foreign = fit_for(&q, "cal-foreign", None);
    foreign.created = 3;
    foreign.model_fingerprint = "ffffffffffffffff".into();
    for f in [&old, &new, &foreign] {
        assert!(book.insert(f).unwrap().1);
    }
    let Resolved::Auto(fits) = book.resolve(&CalibrationChoice::Auto).unwrap() else {
        panic!()
    };
    let ids: Vec<&str> = fits.iter().map(|f| f.id.as_str()).collect();
    assert_eq!(ids, ["cal-new", "cal-old"]);
    let mut answers = vec![answer(vec![0.4, 0.6])];
    let reports = Resolved::Auto(fits).apply(std::slice::from_ref(&q), &mut answers);
    assert!(matches!(&reports[0], CalibrationReport::Applied { id, .. } if id == "cal-new"));
}

/// Fits stored within one second (`created` has whole seconds): `auto` takes the one stored later,
/// whatever its id, and so does the same server after a restart. It took the larger id before, which
/// gave an integration test a random fit.
#[test]
fn of_fits_stored_in_one_second_auto_takes_the_later_one_also_after_a_restart() {
    let dir = std::env::temp_dir().join(format!("calib-order-{}", uuid::Uuid::new_v4()));
    let q = choice(&["a", "b"]);
    let newest = |book: &Book| {
        let Resolved::Auto(fits) = book.resolve(&CalibrationChoice::Auto).unwrap() else {
            panic!()
        };
        fits.iter().map(|f| f.id.clone()).collect::<Vec<_>>()
    };
    {
        let book = Book::open(Some(&dir), Some(server())).unwrap();
        for id in ["cal-z", "cal-a", "cal-m"] {
            let mut fit = fit_for(&q, id, None);
            fit.created = 7;
            book.insert(&fit).unwrap();
        }
        assert_eq!(newest(&book), ["cal-m", "cal-a", "cal-z"]);
        // A place freed by a delete is not taken back: the next fit is still the newest.
        assert!(book.delete("cal-m").unwrap());
        let mut fit = fit_for(&q, "cal-b", None);
        fit.created = 7;
        book.insert(&fit).unwrap();
        assert_eq!(newest(&book), ["cal-b", "cal-a", "cal-z"]);
    }
    let book = Book::open(Some(&dir), Some(server())).unwrap();
    assert_eq!(newest(&book), ["cal-b", "cal-a", "cal-z"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The test: a fit for another model (or wording) is refused, naming `x_calibration`.
#[test]
fn a_fit_for_another_model_or_wording_is_refused_naming_the_field() {
    let q = choice(&["a", "b"]);
    let book = Book::open(None, Some(server())).unwrap();
    let mut other_model = fit_for(&q, "cal-model", None);
    other_model.model_fingerprint = "ffffffffffffffff".into();
    let mut other_format = fit_for(&q, "cal-format", None);
    other_format.prompt_format.version = 1;
    book.insert(&other_model).unwrap();
    book.insert(&other_format).unwrap();
    book.insert(&fit_for(&q, "cal-ok", None)).unwrap();
    for id in ["cal-model", "cal-format", "cal-none"] {
        let error = book.resolve(&CalibrationChoice::Id(id.into())).unwrap_err();
        let DecisionError::BadRequest { param, message } = &error else {
            panic!("{error:?}")
        };
        assert_eq!(param.as_deref(), Some(FIELD));
        assert!(
            message.starts_with("x_calibration: ") && message.contains(id),
            "{message}"
        );
    }
    assert!(book
        .resolve(&CalibrationChoice::Id("cal-ok".into()))
        .is_ok());
}

/// The test: persistence across a restart (the database reopened from its folder).
#[test]
fn fits_survive_a_restart_bit_for_bit() {
    let dir = std::env::temp_dir().join(format!("calib-book-{}", uuid::Uuid::new_v4()));
    let q = choice(&["a", "b", "c"]);
    let mut fit = fit_for(&q, "cal-kept", Some(&[exact(0.1), exact(-0.3), exact(0.2)]));
    fit.signatures[0].temperature = exact(1.0 / 3.0);
    let deleted = fit_for(&q, "cal-deleted", None);
    {
        let book = Book::open(Some(&dir), Some(server())).unwrap();
        book.insert(&fit).unwrap();
        book.insert(&deleted).unwrap();
        assert!(book.delete("cal-deleted").unwrap());
        assert!(!book.delete("cal-deleted").unwrap());
    }
    let book = Book::open(Some(&dir), Some(server())).unwrap();
    let ids: Vec<String> = book.list().iter().map(|f| f.id.clone()).collect();
    assert_eq!(ids, ["cal-kept"]);
    assert_eq!(*book.get("cal-kept").unwrap(), fit);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_id_held_is_answered_again_for_the_same_fit_and_refused_for_another() {
    let q = choice(&["a", "b"]);
    let book = Book::open(None, Some(server())).unwrap();
    let fit = fit_for(&q, "cal-x", None);
    assert!(book.insert(&fit).unwrap().1);
    assert!(!book.insert(&fit).unwrap().1);
    let mut other = fit.clone();
    other.name = "another".into();
    assert!(matches!(
        book.insert(&other),
        Err(DecisionError::Conflict(_))
    ));
}

/// What a fit keeps parses back from its JSON text to the same bits, so an imported copy answers
/// exactly what the original does.
#[test]
fn kept_numbers_round_trip_through_json_exactly() {
    let mut rng = fit::Rng::new(5);
    for _ in 0..10_000 {
        let x = exact((rng.next_f64() - 0.5) * 200.0);
        let text = serde_json::to_string(&x).unwrap();
        let back: f64 = serde_json::from_str(&text).unwrap();
        assert_eq!(back.to_bits(), x.to_bits(), "{text}");
        let t = exact(fit::MIN_TEMPERATURE + rng.next_f64() * 10.0);
        let back: f64 = serde_json::from_str(&serde_json::to_string(&t).unwrap()).unwrap();
        assert_eq!(back.to_bits(), t.to_bits());
    }
}

#[test]
fn problems_of_a_document_name_their_fields() {
    let q = choice(&["a", "b"]);
    let mut fit = fit_for(&q, "cal-x", Some(&[0.1, -0.1]));
    assert_eq!(fit.problems(), vec![]);
    fit.signatures[0].temperature = 0.0;
    fit.signatures[0].method = METHOD_TEMPERATURE.into();
    fit.signatures[0].signature = "XYZ".into();
    let fields: Vec<String> = fit.problems().into_iter().map(|(f, _)| f).collect();
    assert_eq!(
        fields,
        [
            "calibration.signatures.0.signature",
            "calibration.signatures.0.temperature",
            "calibration.signatures.0.biases"
        ]
    );
}

#[test]
fn a_questions_labels_in_fit_order() {
    let (names, order) = labels(&choice(&["c", "a", "b"]).kind);
    assert_eq!(names, ["a", "b", "c"]);
    assert_eq!(order, [1, 2, 0]);
    let yes_no = QuestionKind::YesNo {
        yes: None,
        no: None,
        no_first: true,
    };
    assert_eq!(
        labels(&yes_no),
        (vec!["true".into(), "false".into()], vec![0, 1])
    );
}

#[test]
fn a_stored_row_this_build_cannot_read_is_skipped_not_fatal() {
    let dir = std::env::temp_dir().join(format!("calib-bad-{}", uuid::Uuid::new_v4()));
    let q = choice(&["a", "b"]);
    {
        let book = Book::open(Some(&dir), Some(server())).unwrap();
        book.insert(&fit_for(&q, "cal-good", None)).unwrap();
        store::Store::open(Some(&dir))
            .unwrap()
            .insert(
                "cal-bad",
                9,
                "{\"id\": \"cal-bad\", \"from\": \"the future\"}",
            )
            .unwrap();
    }
    let book = Book::open(Some(&dir), Some(server())).unwrap();
    let ids: Vec<String> = book.list().iter().map(|f| f.id.clone()).collect();
    assert_eq!(ids, ["cal-good"]);
    assert!(book
        .resolve(&CalibrationChoice::Id("cal-bad".into()))
        .is_err());
    // It can still be deleted.
    assert!(book.delete("cal-bad").unwrap());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_signature_whose_fit_did_not_pay_held_out_is_left_uncalibrated_and_says_so() {
    let question = choice(&["a", "b", "c"]);
    let mut fit = fit_for(&question, "cal-none", None);
    let kept = &mut fit.signatures[0];
    kept.method = METHOD_NONE.into();
    kept.temperature = 1.0;
    kept.after = kept.before;
    kept.reason = Some("method 'temperature' (temperature 0.5) scored held-out log-loss 1.2 against 1.0 with 'none', so it is not applied".into());
    assert!(fit.problems().is_empty(), "{:?}", fit.problems());
    let p = vec![0.5, 0.3, 0.2];
    let mut answers = vec![answer(p.clone())];
    let reports =
        Resolved::One(Arc::new(fit.clone())).apply(std::slice::from_ref(&question), &mut answers);
    match &reports[0] {
        CalibrationReport::None { reason } => {
            assert!(
                reason.contains("cal-none") && reason.contains("uncalibrated"),
                "{reason}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(answers[0].probabilities, answer(p).probabilities);
    // 'none' takes temperature 1 and no biases; anything else is refused naming the field.
    fit.signatures[0].temperature = 2.0;
    let problems = fit.problems();
    assert!(
        problems
            .iter()
            .any(|(loc, _)| format!("{loc:?}").contains("biases")),
        "{problems:?}"
    );
}
