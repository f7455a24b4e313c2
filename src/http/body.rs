//! [`RateLimitBody`]: the response body of the layers, the inner service's body or a body the
//! layer wrote itself (a rejection).

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
        },
        Full {
            data: Option<Bytes>,
        },
    }
}

pin_project! {
    /// The response body of [`RateLimitLayer`](crate::http::RateLimitLayer) and
    /// [`ConcurrencyLayer`](crate::http::ConcurrencyLayer): the inner service's body, or the
    /// complete body of a rejection. Its data is [`Bytes`]; its error is the inner body's.
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
            kind: Kind::Inner { body, permit: None },
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
            },
        }
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
            KindProj::Inner { body, permit } => {
                let polled = body.poll_frame(cx);
                match &polled {
                    // The end, or an error (after which the body is not polled again).
                    Poll::Ready(None) | Poll::Ready(Some(Err(_))) => {
                        permit.take();
                    }
                    Poll::Ready(Some(Ok(_))) | Poll::Pending => {}
                }
                polled
            }
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body, .. } => body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body, .. } => body.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}
