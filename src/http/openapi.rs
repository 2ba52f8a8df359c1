//! The parts of the OpenAPI document that are not routes: its info, tags,
//! shared schemas and security scheme ([`ApiDoc`]), and [`fit`], which sets
//! the maxima of `ttl_ms` and `wait_ms` to the server's own (`--max-ttl-ms`,
//! `--max-wait-ms`), so that a value the document allows is one the server
//! takes. The paths come from the route list, with each handler's
//! `#[utoipa::path]` ([`super::routes::document`]). `openapi/openapi.json`
//! is a copy for the default settings; `lockd openapi >
//! openapi/openapi.json` regenerates it, and a test fails when the two
//! differ.

use utoipa::openapi::RefOr;
use utoipa::openapi::schema::Schema;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, Number, OpenApi};

use super::limits::Limits;
use super::locks::model;
use super::{ops, problem};

/// The whole API but its paths, which the route list adds.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "lockd",
        description = "Distributed locks over HTTP, held in Redis. Errors are RFC 9457 problem documents (application/problem+json).",
        license(name = "MIT OR Apache-2.0"),
    ),
    components(schemas(
        model::AcquireBody,
        model::ExtendBody,
        model::ReleaseBody,
        model::Grant,
        model::Extended,
        model::Status,
        model::LockNameSchema,
        model::LockTokenSchema,
        model::OwnerLabelSchema,
        model::NamePrefixSchema,
        model::PageLimitSchema,
        model::CursorSchema,
        problem::Problem,
        ops::Health,
    )),
    modifiers(&BearerKeys),
    tags(
        (name = "locks", description = "Take, extend, inspect and release locks"),
        (name = "semaphores", description = "Take, extend, inspect and give back permits of semaphores: at most `limit` holders at once, each permit a lease"),
        (name = "runs", description = "Run a job once per key (a webhook delivery, an event, a cron slot): the first caller gets an attempt and stores the result, every later caller gets the result"),
        (name = "ops", description = "Health, readiness, metrics and this document"),
    ),
)]
pub struct ApiDoc;

/// Declares the `bearer` security scheme: an API key from the keys file,
/// sent as `Authorization: Bearer <secret>` (RFC 6750). Operations list it
/// beside "none", since a server without `--auth-keys-file` needs no key.
struct BearerKeys;

impl Modify for BearerKeys {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let scheme = HttpBuilder::new()
            .scheme(HttpAuthScheme::Bearer)
            .description(Some(
                "An API key's secret (`lockd keygen`), when the server runs with --auth-keys-file",
            ))
            .build();
        openapi
            .components
            .get_or_insert_with(Default::default)
            .add_security_scheme("bearer", SecurityScheme::Http(scheme));
    }
}

/// Fits `doc` to a server with `limits`: every `ttl_ms`, `wait_ms`,
/// `limit` and `retention_ms` of a body gets the server's longest TTL,
/// longest wait, largest semaphore limit and run retention as its `maximum`, and an example above it is
/// lowered to it.
pub fn fit(doc: &mut utoipa::openapi::OpenApi, limits: &Limits) {
    let limit = |field: &str| match field {
        "ttl_ms" => Some(limits.ttl.max_ms),
        "wait_ms" => Some(limits.wait.max_ms),
        "limit" => Some(u64::from(limits.max_semaphore_limit)),
        "retention_ms" => u64::try_from(limits.run_retention.as_millis()).ok(),
        _ => None,
    };
    if let Some(components) = doc.components.as_mut() {
        for body in [
            "AcquireBody",
            "ExtendBody",
            "TakeBody",
            "PermitExtendBody",
            "StartBody",
            "RunExtendBody",
            "CompleteBody",
        ] {
            if let Some(RefOr::T(Schema::Object(object))) = components.schemas.get_mut(body) {
                for (field, schema) in &mut object.properties {
                    if let Some(max) = limit(field) {
                        cap(schema, max);
                    }
                }
            }
        }
    }
}

/// Sets the `maximum` of an integer schema, and lowers its example to it.
fn cap(schema: &mut RefOr<Schema>, max: u64) {
    let RefOr::T(Schema::Object(object)) = schema else {
        return;
    };
    object.maximum = Some(Number::UInt(usize::try_from(max).unwrap_or(usize::MAX)));
    #[allow(deprecated)] // utoipa writes `#[schema(example = ...)]` here.
    if let Some(example) = object
        .example
        .as_mut()
        .filter(|e| e.as_u64().is_some_and(|e| e > max))
    {
        *example = max.into();
    }
}
