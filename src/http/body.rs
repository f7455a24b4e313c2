//! [`RejectionBody`]: what [`RateLimitLayer`](crate::http::RateLimitLayer) asks of the inner
//! service's body type, to write its rejections in it; [`RateLimitBody`]: the response body of
//! [`ConcurrencyLayer`](crate::http::ConcurrencyLayer), and the wrapper for any body type.

use crate::OwnedPermit;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use std::pin::Pin;
use std::task::{Context, Poll};

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner {
            #[pin]
            body: B,
            // Held until the body ends or is dropped (the concurrency layer's in-flight slot).
            permit: Option<OwnedPermit>,
            // What is left of a data frame passed on in pieces (see `PIECE`); empty otherwise.
            rest: Bytes,
        },
        Full {
            data: Option<Bytes>,
        },
    }
}

pin_project! {
    /// The response body of [`ConcurrencyLayer`](crate::http::ConcurrencyLayer), and a wrapper
    /// for any body type ([`RateLimitLayer`](crate::http::RateLimitLayer) keeps the inner
    /// service's own): the inner service's body, or the complete body of a rejection. Its data is [`Bytes`]; its error is the inner body's.
    /// While it holds the concurrency layer's permit, it passes the inner body's data frames on
    /// in pieces of at most 64 KiB, so that a server takes a large one as the client reads it;
    /// [`new`](Self::new)'s frames pass through as they are.
    ///
    /// # Examples
    ///
    /// ```
    /// use http_body::Body;
    /// use turnstile::http::RateLimitBody;
    ///
    /// let body: RateLimitBody<String> = RateLimitBody::full("too many requests");
    /// assert_eq!(body.size_hint().exact(), Some(17));
    /// ```
    pub struct RateLimitBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

impl<B> RateLimitBody<B> {
    /// The inner service's body, passed through.
    ///
    /// # Examples
    ///
    /// ```
    /// use http_body::Body;
    /// use turnstile::http::RateLimitBody;
    ///
    /// let body = RateLimitBody::new(String::from("hello"));
    /// assert_eq!(body.size_hint().exact(), Some(5));
    /// ```
    pub fn new(body: B) -> Self {
        RateLimitBody {
            kind: Kind::Inner {
                body,
                permit: None,
                rest: Bytes::new(),
            },
        }
    }

    /// A complete body the layer wrote.
    ///
    /// # Examples
    ///
    /// ```
    /// use http_body::Body;
    /// use turnstile::http::RateLimitBody;
    ///
    /// let body: RateLimitBody<String> = RateLimitBody::full("");
    /// assert!(body.is_end_stream());
    /// ```
    pub fn full(data: impl Into<Bytes>) -> Self {
        let data = data.into();
        RateLimitBody {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }

    pub(crate) fn with_permit(body: B, permit: OwnedPermit) -> Self {
        RateLimitBody {
            kind: Kind::Inner {
                body,
                permit: Some(permit),
                rest: Bytes::new(),
            },
        }
    }
}

/// The largest data frame a [`RateLimitBody`] holding a permit passes on: 64 KiB, a fraction of
/// hyper's write buffer (about 400 KB) and the size of h2's initial flow-control window.
const PIECE: usize = 64 * 1024;

/// The next piece of `rest`, at most [`PIECE`] long (an O(1) split of the shared buffer).
fn next_piece(rest: &mut Bytes) -> Bytes {
    if rest.len() > PIECE {
        rest.split_to(PIECE)
    } else {
        std::mem::take(rest)
    }
}

impl<B> std::fmt::Debug for RateLimitBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Inner { permit, .. } => f
                .debug_struct("RateLimitBody::Inner")
                .field("holds_permit", &permit.is_some())
                .finish_non_exhaustive(),
            Kind::Full { data } => f
                .debug_struct("RateLimitBody::Full")
                .field("len", &data.as_ref().map_or(0, Bytes::len))
                .finish(),
        }
    }
}

impl<B> Body for RateLimitBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body, permit, rest } => {
                if !rest.is_empty() {
                    return Poll::Ready(Some(Ok(Frame::data(next_piece(rest)))));
                }
                match body.poll_frame(cx) {
                    // Holding a permit: a large data frame goes on in pieces, so that the
                    // server takes it as the client reads it (hyper's HTTP/1 polls for the next
                    // frame only when its write buffer has room; over h2, hyper 1.12 polls one
                    // frame ahead and sends it when the flow-control window has room) and the
                    // permit stays taken until little more than the server's buffers is left
                    // to send. Whole, it would be taken at once with the
                    // headers, and a download of any size would count as in flight for no time.
                    Poll::Ready(Some(Ok(frame))) if permit.is_some() => match frame.into_data() {
                        Ok(data) => {
                            *rest = data;
                            Poll::Ready(Some(Ok(Frame::data(next_piece(rest)))))
                        }
                        Err(frame) => Poll::Ready(Some(Ok(frame))),
                    },
                    // The end, or an error (after which the body is not polled again).
                    polled @ (Poll::Ready(None) | Poll::Ready(Some(Err(_)))) => {
                        permit.take();
                        polled
                    }
                    polled => polled,
                }
            }
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body, rest, .. } => rest.is_empty() && body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body, rest, .. } => {
                let mut hint = body.size_hint();
                let rest = rest.len() as u64;
                // The upper bound first: `set_lower` asserts that it stays below it.
                if let Some(upper) = hint.upper() {
                    hint.set_upper(upper.saturating_add(rest));
                }
                hint.set_lower(hint.lower().saturating_add(rest));
                hint
            }
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

/// A response body type that can also hold a rejection: [`RateLimitLayer`]'s responses keep the
/// inner service's body type (an admitted response passes through as it is, with no wrapper
/// for axum or tonic to box again), so a rejection is written in that type.
///
/// Implemented for axum's `Body` (feature `axum`), tonic's `Body` (feature `tonic`),
/// `http_body_util`'s `Full<Bytes>`, `BoxBody` and `UnsyncBoxBody`, [`String`], and
/// [`RateLimitBody`] of any body. For a service with another body type, map its responses into
/// [`RateLimitBody::new`] inside the layer (for example with tower's `map_response`), or
/// implement this trait.
///
/// [`RateLimitLayer`]: crate::http::RateLimitLayer
///
/// # Examples
///
/// ```
/// use bytes::Bytes;
/// use turnstile::http::RejectionBody;
///
/// let body = String::rejection(Bytes::from_static(b"too many requests"));
/// assert_eq!(body, "too many requests");
/// ```
///
/// An inner service whose body type is none of these (here `Empty`, which cannot hold a
/// rejection; a tower-http layer's body is another case) gets its responses mapped into
/// [`RateLimitBody`] between it and the layer:
///
/// ```
/// use bytes::Bytes;
/// use http_body_util::Empty;
/// use tower::{Service, ServiceBuilder, ServiceExt};
/// use turnstile::http::{Check, Outcome, Policy, Quotas, RateLimitBody, RateLimitLayer, RequestInfo, Verdict};
///
/// struct AdmitAll;
/// impl Policy for AdmitAll {
///     fn check(&self, _: &RequestInfo<'_>) -> Check {
///         Check::Ready(Verdict { outcome: Outcome::Admitted, quotas: Quotas::new() })
///     }
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let mut service = ServiceBuilder::new()
///     .layer(RateLimitLayer::new(AdmitAll))
///     .map_response(|response: http::Response<Empty<Bytes>>| response.map(RateLimitBody::new))
///     .service_fn(|_: http::Request<()>| async {
///         Ok::<_, std::convert::Infallible>(http::Response::new(Empty::<Bytes>::new()))
///     });
/// let response = service.ready().await.unwrap().call(http::Request::new(())).await.unwrap();
/// assert_eq!(response.status(), 200);
/// # }
/// ```
pub trait RejectionBody {
    /// A complete body holding `data`: a rejection's document (its UTF-8 text), or nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http_body::Body;
    /// use turnstile::http::{RateLimitBody, RejectionBody};
    ///
    /// let body: RateLimitBody<String> = RejectionBody::rejection(Bytes::from_static(b"{}"));
    /// assert_eq!(body.size_hint().exact(), Some(2));
    /// ```
    fn rejection(data: Bytes) -> Self;
}

impl<B> RejectionBody for RateLimitBody<B> {
    fn rejection(data: Bytes) -> Self {
        RateLimitBody::full(data)
    }
}

impl RejectionBody for String {
    fn rejection(data: Bytes) -> Self {
        // The layer writes UTF-8 only; anything else would be replaced, not lost silently.
        String::from_utf8_lossy(&data).into_owned()
    }
}

impl RejectionBody for http_body_util::Full<Bytes> {
    fn rejection(data: Bytes) -> Self {
        http_body_util::Full::new(data)
    }
}

impl<E: 'static> RejectionBody for http_body_util::combinators::BoxBody<Bytes, E> {
    fn rejection(data: Bytes) -> Self {
        use http_body_util::BodyExt;
        http_body_util::Full::new(data)
            .map_err(|never| match never {})
            .boxed()
    }
}

impl<E: 'static> RejectionBody for http_body_util::combinators::UnsyncBoxBody<Bytes, E> {
    fn rejection(data: Bytes) -> Self {
        use http_body_util::BodyExt;
        http_body_util::Full::new(data)
            .map_err(|never| match never {})
            .boxed_unsync()
    }
}

#[cfg(feature = "axum")]
impl RejectionBody for axum::body::Body {
    fn rejection(data: Bytes) -> Self {
        axum::body::Body::from(data)
    }
}

#[cfg(feature = "tonic")]
impl RejectionBody for tonic::body::Body {
    fn rejection(data: Bytes) -> Self {
        if data.is_empty() {
            tonic::body::Body::empty()
        } else {
            tonic::body::Body::new(http_body_util::Full::new(data))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    async fn read<B>(body: B) -> Bytes
    where
        B: Body<Data = Bytes>,
        B::Error: std::fmt::Debug,
    {
        body.collect().await.expect("a body").to_bytes()
    }

    /// Every body type the layer can answer in holds the rejection's bytes, and an empty
    /// rejection (a gRPC one) is an empty body.
    #[tokio::test]
    async fn every_rejection_body_holds_the_data() {
        for text in [&b"{\"status\":429}"[..], b""] {
            let data = Bytes::copy_from_slice(text);
            assert_eq!(
                read(RateLimitBody::<String>::rejection(data.clone())).await,
                text
            );
            assert_eq!(read(String::rejection(data.clone())).await, text);
            assert_eq!(
                read(http_body_util::Full::<Bytes>::rejection(data.clone())).await,
                text
            );
            assert_eq!(
                read(
                    http_body_util::combinators::BoxBody::<Bytes, std::io::Error>::rejection(
                        data.clone()
                    )
                )
                .await,
                text
            );
            assert_eq!(
                read(http_body_util::combinators::UnsyncBoxBody::<
                    Bytes,
                    std::io::Error,
                >::rejection(data.clone()))
                .await,
                text
            );
            #[cfg(feature = "axum")]
            assert_eq!(read(axum::body::Body::rejection(data.clone())).await, text);
            #[cfg(feature = "tonic")]
            {
                let body = tonic::body::Body::rejection(data.clone());
                assert_eq!(body.is_end_stream(), text.is_empty());
                assert_eq!(read(body).await, text);
            }
        }
    }
}
