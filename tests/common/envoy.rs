//! Shared by the Envoy service's tests and its bench: a descriptor from `(key, value)` pairs,
//! and a tonic client of a service served on 127.0.0.1:0 by a task of the current runtime.

#![allow(dead_code)] // each user takes what it needs

use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use turnstile::Clock;
use turnstile::envoy::RlsService;
use turnstile::envoy::proto::{Entry, RateLimitDescriptor};

/// A descriptor of `entries`, outermost first, with no override and no hits of its own.
pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).into(),
                value: (*v).into(),
            })
            .collect(),
        ..Default::default()
    }
}

/// Serves `service` on 127.0.0.1:0 and returns a connected client.
pub async fn serve<C: Clock + Clone>(service: RlsService<C>) -> tonic::client::Grpc<Channel> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    let router = Server::builder().add_service(service);
    tokio::spawn(async move {
        router
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .expect("server");
    });
    let channel = Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    tonic::client::Grpc::new(channel)
}
