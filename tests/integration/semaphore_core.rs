//! Semaphores in the lock core, on a real Redis (issue 17, in progress:
//! the HTTP API comes next, and these cases move to it).

use std::sync::Arc;
use std::time::Duration;

use lockd::lock::connect::{ConnectReport, RedisTls};
use lockd::lock::redis::{Endpoint, RedisBackend, RedisConfig};
use lockd::lock::semaphore::{Limit, PermitOutcome, PermitRequest, Refusal};
use lockd::lock::{LockName, Token, Ttl};

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
    assert!(node.give_back_permit(&name, &a).await.expect("redis"));
    assert!(!node.give_back_permit(&name, &a).await.expect("redis"));
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
            Ttl::from_millis(50, 60_000, "ttl_ms").expect("ttl"),
        )
        .await
        .expect("redis");
    assert!(short.is_some());
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert_eq!(
        node.extend_permit(
            &name,
            &b,
            Ttl::from_millis(500, 60_000, "ttl_ms").expect("ttl")
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
