//! The lock core: what a lease is, the traits of a lock server and of a
//! store, the backends, and the service that adds waiting and watches.
//! Nothing here knows about HTTP.
//!
//! # Layout
//! One room per job. The rules sit at the top, with no I/O:
//!
//! - [`types`]: [`LockName`], [`Ttl`], [`Token`] and [`Owner`], parsed at
//!   the edge so the backends only ever see valid values.
//! - [`subject`]: [`Subject`], a lock, a semaphore or a run of a name: what the
//!   queues, change listeners, watches and change channels key on.
//! - [`lease`]: the values of a grant ([`AcquireRequest`], [`Lease`],
//!   [`Acquired`], [`ExtendTtl`], [`Released`], [`LockInfo`]).
//! - [`semaphore`]: the permit rules (at most `limit` holders, each a
//!   lease).
//! - [`run`]: the rules of a run, a job that runs once per key (running
//!   under an attempt's lease, done with a result kept, or pending).
//! - [`error`]: [`LockError`], the one error type of every operation, and
//!   [`LeaseLeft`], a refused lock's remaining lease (or none: a key with
//!   no TTL).
//! - [`fence`]: the fencing-token rule, max(counter + 1, clock in µs),
//!   which every backend follows.
//! - [`history`]: a name's last leases and how each ended, folded from
//!   the change messages, and what a break ends.
//! - [`change`]: the change messages a backend publishes with each change
//!   (`acquired`, `extended`, `released`, `expired`, a probe's marker).
//! - [`listing`]: the shapes of a walk over the held locks and semaphores,
//!   and the opaque cursor between pages (the Redis key patterns a walk
//!   matches are `redis::listing`'s).
//! - [`node`]: the traits of one lock server, one per kind of lease
//!   ([`LockNode`], [`SemaphoreNode`]) over what every server does
//!   ([`Node`]); [`Backend`] is a server of every kind. Also
//!   [`ChangeListener`] and [`WaitInterest`], between a node's change
//!   stream and the service.
//! - [`store`]: what the service calls, split by kind as a node is:
//!   [`LockStore`], [`SemaphoreStore`], and [`Store`] for what they share
//!   and to reach each kind (a store without a kind refuses it once, in
//!   its accessor); [`Single`], the store of one [`Backend`].
//! - [`reaper`]: the one background compare-and-delete of a grant nobody
//!   will use (Redlock's partial grants, orphaned grants, timed-out ones),
//!   shared by the backends and the service. The one module here that
//!   runs tasks (it retries their own delete with a pause), and so the one
//!   exception to "no I/O".
//!
//! Then one folder per job, each keeping its helpers to itself:
//!
//! - [`redis`]: the Redis backend and everything that talks to Redis
//!   servers: its Lua scripts (`redis/scripts/`), connecting (`connect`,
//!   TLS included), the pool, following a Sentinel set's master
//!   (`sentinel`), the change channels (`events`, where a release reaches
//!   the service), restart detection, and the start-up topology check.
//! - [`redlock`]: Redlock over several independent masters, each a
//!   [`LockNode`]; the fan-out that tallies their answers.
//! - [`memory`]: an in-process backend with the same semantics, for
//!   `lockd serve --dev` and tests.
//! - [`service`]: [`Locks`], which adds waiting (with cancel-safe grants)
//!   to a store: the wait queues, the semaphore waits, the watches, the
//!   listing across an API key's prefixes.
//!
//! The layers, each calling only the ones below it:
//!
//! ```text
//! service::Locks (waiting, cancel-safe grants, watches)
//!   -> dyn Store: Single(backend) | Redlock(lock nodes)   never returns a token
//!        -> dyn Backend / dyn LockNode: RedisBackend | MemoryBackend
//!           (each wrapped in metrics::Instrumented by the application)
//! ```
//!
//! Dependencies point one way: the rules use nothing below them, a backend
//! uses the rules (and the reaper) but never the service or another
//! backend, and the service uses the rules and the [`Store`] trait only.
//! Outside `lock`, all of it may use `crate::backoff` (the one retry pause)
//! and nothing else of the crate.
//!
//! # Where to look
//! - **Following a failover:** in `redis/`. Under Sentinel, `redis::sentinel`
//!   follows the master the Sentinels name (`+switch-master`, `READONLY`);
//!   on a Redis Cluster, `follow_cluster` in `redis/mod.rs` reads the
//!   masters into the pool's `ClusterView`. Either way the pool
//!   (`redis::pool`) drops connections to an old master, the backend's
//!   `run_on` retries an operation that met the change on a fresh
//!   connection and refuses an answer from before it, and `redis::events`
//!   subscribes to the change channels again on the new master.
//! - **A release waking a waiter:** the release script publishes `released
//!   FENCE` on its subject's channel; `redis::events` hears it and calls
//!   [`ChangeListener::changed`]; the service's listeners pass it to the
//!   wait queues (`service::queue`), which wake the head waiter of that
//!   subject when the change frees something
//!   ([`Change::wakes_waiters`]), and to the watches.
//!
//! # Adding a kind of lease
//! Semaphores were added this way (their files: `semaphore.rs`,
//! `redis/semaphores.rs` with `semaphore.lua` and `sem_*.lua`,
//! `memory/semaphores.rs`, `service/permits.rs`, `http/semaphores/`,
//! `metrics/semaphores.rs`), and so were runs (`run.rs`, `redis/runs.rs`
//! with `run.lua` and `run_*.lua`, `memory/runs.rs`, `service/runs.rs`,
//! `http/runs/`, `metrics/runs.rs`); a new kind (a shared lock) writes:
//!
//! 1. **one rules module** here (`x.rs`: its request and answer types and
//!    their arithmetic), and beside the others in the registries of kinds:
//!    its node trait in [`node`] (`XNode: Node`, which [`Backend`] then
//!    also requires, so every backend and test double implements it), its
//!    store trait in [`store`] (`XStore`, with [`Single`] passing each call
//!    to the backend) and its accessor on [`Store`] (`fn x(&self) ->
//!    Result<&dyn XStore, LockError>`, where a store without it, such as
//!    [`redlock`], refuses it, its `watchable` deferring to that), and a
//!    [`subject::Kind`] variant, which also names it in listing cursors;
//! 2. **one script set per backend**: `redis/scripts/x*.lua` with
//!    `redis/x.rs` (its keys, and its channel through
//!    `redis::events::channel` and the subscription patterns there), and
//!    `memory/x.rs`; each backend's `mod.rs` declares it and implements
//!    `XNode` by calling into it;
//! 3. **one service module**, `service/x.rs` (declared in `service/mod.rs`,
//!    with any state of its own as a field of `Locks`), its waits through
//!    `wait_turn` and the same queues (keyed by its [`Subject`]), its
//!    watches through `service::watch` (which reads it by its kind);
//! 4. **one `http` folder** (`http/x/`, a file per action and its own
//!    problem types in `http/x/problem.rs`, as `http/semaphores/` does,
//!    joined to the one list by a `problem::Kind` variant; its routes in
//!    `http::routes`), and **one metrics module** (`metrics/x.rs`,
//!    declared in `metrics/mod.rs` with its part of the scrape), with its
//!    node calls timed in `metrics::Instrumented`.
//!
//! A kind that can be listed also adds its entry type to [`listing`], its
//! key pattern to `redis::listing` (`match_pattern`, `name_of_key`) and a
//! branch to `memory::listing`, its walk to `service::listing` and
//! [`Single`]'s `XStore`, and its route to `http::auth`'s `LISTINGS`, so
//! that a listing needs `read` and gets the key's prefixes. A kind that
//! can be watched adds its event types and stream to `http::watch`. A kind
//! with limits of its own adds them to the settings (`config`, `cli`,
//! `http::limits`, docs/configuration.md, `config/lockd.example.toml`).
//! The OpenAPI document (`http::openapi`: a tag, limits shown), the
//! request span's name field (`http::telemetry`), the clients (`client/`)
//! and `ops`'s scrape of the queues follow the API.
//!
//! Why a trait per kind rather than one trait with a default
//! "unsupported" body per method: a backend either keeps a kind or is not
//! used for it, the compiler says which, and no call can reach a method
//! the backend never wrote. Redlock keeps locks only, so it takes
//! [`LockNode`]s, and its [`Store`] refuses the other kinds in their
//! accessors, each with its reason.

pub mod change;
pub mod error;
pub mod fence;
pub mod history;
pub mod lease;
pub mod listing;
pub mod memory;
pub mod node;
pub mod reaper;
pub mod redis;
pub mod redlock;
pub mod run;
pub mod semaphore;
pub mod service;
pub mod store;
pub mod subject;
pub mod types;

pub use change::Change;
pub use error::{LaggingWrite, LeaseLeft, LockError, NO_TTL_RETRY};
pub(crate) use lease::unix_millis;
pub use lease::{AcquireRequest, Acquired, ExtendTtl, Lease, LockInfo, ProbedLock, Released};
pub use node::{Backend, ChangeListener, LockNode, Node, RunNode, SemaphoreNode, WaitInterest};
pub use service::Locks;
pub use store::{LockStore, RunStore, SemaphoreStore, Single, Store};
pub use subject::{Kind, Subject};
pub use types::{InvalidInput, LockName, Meta, Mode, Owner, Token, Ttl};
