//! One connection type for a standalone Redis and a Redis Cluster, for the limiters of the HTTP
//! rules and of Envoy's rate limit service: one `RedisLimiter` type whichever the deployment,
//! so that a configuration can choose at run time and one request's limiters are decided
//! together.

use ::redis::aio::{ConnectionLike, ConnectionManager};
use ::redis::cluster_async::ClusterConnection;
use ::redis::{Cmd, Pipeline, RedisFuture, Value};

/// A connection to a standalone Redis or to a Redis Cluster.
#[derive(Clone)]
pub(crate) enum Connection {
    /// A standalone server, through a connection that reconnects by itself.
    Standalone(ConnectionManager),
    /// A Cluster: each command goes to the node that owns its keys' slot.
    Cluster(ClusterConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Standalone(c) => c.req_packed_command(cmd),
            Connection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Standalone(c) => c.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Standalone(c) => c.get_db(),
            Connection::Cluster(c) => c.get_db(),
        }
    }
}
