//! The HTTP edge: the accept loop, the routes, the one prologue every decision route runs behind, the
//! operator routes and the drain. Handlers only glue a wire shape to the shape-independent `Decider`.
//!
//! | file | what it holds |
//! |---|---|
//! | `lifecycle.rs` | `run`: listen, serve, drain on SIGTERM/SIGINT |
//! | `connections.rs` | the accept loop: connection cap, header and idle clocks, closing at the end |
//! | `routes.rs` | the route table and the layers around it |
//! | `prologue.rs` | `DecisionRoute`: auth, draining, in-flight count, body limits and JSON, once for all |
//! | `decisions.rs` | the decision routes: System One, `/v1/decisions` (OpenAI, SGLang), `/v1/score` |
//! | `calibrations.rs` | `/v1/calibrations`: fit (behind the prologue), import, list, get, export, delete |
//! | `ops.rs` | `/health` (liveness), `/info`, `/metrics`, `/v1/models`, the OpenAPI document |
//! | `readiness.rs` | `/ready`: draining, a model the routes cannot serve, the queue's high-water mark, the shards |
//! | `playground.rs` | the playground page at `/` (`playground.html`, compiled in) |
//! | `swagger.rs` | Swagger UI at `/docs`, its files compiled in (vendored) |
//! | `auth.rs` | the API key: decision routes, operator routes |
//! | `budget.rs` | a request's time budget: `--request-timeout-secs`, or less from its headers |
//! | `middleware.rs` | request ids, request metrics and `Server-Timing` |
//! | `request_body.rs`, `body_clock.rs` | a body's byte limit and time limit |
//! | `responses.rs` | answers and errors rendered per wire shape |
//! | `state.rs` | `AppState`, built once at startup, and the in-flight count |

mod auth;
pub mod body_clock;
mod budget;
mod calibrations;
pub mod connections;
mod decisions;
mod lifecycle;
mod middleware;
mod ops;
mod playground;
mod prologue;
mod readiness;
pub mod request_body;
mod responses;
mod routes;
mod state;
mod swagger;
#[cfg(test)]
mod testing;

pub use lifecycle::run;
pub use middleware::{REQUEST_ID_HEADER, X_REQUEST_ID_HEADER};
pub use routes::app;
pub use state::{build_state, AppState, InFlight, InFlightGuard};
