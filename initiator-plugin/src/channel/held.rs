//! The hold queue of an initiator channel: admission of application I/O and chunks by
//! the host's token engine (`qos_core::HoldQueue` with `EngineAdmit`), their release
//! in order as tokens come, and what happens to what waits on reset (aborted), on
//! delete and shutdown (sent to the base), and on an ABORT of one I/O.

use std::rc::Rc;
use std::sync::atomic::Ordering;

use qos_core::{IoKind, Nanos};
use spdk_sys::bdev_io::IoStatus;

use super::io::base_done;
use super::{ChState, EngineAdmit, IniChannel, IniIo, Item, ParentRef, Room, now};
use crate::split::Stop;
use crate::state::lock;

impl IniChannel {
    /// Admits `item` through the engine, or holds it.
    pub(crate) fn admit(&self, item: Item, kind: IoKind, bytes: u64, now: Nanos) {
        if !self.protocol() {
            return self.send(item);
        }
        // The pool is open to the host and no allowance is in force: the engine
        // admits whatever comes, so with nothing held here (order) skip its lock.
        if self.shared.pool_open.load(Ordering::Relaxed)
            && self.shared.allowance.load(Ordering::Relaxed) == u64::MAX
            && self.st.borrow().held.is_empty()
        {
            return self.send(item);
        }
        let out = {
            let mut st = self.st.borrow_mut();
            let mut e = lock(&self.shared.eng);
            let mut a = EngineAdmit {
                engine: Some(&mut e.engine),
                stats: &self.shared.stats,
                room: Room::of(&self.shared),
            };
            let out = st.held.admit_or_hold(&mut a, kind, bytes, now, item);
            if out.is_none() {
                // Something waits: let the engine ask for tokens now.
                self.shared.next_poll.store(0, Ordering::Relaxed);
            }
            out
        };
        if let Some(item) = out {
            self.send(item);
        }
    }

    /// Releases held items while the engine allows, in order.
    pub(crate) fn release_held(&self, now: Nanos) {
        let ready = {
            let mut st = self.st.borrow_mut();
            if st.held.is_empty() {
                return;
            }
            let protocol = self.protocol();
            let mut e = lock(&self.shared.eng);
            let mut a = EngineAdmit {
                engine: protocol.then_some(&mut e.engine),
                stats: &self.shared.stats,
                room: if protocol {
                    Room::of(&self.shared)
                } else {
                    Room::default()
                },
            };
            let mut v = Vec::new();
            st.held.release(&mut a, now, |it, _| v.push(it));
            v
        };
        self.last_release.set(now.0);
        for it in ready {
            self.send(it);
        }
    }

    /// Completes everything held here as aborted and stops every transfer (reset).
    pub(crate) fn abort_everything(&self) {
        let (held, retry, streams) = {
            let mut st = self.st.borrow_mut();
            let ChState {
                held,
                retry,
                streams,
                stream,
                ..
            } = &mut *st;
            let mut a = EngineAdmit {
                engine: None,
                stats: &self.shared.stats,
                room: Room::default(),
            };
            let h: Vec<Item> = held.drain(&mut a).collect();
            let r: Vec<Item> = retry.drain(..).collect();
            let s: Vec<ParentRef> = streams.drain(..).collect();
            self.group.close(stream, now());
            (h, r, s)
        };
        for it in held.into_iter().chain(retry) {
            self.drop_item(it, Stop::Aborted);
        }
        for pp in streams {
            let done = {
                let mut p = pp.state().borrow_mut();
                p.track.stop(Stop::Aborted);
                p.track.is_done()
            };
            if done {
                self.finish(&pp);
            }
        }
    }

    /// Completes an item that will not be sent.
    pub(crate) fn drop_item(&self, it: Item, why: Stop) {
        match it {
            Item::Io(io) => {
                self.shared.stats.aborted.fetch_add(1, Ordering::Relaxed);
                io.complete(match why {
                    Stop::Aborted => IoStatus::Aborted,
                    Stop::Failed => IoStatus::Failed,
                })
            }
            Item::Chunk(pp, _) => {
                let done = {
                    let mut p = pp.state().borrow_mut();
                    p.track.chunk_dropped(why);
                    p.track.is_done()
                };
                if done {
                    self.finish(&pp);
                }
            }
        }
    }

    /// Sends everything held, waiting for the pacer, or retried, to the base (delete,
    /// shutdown: `bypass()` is true, so nothing is held again).
    pub(crate) fn release_everything(&self) {
        let items: Vec<Item> = {
            let mut st = self.st.borrow_mut();
            let ChState { held, retry, .. } = &mut *st;
            let mut a = EngineAdmit {
                engine: None,
                stats: &self.shared.stats,
                room: Room::default(),
            };
            let mut v: Vec<Item> = held.drain(&mut a).collect();
            v.extend(retry.drain(..));
            v
        };
        for it in items {
            self.send(it);
        }
        if !self.st.borrow().streams.is_empty() {
            self.pump(now());
        }
    }

    pub(crate) fn abort(&self, io: IniIo) {
        let Some(target) = io.abort_target() else {
            return io.complete(IoStatus::Failed);
        };
        // 1. Held (or waiting to be retried) here: complete it aborted.
        let victim = {
            let mut st = self.st.borrow_mut();
            let ChState { held, retry, .. } = &mut *st;
            let mut a = EngineAdmit {
                engine: None,
                stats: &self.shared.stats,
                room: Room::default(),
            };
            let is = |it: &Item| matches!(it, Item::Io(x) if x.id() == target);
            held.remove_first(&mut a, is).or_else(|| {
                let i = retry.iter().position(is)?;
                retry.remove(i)
            })
        };
        if let Some(v) = victim {
            self.drop_item(v, Stop::Aborted);
            return io.complete(IoStatus::Success);
        }
        // 2. A transfer being chunked (the bdev layer submits an abort on the channel of
        // the I/O it aborts): stop it, drop its waiting chunks, and abort its chunks at
        // the base (they carry the parent as callback argument).
        let parent = {
            let st = self.st.borrow();
            st.parents.iter().find(|p| p.is(target)).cloned()
        };
        if let Some(pp) = parent {
            let dropped: Vec<Item> = {
                let mut st = self.st.borrow_mut();
                let ChState { held, retry, .. } = &mut *st;
                let mut a = EngineAdmit {
                    engine: None,
                    stats: &self.shared.stats,
                    room: Room::default(),
                };
                let mine = |it: &Item| matches!(it, Item::Chunk(p, _) if Rc::ptr_eq(p, &pp));
                let mut v = Vec::new();
                while let Some(it) = held.remove_first(&mut a, mine) {
                    v.push(it);
                }
                while let Some(i) = retry.iter().position(mine) {
                    if let Some(it) = retry.remove(i) {
                        v.push(it);
                    }
                }
                v
            };
            let at_base = {
                let t = &mut pp.state().borrow_mut().track;
                t.stop(Stop::Aborted);
                t.outstanding() - dropped.len() as u64
            };
            if dropped.is_empty() && at_base == 0 {
                self.finish(&pp);
            }
            // The last dropped chunk finishes the parent when nothing is at the base;
            // after that neither the parent nor the target may be touched.
            for it in dropped {
                self.drop_item(it, Stop::Aborted);
            }
            if at_base == 0 {
                return io.complete(IoStatus::Success);
            }
            // When the base refuses, the chunks finish on their own.
            io.abort_at_base(pp.victim(), base_done, IoStatus::Success);
            return;
        }
        // 3. At the base: the base matches it by the callback argument we gave it (the
        // upper bdev_io).
        io.abort_at_base(target.as_victim(), base_done, IoStatus::Failed);
    }
}
