//! A stream that goes on from another node when it is cut after its first
//! byte: the body a node's pipeline and the edge SDK both wrap around the
//! stream they hold for their client. The stream's state is a
//! [`pair_translate::resume::Stitcher`] (no I/O); how a continuation is
//! sent is the shell's ([`Mover`]: the same failover driver and attempts
//! as any request, the nodes it was cut on left out).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pair_core::NodeId;
use pair_translate::resume::{Api, Cut, Stitcher};
use serde_json::Value;

use crate::InferenceRoute;

/// Nodes a stream was cut on (the one it began on first).
pub type Dead = Vec<NodeId>;

/// A continuation under way: its answer once committed, or `None`.
pub type Sending<B> = Pin<Box<dyn Future<Output = Option<Moved<B>>> + Send>>;

/// How a shell sends a cut stream's continuation.
pub trait Mover: Send + Sync + 'static {
    /// The continuation's body (the same kind as the stream's).
    type Body: Body<Data = Bytes, Error: Send + 'static> + Send + Unpin + 'static;

    /// Sends `request` (the continuation, on `route`: it may not be the
    /// stream's) to the best owner of the model outside `dead`; its
    /// answer once committed (its first frame read), or `None` when no
    /// owner takes it.
    fn send(
        self: Arc<Self>,
        request: Bytes,
        route: InferenceRoute,
        dead: Dead,
    ) -> Sending<Self::Body>;

    /// The answer moved to `node` after `at_token` tokens: the move's
    /// receipt entry (`x_pair.resumed`), recorded where the shell keeps its
    /// records.
    fn moved(&self, node: NodeId, at_token: u32) -> Value;

    /// Whether `cut` was the shell's own, to give the node's slot to other
    /// work: the node it was cut on is healthy and stays a candidate for
    /// the continuation.
    fn yielded(&self, cut: &<Self::Body as Body>::Error) -> bool {
        let _ = cut;
        false
    }

    /// The stream was cut and cannot go on, for this reason (for the log).
    fn stopped(&self, why: &'static str) {
        let _ = why;
    }
}

/// An answer continued elsewhere: the node, its body (the first frame
/// already read), and what it holds until the answer ends.
pub struct Moved<B> {
    pub node: NodeId,
    pub first: Option<Bytes>,
    pub body: B,
    pub holding: Box<dyn Send>,
}

impl<B> std::fmt::Debug for Moved<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Moved")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

type Moving<B> = Pin<Box<dyn Future<Output = Option<(Moved<B>, Value, Api, u32)>> + Send>>;

/// A stream on its way to its client, continued on another node when it
/// is cut after its first byte.
pub struct Resuming<M: Mover> {
    inner: M::Body,
    mover: Arc<M>,
    stitch: Stitcher,
    /// A continuation's first frame, not yet passed on.
    queued: Option<Bytes>,
    moving: Option<Moving<M::Body>>,
    /// The cut a move is for: what the client gets if none is made.
    cut: Option<<M::Body as Body>::Error>,
    dead: Dead,
    holding: Vec<Box<dyn Send>>,
    /// The stream's last piece, made here (its end after a cut that came
    /// after the final event, or the final event of a used-up limit).
    closing: Option<Bytes>,
    done: bool,
}

// No field is pinned: the stream is `Unpin` and polled through `Pin::new`,
// the moves are boxed.
impl<M: Mover> Unpin for Resuming<M> {}

impl<M: Mover> std::fmt::Debug for Resuming<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resuming")
            .field("api", &self.stitch.api())
            .field("dead", &self.dead)
            .finish_non_exhaustive()
    }
}

impl<M: Mover> Resuming<M> {
    /// `inner`, begun on `began_on`, moved by `mover` when cut; `first`:
    /// what was already read of it (it goes out first).
    pub fn new(
        inner: M::Body,
        first: Option<Bytes>,
        stitch: Stitcher,
        mover: M,
        began_on: NodeId,
    ) -> Self {
        Self {
            inner,
            mover: Arc::new(mover),
            stitch,
            queued: first,
            moving: None,
            cut: None,
            dead: vec![began_on],
            holding: Vec::new(),
            closing: None,
            done: false,
        }
    }

    /// A cut after the first byte: starts a move, ends the answer, or
    /// gives the cut back when it cannot go on.
    fn on_cut(&mut self, e: <M::Body as Body>::Error) -> Option<<M::Body as Body>::Error> {
        match self.stitch.cut() {
            Cut::Move {
                request,
                api,
                before,
            } => {
                // The node it runs on is the last of `dead`.
                if self.mover.yielded(&e) {
                    self.dead.pop();
                }
                let mover = Arc::clone(&self.mover);
                let dead = self.dead.clone();
                self.moving = Some(Box::pin(async move {
                    let route = InferenceRoute::continued(api);
                    let moved = Arc::clone(&mover).send(request, route, dead).await?;
                    let entry = mover.moved(moved.node, before);
                    Some((moved, entry, api, before))
                }));
                self.cut = Some(e);
                None
            }
            Cut::End(closing) => {
                self.closing = closing;
                self.done = true;
                None
            }
            Cut::Stop(why) => {
                self.mover.stopped(why);
                self.done = true;
                Some(e)
            }
        }
    }
}

impl<M: Mover> Body for Resuming<M> {
    type Data = Bytes;
    type Error = <M::Body as Body>::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        loop {
            if let Some(moving) = this.moving.as_mut() {
                match moving.as_mut().poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(None) => {
                        this.mover.stopped("no other owner took it");
                        this.moving = None;
                        this.done = true;
                        return Poll::Ready(this.cut.take().map(Err));
                    }
                    Poll::Ready(Some((moved, entry, api, before))) => {
                        this.moving = None;
                        this.cut = None;
                        this.dead.push(moved.node);
                        this.inner = moved.body;
                        this.queued = moved.first;
                        this.holding.push(moved.holding);
                        this.stitch.moved(api, before, entry);
                        continue;
                    }
                }
            }
            if let Some(first) = this.queued.take() {
                if let Some(out) = this.stitch.feed(first) {
                    return Poll::Ready(Some(Ok(Frame::data(out))));
                }
                continue;
            }
            if this.done {
                return Poll::Ready(this.closing.take().map(|b| Ok(Frame::data(b))));
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        if let Some(out) = this.stitch.feed(data) {
                            return Poll::Ready(Some(Ok(Frame::data(out))));
                        }
                    }
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                },
                Poll::Ready(Some(Err(e))) => {
                    // Before the first byte, a failure is the failover's
                    // (the request is sent again whole).
                    if !this.stitch.began() {
                        return Poll::Ready(Some(Err(e)));
                    }
                    if let Some(e) = this.on_cut(e) {
                        return Poll::Ready(Some(Err(e)));
                    }
                }
                Poll::Ready(None) => {
                    this.done = true;
                    return Poll::Ready(this.stitch.rest().map(|b| Ok(Frame::data(b))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.closing.is_none() && self.moving.is_none() && self.queued.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}
