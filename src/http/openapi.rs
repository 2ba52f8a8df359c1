//! The parts of the OpenAPI document that are not routes: its info, tags,
//! shared schemas and security scheme ([`ApiDoc`]), and [`fit`], which sets
//! the maxima of `ttl_ms` and `wait_ms` to the server's own (`--max-ttl-ms`,
//! `--max-wait-ms`), so that a value the document allows is one the server
//! takes. The paths come from the route list, with each handler's
//! `#[utoipa::path]` ([`super::routes::document`]), and [`annotate`] then
//! declares the headers every answer of a status carries and marks the
//! endpoints that need no key. `openapi/openapi.json`
//! is a copy for the default settings; `lockd openapi >
//! openapi/openapi.json` regenerates it, and a test fails when the two
//! differ.

use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::path::Operation;
use utoipa::openapi::request_body::RequestBody;
use utoipa::openapi::schema::{
    ArrayItems, KnownFormat, ObjectBuilder, Schema, SchemaFormat, SchemaType, Type,
};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{Header, RefOr, Required};
use utoipa::{Modify, Number, OpenApi};

use super::limits::Limits;
use super::locks::model;
use super::{ops, problem};

/// The whole API but its paths, which the route list adds.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "lockd",
        description = "Distributed locks over HTTP, held in Redis. Errors are RFC 9457 problem documents (application/problem+json). Every answer carries `x-request-id`; a method a path does not serve is answered 405 `method-not-allowed` with `Allow` listing the methods it does.",
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
    servers(
        (url = "http://127.0.0.1:8080", description = "lockd's default `--listen` address; point clients at yours"),
    ),
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

/// The paths any caller may read, API keys or not (`security: []`).
const OPEN_PATHS: [&str; 3] = ["/healthz", "/readyz", "/openapi.json"];

/// Declares, on every operation of `doc`, the headers lockd sets on an
/// answer of each status: `x-request-id` on all of them, `Retry-After`
/// (whole seconds) on 409, 429 and 503, `WWW-Authenticate` on 401; and
/// marks [`OPEN_PATHS`] as needing no key; gives every `*_at` string
/// `format: date-time` (lockd's timestamps are all RFC 3339, UTC); and makes each optional
/// request body an optional object (`required: false`) where utoipa
/// writes `oneOf [null, …]`, which generators turn into a required
/// nullable argument. One place for what every handler's
/// `#[utoipa::path]` would otherwise repeat.
pub fn annotate(doc: &mut utoipa::openapi::OpenApi) {
    if let Some(components) = doc.components.as_mut() {
        for schema in components.schemas.values_mut() {
            mark_timestamps(schema);
        }
    }
    for (path, item) in &mut doc.paths.paths {
        let open = OPEN_PATHS.contains(&path.as_str());
        for operation in [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ]
        .into_iter()
        .flatten()
        {
            if open {
                operation.security = Some(Vec::new());
            }
            declare_headers(operation);
            if let Some(body) = operation.request_body.as_mut() {
                unwrap_optional(body);
            }
        }
    }
}

/// The headers of [`annotate`] on each response of `operation`.
fn declare_headers(operation: &mut Operation) {
    for (status, response) in &mut operation.responses.responses {
        let RefOr::T(response) = response else {
            continue;
        };
        response.headers.insert("x-request-id".into(), request_id());
        match status.as_str() {
            "409" | "429" | "503" => {
                response.headers.insert("Retry-After".into(), retry_after());
            }
            "401" => {
                response
                    .headers
                    .insert("WWW-Authenticate".into(), challenge());
            }
            _ => {}
        }
    }
}

/// Gives each `*_at` string property in `schema`, at any depth,
/// `format: date-time`.
fn mark_timestamps(schema: &mut RefOr<Schema>) {
    let RefOr::T(schema) = schema else {
        return;
    };
    match schema {
        Schema::Object(object) => {
            for (field, property) in &mut object.properties {
                if let RefOr::T(Schema::Object(inner)) = property {
                    let string = match &inner.schema_type {
                        SchemaType::Type(t) => *t == Type::String,
                        SchemaType::Array(types) => types.contains(&Type::String),
                        SchemaType::AnyValue => false,
                    };
                    if field.ends_with("_at") && string {
                        inner.format = Some(SchemaFormat::KnownFormat(KnownFormat::DateTime));
                    }
                }
                mark_timestamps(property);
            }
        }
        Schema::Array(array) => {
            if let ArrayItems::RefOrSchema(items) = &mut array.items {
                mark_timestamps(items);
            }
        }
        Schema::OneOf(one_of) => one_of.items.iter_mut().for_each(mark_timestamps),
        Schema::AllOf(all_of) => all_of.items.iter_mut().for_each(mark_timestamps),
        Schema::AnyOf(any_of) => any_of.items.iter_mut().for_each(mark_timestamps),
        _ => {}
    }
}

/// Turns a body of `oneOf [null, X]` (utoipa's `Option<X>`) into an
/// optional body of `X`: lockd takes no body, an empty one, or `X`.
fn unwrap_optional(body: &mut RequestBody) {
    for content in body.content.values_mut() {
        let Some(RefOr::T(Schema::OneOf(one_of))) = content.schema.as_mut() else {
            continue;
        };
        let is_null = |schema: &RefOr<Schema>| {
            matches!(schema, RefOr::T(Schema::Object(object))
                if object.schema_type == SchemaType::Type(Type::Null))
        };
        if one_of.items.len() == 2 && one_of.items.iter().any(is_null) {
            let mut items = std::mem::take(&mut one_of.items);
            items.retain(|schema| !is_null(schema));
            content.schema = items.pop();
            body.required = Some(Required::False);
        }
    }
}

/// `x-request-id`: the request's ID.
fn request_id() -> Header {
    HeaderBuilder::new()
        .schema(ObjectBuilder::new().schema_type(Type::String))
        .description(Some(
            "The request's ID: the caller's own `x-request-id` when it is usable (up to 128 visible ASCII characters), else a fresh UUID. Problem documents carry it as `request_id`; quote it when reporting a problem",
        ))
        .build()
}

/// `Retry-After`: when a retry may pass, in whole seconds (RFC 9110 §10.2.3).
fn retry_after() -> Header {
    HeaderBuilder::new()
        .schema(
            ObjectBuilder::new()
                .schema_type(Type::Integer)
                .minimum(Some(0)),
        )
        .description(Some(
            "Whole seconds after which a retry may pass (rounded up; `retry_after_ms` in the problem document is exact). Set whenever a retry can succeed: a lock, permit or run held by another, a key over its rate, a backend that is unavailable or failing over, shutdown",
        ))
        .build()
}

/// `WWW-Authenticate`: the bearer challenge of a 401 (RFC 6750 §3).
fn challenge() -> Header {
    HeaderBuilder::new()
        .schema(ObjectBuilder::new().schema_type(Type::String))
        .description(Some(
            "`Bearer realm=\"lockd\"` when no key was sent; with `error=\"invalid_request\"` for an `Authorization` header that is not one Bearer credential, `error=\"invalid_token\"` for a secret no key has (RFC 6750 §3)",
        ))
        .build()
}
