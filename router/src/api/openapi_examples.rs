//! Examples for the OpenAPI document: a request and the answers of every route, in every shape, as the
//! suite's model gave them (`openapi_examples.json`), and the Bearer scheme that `--api-key` asks for.
//! Kept as data beside the schemas so that a changed wire shape shows as a changed example.

use serde_json::Value;
use utoipa::openapi::example::ExampleBuilder;
use utoipa::openapi::path::Operation;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{ContentBuilder, OpenApi, RefOr};
use utoipa::Modify;

/// `{path: {"request": {content type: {name: example}}, "responses": {status: {content type: {name: example}}}}}`;
/// an example is `{"summary", "value"}`.
const EXAMPLES: &str = include_str!("openapi_examples.json");

/// The name of the key's scheme in the document; Swagger UI's Authorize button fills it.
pub const API_KEY_SCHEME: &str = "api_key";

/// Routes that answer without the key even when one is set.
const OPEN_ROUTES: [&str; 2] = ["/health", "/ready"];

pub struct Examples;

impl Modify for Examples {
    fn modify(&self, openapi: &mut OpenApi) {
        if let Some(components) = openapi.components.as_mut() {
            components.add_security_scheme(
                API_KEY_SCHEME,
                SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
            );
        }
        // A unit test parses the file: an unreadable one cannot reach a release.
        let examples: Value = serde_json::from_str(EXAMPLES).unwrap_or_default();
        for (path, item) in openapi.paths.paths.iter_mut() {
            for operation in [item.get.as_mut(), item.post.as_mut(), item.delete.as_mut()]
                .into_iter()
                .flatten()
            {
                if !OPEN_ROUTES.contains(&path.as_str()) {
                    operation.security = Some(vec![SecurityRequirement::new(
                        API_KEY_SCHEME,
                        Vec::<String>::new(),
                    )]);
                }
                add_examples(operation, &examples[path.as_str()]);
            }
        }
    }
}

fn add_examples(operation: &mut Operation, examples: &Value) {
    if let Some(body) = operation.request_body.as_mut() {
        for (content_type, named) in examples["request"].as_object().into_iter().flatten() {
            let content = body
                .content
                .entry(content_type.clone())
                .or_insert_with(|| ContentBuilder::new().build());
            insert_named(&mut content.examples, named);
        }
    }
    for (status, by_type) in examples["responses"].as_object().into_iter().flatten() {
        let Some(RefOr::T(response)) = operation.responses.responses.get_mut(status) else {
            continue;
        };
        for (content_type, named) in by_type.as_object().into_iter().flatten() {
            let content = response
                .content
                .entry(content_type.clone())
                .or_insert_with(|| ContentBuilder::new().build());
            insert_named(&mut content.examples, named);
        }
    }
}

fn insert_named(
    into: &mut std::collections::BTreeMap<String, RefOr<utoipa::openapi::example::Example>>,
    named: &Value,
) {
    for (name, example) in named.as_object().into_iter().flatten() {
        let built = ExampleBuilder::new()
            .summary(example["summary"].as_str().unwrap_or_default())
            .value(Some(example["value"].clone()))
            .build();
        into.insert(name.clone(), RefOr::T(built));
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    fn document() -> Value {
        serde_json::from_str(&super::super::schema::openapi_json()).unwrap()
    }

    #[test]
    fn the_examples_file_names_only_routes_statuses_and_types_the_document_has() {
        let examples: Value =
            serde_json::from_str(super::EXAMPLES).expect("openapi_examples.json parses");
        let doc = document();
        for (path, route) in examples.as_object().unwrap() {
            let item = &doc["paths"][path];
            assert!(item.is_object(), "{path} is not in the document");
            // A path's examples serve each of its methods (`/v1/calibrations`: POST and GET).
            let operations: Vec<&Value> = ["post", "get", "delete"]
                .iter()
                .map(|m| &item[*m])
                .filter(|o| o.is_object())
                .collect();
            for (status, by_type) in route["responses"].as_object().into_iter().flatten() {
                assert!(
                    operations
                        .iter()
                        .any(|o| o["responses"][status].is_object()),
                    "{path} {status}"
                );
                for named in by_type.as_object().unwrap().values() {
                    for (name, example) in named.as_object().unwrap() {
                        assert!(
                            example["summary"].is_string() && !example["value"].is_null(),
                            "{path} {status} {name}"
                        );
                    }
                }
            }
        }
    }

    /// Every route has a request example (where it takes a body) and an example of every status it lists.
    #[test]
    fn every_route_and_status_has_an_example() {
        let doc = document();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, operation) in item.as_object().unwrap() {
                if let Some(body) = operation["requestBody"]["content"].as_object() {
                    for (content_type, content) in body {
                        assert!(
                            content["examples"]
                                .as_object()
                                .is_some_and(|e| !e.is_empty()),
                            "{method} {path}: no {content_type} request example"
                        );
                    }
                }
                for (status, response) in operation["responses"].as_object().unwrap() {
                    // A 204 has no body to give an example of (`DELETE /v1/calibrations/{id}`).
                    if status == "204" {
                        assert!(response.get("content").is_none(), "{method} {path} 204");
                        continue;
                    }
                    let content = response["content"].as_object();
                    assert!(
                        content.is_some_and(|c| c
                            .values()
                            .all(|c| c["examples"].as_object().is_some_and(|e| !e.is_empty()))),
                        "{method} {path} {status}: no example"
                    );
                }
            }
        }
    }

    #[test]
    fn every_route_but_health_names_the_bearer_key() {
        let doc = document();
        assert_eq!(
            doc["components"]["securitySchemes"]["api_key"]["scheme"],
            "bearer"
        );
        for (path, item) in doc["paths"].as_object().unwrap() {
            for operation in item.as_object().unwrap().values() {
                let keyed = operation["security"][0]["api_key"].is_array();
                assert_eq!(
                    keyed,
                    !["/health", "/ready"].contains(&path.as_str()),
                    "{path}"
                );
            }
        }
    }
}
