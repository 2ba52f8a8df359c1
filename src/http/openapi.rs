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

use utoipa::openapi::content::ContentBuilder;
use utoipa::openapi::extensions::ExtensionsBuilder;
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::path::Operation;
use utoipa::openapi::request_body::RequestBody;
use utoipa::openapi::response::ResponseBuilder;
use utoipa::openapi::schema::{
    ArrayItems, KnownFormat, ObjectBuilder, Schema, SchemaFormat, SchemaType, Type,
};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{Header, Ref, RefOr, Required};
use utoipa::{Modify, Number, OpenApi};

use axum::http::StatusCode;

use super::limits::Limits;
use super::locks::model;
use super::problem::Kind;
use super::{ops, problem, runs, semaphores};

/// The whole API but its paths, which the route list adds.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "lockd",
        description = "Distributed locks over HTTP, held in Redis. Errors are RFC 9457 problem documents (application/problem+json). Every answer carries `x-request-id`; a method a path does not serve is answered 405 `method-not-allowed` with `Allow` listing the methods it does.",
        license(name = "MIT OR Apache-2.0", identifier = "MIT OR Apache-2.0"),
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
/// `limit` and `retention_ms` of a body (and every `wait_ms` of a query,
/// a watch's) gets the server's longest TTL, longest wait, largest
/// semaphore limit and run retention as its `maximum`, and an example
/// above it is lowered to it.
pub fn fit(doc: &mut utoipa::openapi::OpenApi, limits: &Limits) {
    for item in doc.paths.paths.values_mut() {
        let parameters = item
            .get
            .iter_mut()
            .flat_map(|op| op.parameters.iter_mut().flatten());
        for parameter in parameters {
            if parameter.name == "wait_ms"
                && let Some(schema) = parameter.schema.as_mut()
            {
                cap(schema, limits.wait.max_ms);
            }
        }
    }
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

/// Declares, on every operation of `doc`, what every handler's
/// `#[utoipa::path]` would otherwise repeat:
/// - the headers lockd sets on an answer of each status: `x-request-id`
///   on all, `Retry-After` on 409, 429 and 503, `WWW-Authenticate` on 401;
/// - `security: []` on `/healthz`, `/readyz` and `/openapi.json`, and the
///   answers of the browser checks in front of every route;
/// - every problem type in `Problem.type`, and on each problem answer the
///   types it may carry (`x-problem-types`, and in its description);
/// - `format: date-time` on every `*_at` string (lockd's timestamps are
///   all RFC 3339, UTC);
/// - each watch's events as they are on the wire;
/// - each optional request body as an optional object (`required: false`)
///   where utoipa writes `oneOf [null, …]`, which generators turn into a
///   required nullable argument.
pub fn annotate(doc: &mut utoipa::openapi::OpenApi) {
    let types = problem_types();
    let headers = AnswerHeaders::new();
    let streams = event_streams(doc);
    if let Some(components) = doc.components.as_mut() {
        for schema in components.schemas.values_mut() {
            mark_timestamps(schema);
        }
        for name in &streams {
            if let Some(RefOr::T(Schema::OneOf(events))) = components.schemas.get_mut(name) {
                on_the_wire(events);
            }
        }
        if let Some(RefOr::T(Schema::Object(problem))) = components.schemas.get_mut("Problem")
            && let Some(RefOr::T(Schema::Object(uri))) = problem.properties.get_mut("type")
        {
            let mut all: Vec<&str> = types.iter().map(|t| t.uri.as_str()).collect();
            all.sort_unstable();
            all.dedup();
            uri.enum_values = Some(all.into_iter().map(Into::into).collect());
        }
    }
    for (path, item) in &mut doc.paths.paths {
        let open = OPEN_PATHS.contains(&path.as_str());
        let allow = allowed_methods(item);
        for (method, operation) in [
            ("get", &mut item.get),
            ("put", &mut item.put),
            ("post", &mut item.post),
            ("delete", &mut item.delete),
            ("patch", &mut item.patch),
        ] {
            let Some(operation) = operation else {
                continue;
            };
            if open {
                operation.security = Some(Vec::new());
            }
            browser_refusals(operation, open);
            method_refusal(operation, &allow);
            declare_headers(operation, &headers);
            name_problem_types(operation, path, method, open, &types);
            if let Some(body) = operation.request_body.as_mut() {
                unwrap_optional(body);
            }
            for parameter in operation.parameters.iter_mut().flatten() {
                if let Some(schema) = parameter.schema.as_mut() {
                    non_null(schema);
                }
            }
        }
    }
}

/// `headers` on each response of `operation`, by its status.
fn declare_headers(operation: &mut Operation, headers: &AnswerHeaders) {
    for (status, response) in &mut operation.responses.responses {
        let RefOr::T(response) = response else {
            continue;
        };
        let declared = &mut response.headers;
        declared.insert("x-request-id".into(), headers.request_id.clone());
        match status.as_str() {
            "409" | "429" | "503" => {
                declared.insert("Retry-After".into(), headers.retry_after.clone());
            }
            "401" => {
                declared.insert("WWW-Authenticate".into(), headers.challenge.clone());
            }
            _ => {}
        }
    }
}

/// The schemas (by component name) of the `text/event-stream` answers.
fn event_streams(doc: &utoipa::openapi::OpenApi) -> Vec<String> {
    let mut names = Vec::new();
    for item in doc.paths.paths.values() {
        let Some(operation) = &item.get else {
            continue;
        };
        for response in operation.responses.responses.values() {
            if let RefOr::T(response) = response
                && let Some(content) = response.content.get("text/event-stream")
                && let Some(RefOr::Ref(reference)) = &content.schema
                && let Some(name) = reference.ref_location.rsplit('/').next()
            {
                names.push(name.to_owned());
            }
        }
    }
    names
}

/// Rewrites a watch's events, which utoipa writes as objects keyed by the
/// event name (`{"acquired": LeaseEvent}`), as they are on the wire: each
/// one SSE event, `{event, id, data}`, `event` its name, `id` `FENCE-SEQ`,
/// and `data` a line of JSON whose schema is the `contentSchema`. As an
/// OpenAPI 3.1 `schema` of `text/event-stream`, Schemathesis validates each
/// event of a stream against it (OpenAPI 3.2 names it `itemSchema`).
fn on_the_wire(events: &mut utoipa::openapi::schema::OneOf) {
    for variant in &mut events.items {
        let RefOr::T(Schema::Object(object)) = variant else {
            continue;
        };
        let Some((event, data)) = object.properties.pop_first() else {
            continue;
        };
        let data = match data {
            RefOr::Ref(mut reference) => {
                reference.description = String::new();
                RefOr::Ref(reference)
            }
            other => other,
        };
        let mut payload = ObjectBuilder::new()
            .schema_type(Type::String)
            .content_media_type("application/json")
            .description(Some(format!("The JSON of the `{event}` event's data")))
            .build();
        // JSON Schema's `contentSchema`, which utoipa has no field for.
        let mut keywords = utoipa::openapi::extensions::Extensions::default();
        keywords.insert(
            "contentSchema".into(),
            serde_json::to_value(&data).unwrap_or_default(),
        );
        payload.extensions = Some(keywords);
        *object = ObjectBuilder::new()
            .schema_type(Type::Object)
            .description(object.description.take())
            .property(
                "event",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .enum_values(Some([event.clone()])),
            )
            .property(
                "id",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .pattern(Some("^[0-9]+-[0-9]+$"))
                    .description(Some(
                        "`FENCE-SEQ`: the fence the event is about (0 for a free lock's `state`) and its place in this instance's sequence",
                    )),
            )
            .property("data", payload)
            .required("event")
            .required("id")
            .required("data")
            .build();
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
        if let Some(schema) = content.schema.as_mut()
            && non_null(schema)
        {
            body.required = Some(Required::False);
        }
    }
}

/// Turns `oneOf [null, X]` (utoipa's `Option<X>`) into `X`, and says
/// whether it did: an optional parameter (already `required: false`) or
/// body is absent, never `null`.
fn non_null(schema: &mut RefOr<Schema>) -> bool {
    let RefOr::T(Schema::OneOf(one_of)) = schema else {
        return false;
    };
    let is_null = |schema: &RefOr<Schema>| {
        matches!(schema, RefOr::T(Schema::Object(object))
            if object.schema_type == SchemaType::Type(Type::Null))
    };
    if one_of.items.len() != 2 || !one_of.items.iter().any(is_null) {
        return false;
    }
    let mut items = std::mem::take(&mut one_of.items);
    items.retain(|schema| !is_null(schema));
    match items.pop() {
        Some(only) => {
            *schema = only;
            true
        }
        None => false,
    }
}

/// A problem type as the document shows it.
struct ProblemType {
    /// Its HTTP status.
    status: StatusCode,
    /// `urn:lockd:problem:<slug>`.
    uri: String,
    /// The routes that answer with it: every one (`None`), or those under
    /// this prefix (the kinds of one kind of lease).
    under: Option<&'static str>,
    /// The methods that answer with it (lowercase): all (`None`), or these.
    methods: Option<&'static [&'static str]>,
    /// Whether a documented operation answers with it: not `route-not-found`,
    /// which answers requests of no path (`method-not-allowed` is on each
    /// operation's 405, the answer of its path to another method).
    of_operations: bool,
}

/// Every problem type lockd answers with: [`Kind::COMMON`], and those of
/// each kind of lease.
fn problem_types() -> Vec<ProblemType> {
    let common = Kind::COMMON.into_iter().map(|kind| ProblemType {
        status: kind.status(),
        uri: kind.type_uri(),
        under: Kind::OF_LOCKS.contains(&kind).then_some("/locks"),
        methods: answered_by(kind.slug()),
        of_operations: !matches!(kind, Kind::RouteNotFound),
    });
    let leased = [
        ("/semaphores", &semaphores::problem::PROBLEMS),
        ("/runs", &runs::problem::PROBLEMS),
    ]
    .into_iter()
    .flat_map(|(under, problems)| {
        problems.iter().map(move |p| ProblemType {
            status: p.status,
            uri: Kind::Leased(p).type_uri(),
            under: Some(under),
            methods: answered_by(p.slug),
            of_operations: true,
        })
    });
    common.chain(leased).collect()
}

/// Adds the answers of the checks in front of every route
/// ([`super::browsers`]) that `operation` does not document yet: 421 for a
/// `Host` a loopback listener does not serve, and on an open endpoint
/// (which has no key check to document them) 400 for a missing or
/// repeated `Host` or `Origin` and 403 for a page of another origin.
fn browser_refusals(operation: &mut Operation, open: bool) {
    let mut refusals = vec![(
        "421",
        "On a loopback listener: a `Host` that is not a loopback name or address, nor an `--allowed-host` (DNS rebinding); nothing was written",
    )];
    if open {
        refusals.push(("400", "No `Host` header, or two; or two `Origin` headers"));
        refusals.push((
            "403",
            "A browser page of an origin `--cors-allow-origin` does not name",
        ));
    }
    for (status, description) in refusals {
        operation
            .responses
            .responses
            .entry(status.to_owned())
            .or_insert_with(|| {
                RefOr::T(
                    ResponseBuilder::new()
                        .description(description)
                        .content(
                            problem::PROBLEM_JSON,
                            ContentBuilder::new()
                                .schema(Some(RefOr::Ref(Ref::from_schema_name("Problem"))))
                                .build(),
                        )
                        .build(),
                )
            });
    }
}

/// The `Allow` header of a path: its methods, in the order lockd's router
/// gives them, with `HEAD` after `GET` (every `GET` route answers `HEAD`).
fn allowed_methods(item: &utoipa::openapi::PathItem) -> String {
    let mut methods = Vec::new();
    for (method, operation) in [
        ("POST", &item.post),
        ("PUT", &item.put),
        ("GET", &item.get),
        ("PATCH", &item.patch),
        ("DELETE", &item.delete),
    ] {
        if operation.is_some() {
            methods.push(method);
            if method == "GET" {
                methods.push("HEAD");
            }
        }
    }
    methods.join(",")
}

/// Adds the 405 that the path of `operation` answers to a method it does
/// not take, with its `Allow` header (`allow`, such as `GET,HEAD`).
fn method_refusal(operation: &mut Operation, allow: &str) {
    let header = HeaderBuilder::new()
        .schema(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .examples([serde_json::Value::from(allow)]),
        )
        .description(Some(format!(
            "The methods this path takes, comma-separated: `{allow}` (RFC 9110 §10.2.1)"
        )))
        .build();
    operation
        .responses
        .responses
        .entry("405".to_owned())
        .or_insert_with(|| {
            RefOr::T(
                ResponseBuilder::new()
                    .description("A method this path does not take; nothing was written")
                    .header("Allow", header)
                    .content(
                        problem::PROBLEM_JSON,
                        ContentBuilder::new()
                            .schema(Some(RefOr::Ref(Ref::from_schema_name("Problem"))))
                            .build(),
                    )
                    .build(),
            )
        });
}

/// The methods whose answers carry the problem type of `slug`, for the types
/// of one kind of lease: a refusal to grant only `POST`, a missing lease
/// only the methods that name one. `None`: every method.
fn answered_by(slug: &str) -> Option<&'static [&'static str]> {
    match slug {
        "lock-held"
        | "mode-mismatch"
        | "semaphore-full"
        | "limit-mismatch"
        | "run-in-progress"
        | "fingerprint-mismatch" => Some(&["post"]),
        "lock-not-held" => Some(&["get", "patch", "delete"]),
        "not-lock-owner" | "permit-not-held" => Some(&["patch", "delete"]),
        "semaphore-free" => Some(&["get"]),
        "not-run-owner" => Some(&["patch", "delete", "put"]),
        "run-not-found" => Some(&["get", "patch", "delete", "put"]),
        _ => None,
    }
}

/// Names, on each problem answer of `operation` (`method` on `path`, `open`
/// when it needs no key), the problem types of its status that its route
/// answers with: as the extension
/// `x-problem-types` (a list of type URIs) and in its description.
fn name_problem_types(
    operation: &mut Operation,
    path: &str,
    method: &str,
    open: bool,
    types: &[ProblemType],
) {
    let keyed = [Kind::Unauthorized, Kind::Forbidden, Kind::RateLimited].map(Kind::type_uri);
    for (status, response) in &mut operation.responses.responses {
        let RefOr::T(response) = response else {
            continue;
        };
        if !response.content.contains_key(problem::PROBLEM_JSON) {
            continue;
        }
        let carried: Vec<&str> = types
            .iter()
            .filter(|t| t.of_operations && t.status.as_str() == status)
            .filter(|t| t.under.is_none_or(|under| path.starts_with(under)))
            .filter(|t| t.methods.is_none_or(|methods| methods.contains(&method)))
            .filter(|t| !(open && keyed.contains(&t.uri)))
            .map(|t| t.uri.as_str())
            .collect();
        if carried.is_empty() {
            continue;
        }
        let listed: Vec<String> = carried.iter().map(|uri| format!("`{uri}`")).collect();
        let noun = if listed.len() == 1 { "type" } else { "types" };
        response.description = format!(
            "{}. Problem {noun}: {}",
            response.description.trim_end_matches('.'),
            listed.join(", ")
        );
        let extensions = ExtensionsBuilder::new()
            .add("x-problem-types", carried)
            .build();
        match response.extensions.as_mut() {
            Some(existing) => existing.merge(extensions),
            None => response.extensions = Some(extensions),
        }
    }
}

/// The headers [`annotate`] declares, built once for every answer.
struct AnswerHeaders {
    /// `x-request-id`, on every answer.
    request_id: Header,
    /// `Retry-After` (RFC 9110 §10.2.3), on 409, 429 and 503.
    retry_after: Header,
    /// `WWW-Authenticate`, the bearer challenge (RFC 6750 §3), on 401.
    challenge: Header,
}

impl AnswerHeaders {
    fn new() -> Self {
        let header = |schema: ObjectBuilder, description: &str| {
            HeaderBuilder::new()
                .schema(schema)
                .description(Some(description))
                .build()
        };
        let string = || ObjectBuilder::new().schema_type(Type::String);
        Self {
            request_id: header(
                string(),
                "The request's ID: the caller's own `x-request-id` when it is usable (up to 128 visible ASCII characters), else a fresh UUID. Problem documents carry it as `request_id`; quote it when reporting a problem",
            ),
            retry_after: header(
                ObjectBuilder::new()
                    .schema_type(Type::Integer)
                    .minimum(Some(0)),
                "Whole seconds after which a retry may pass (rounded up; `retry_after_ms` in the problem document is exact). Set whenever a retry can succeed: a lock, permit or run held by another, a key over its rate, a backend that is unavailable or failing over, shutdown",
            ),
            challenge: header(
                string(),
                "`Bearer realm=\"lockd\"` when no key was sent; with `error=\"invalid_request\"` for an `Authorization` header that is not one Bearer credential, `error=\"invalid_token\"` for a secret no key has (RFC 6750 §3)",
            ),
        }
    }
}
