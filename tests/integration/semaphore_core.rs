//! Semaphores in the lock core, on a real Redis (issue 17, in progress:
//! the HTTP API comes next, and these cases move to it).

use std::sync::Arc;
use std::time::Duration;

use lockd::lock::redis::connect::{ConnectReport, RedisTls};
use lockd::lock::redis::{Endpoint, RedisBackend, RedisConfig};
use lockd::lock::semaphore::{Limit, PermitOutcome, PermitRequest, Refusal};
use lockd::lock::{ExtendTtl, LockName, Token, Ttl};

use crate::support::RedisServer;

fn backend(redis: &RedisServer) -> RedisBackend {
    let tls = RedisTls::default();
    RedisBackend::new(&RedisConfig {
        endpoint: Endpoint::Server(redis.url()),
        tls: tls.clone(),
        report: Arc::new(ConnectReport::new(
            format!("127.0.0.1:{}", redis.port()),
            &tls,
        )),
        key_prefix: "lockd:".into(),
        timeout: Duration::from_secs(2),
        pool_size: 4,
        fence_retention: Duration::from_secs(3600),
        restart_delay: None,
        min_replicas_acked: 0,
        replica_ack_timeout: Duration::from_secs(1),
        standalone: true,
    })
    .expect("backend")
}

fn request(token: &Token, limit: u64, ttl_ms: u64) -> PermitRequest {
    PermitRequest {
        name: LockName::parse("pool").expect("name"),
        token: token.clone(),
        limit: Limit::new(limit, 10_000).expect("limit"),
        ttl: Ttl::from_millis(ttl_ms, 60_000, "ttl_ms").expect("ttl"),
        owner: None,
        token_generated: true,
    }
}

#[tokio::test]
async fn c18_semaphore_reacquire_takes_no_second_permit_in_the_core() {
    let redis = RedisServer::spawn().await;
    let node = backend(&redis);
    let (a, b, c) = (Token::generate(), Token::generate(), Token::generate());
    let Ok(PermitOutcome::Granted(first)) = node
        .take_permit(&request(&a, 2, 10_000))
        .await
        .expect("redis")
    else {
        panic!("A's first permit");
    };
    let Ok(PermitOutcome::Renewed(again)) = node
        .take_permit(&request(&a, 2, 10_000))
        .await
        .expect("redis")
    else {
        panic!("A's retry renews");
    };
    assert_eq!(again.lease.fence, first.lease.fence);
    assert!(matches!(
        node.take_permit(&request(&b, 2, 10_000))
            .await
            .expect("redis"),
        Ok(PermitOutcome::Granted(_))
    ));
    assert!(matches!(
        node.take_permit(&request(&c, 2, 10_000))
            .await
            .expect("redis"),
        Err(Refusal::Full { .. })
    ));
    assert!(
        matches!(node.take_permit(&request(&c, 3, 10_000)).await.expect("redis"), Err(Refusal::LimitMismatch { held }) if held.get() == 2)
    );
    let name = LockName::parse("pool").expect("name");
    let info = node
        .inspect_semaphore(&name)
        .await
        .expect("redis")
        .expect("held");
    assert_eq!(info.limit.get(), 2);
    assert_eq!(info.permits.len(), 2);
    assert!(
        node.give_back_permit(&name, &a)
            .await
            .expect("redis")
            .is_some()
    );
    assert!(
        node.give_back_permit(&name, &a)
            .await
            .expect("redis")
            .is_none()
    );
    let Ok(PermitOutcome::Granted(third)) = node
        .take_permit(&request(&c, 2, 10_000))
        .await
        .expect("redis")
    else {
        panic!("C gets the freed permit");
    };
    assert!(third.lease.fence > first.lease.fence);
    let short = node
        .extend_permit(
            &name,
            &b,
            ExtendTtl::To(Ttl::from_millis(50, 60_000, "ttl_ms").expect("ttl")),
        )
        .await
        .expect("redis");
    assert!(short.is_some());
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert_eq!(
        node.extend_permit(
            &name,
            &b,
            ExtendTtl::Own {
                fallback: Ttl::from_millis(500, 60_000, "ttl_ms").expect("ttl")
            }
        )
        .await
        .expect("redis"),
        None,
        "a lapsed permit is never recreated"
    );
    let info = node
        .inspect_semaphore(&name)
        .await
        .expect("redis")
        .expect("held");
    assert_eq!(info.permits.len(), 1, "B's lapsed permit is free at once");
}

/// C19 in the core: 50 clients take, hold briefly and give back permits of
/// a semaphore with limit 3, one in five leaving theirs to run out; a
/// sampler that reads the semaphore never sees more than 3 live permits,
/// and never more than 3 clients hold one at once.
#[tokio::test]
async fn c19_semaphore_atomic_never_more_than_the_limit_in_the_core() {
    let redis = RedisServer::spawn().await;
    let node = Arc::new(backend(&redis));
    let name = LockName::parse("pool").expect("name");
    let holding = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    let clients: Vec<_> = (0..50)
        .map(|i| {
            let (node, name, holding, most) =
                (node.clone(), name.clone(), holding.clone(), most.clone());
            tokio::spawn(async move {
                let token = Token::generate();
                while tokio::time::Instant::now() < deadline {
                    let Ok(PermitOutcome::Granted(_)) = node
                        .take_permit(&request(&token, 3, 120))
                        .await
                        .expect("redis")
                    else {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    };
                    // Counted while surely live: 20 ms of a 120 ms lease
                    // (a wide margin for timers late on a loaded machine).
                    let now = holding.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                    most.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    holding.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                    if i % 5 != 0 {
                        node.give_back_permit(&name, &token).await.expect("redis");
                    } else {
                        // Left to run out.
                        tokio::time::sleep(Duration::from_millis(130)).await;
                    }
                }
            })
        })
        .collect();
    let mut samples = 0;
    while tokio::time::Instant::now() < deadline {
        if let Some(info) = node.inspect_semaphore(&name).await.expect("redis") {
            assert!(
                info.permits.len() <= 3,
                "{} live permits",
                info.permits.len()
            );
            samples += 1;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    for client in clients {
        client.await.expect("client");
    }
    assert!(
        samples > 50,
        "the sampler saw the semaphore held {samples} times"
    );
    let most = most.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        (1..=3).contains(&most),
        "{most} clients held permits at once"
    );
}

/// A permit is its holder's for at least its TTL from the moment the take
/// was sent: a second client spinning on the semaphore (straight on the
/// backend, so each try's answer comes within a fraction of a millisecond)
/// never has its grant answered before that. Expiries in whole
/// milliseconds of Redis's clock let it in up to 1 ms early, in about half
/// of the rounds.
#[tokio::test]
async fn a_permit_never_runs_out_before_its_ttl_in_the_core() {
    let redis = RedisServer::spawn().await;
    let node = backend(&redis);
    let mut early = Vec::new();
    for round in 0..60 {
        let name = LockName::parse(&format!("edge-{round}")).expect("name");
        let first = PermitRequest {
            name: name.clone(),
            ..request(&Token::generate(), 1, 20)
        };
        let sent = std::time::Instant::now();
        assert!(matches!(
            node.take_permit(&first).await.expect("redis"),
            Ok(PermitOutcome::Granted(_))
        ));
        let second = PermitRequest {
            name,
            ..request(&Token::generate(), 1, 1_000)
        };
        let answered = loop {
            if let Ok(PermitOutcome::Granted(_)) = node.take_permit(&second).await.expect("redis") {
                break std::time::Instant::now();
            }
        };
        let end = sent + Duration::from_millis(20);
        if answered < end {
            early.push(end - answered);
        }
    }
    assert!(
        early.is_empty(),
        "{} of 60 second permits were answered before the first could end, by {early:?}",
        early.len()
    );
}
