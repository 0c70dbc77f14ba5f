//! The routes a link's reader has resolved, so that a message to a process it has delivered to
//! before costs one hash lookup instead of the node's and the process's maps.

use std::hash::{BuildHasher, Hash, Hasher};
use std::ops::Range;

use hashbrown::HashTable;
use hashbrown::hash_table::Entry;

use crate::inbox::Route;
use crate::wire::EnvelopeRef;
use muster_actor::RemoteError;

/// The routes one link's reader has resolved, valid while the node's `changes` count stays
/// where it was when they were found. An envelope whose process, type and kind match an entry
/// is delivered without the node's or the process's maps.
///
/// Only routes that exist are kept, so the cache never holds more entries than the node serves
/// (process, type) pairs, whatever a peer sends. A link usually carries a few types to a few
/// processes; a node serving thousands of processes (a bench's stand-in agents) keeps a route to
/// each one it has delivered to, where a cache of the last few used to miss on almost every
/// envelope.
#[derive(Default)]
pub(super) struct RouteCache {
    changes: u64,
    routes: HashTable<CachedRoute>,
    /// Seeded per process: which names collide is not for a peer to choose.
    hasher: foldhash::fast::RandomState,
    /// Room for a run of tells, kept from frame to frame.
    pub(super) bodies: Vec<Range<usize>>,
}

struct CachedRoute {
    /// The process's name and the type's name, as the envelope had them.
    to: Box<[u8]>,
    type_name: Box<[u8]>,
    ask: bool,
    route: Route,
}

/// The hash of a route's key.
fn route_hash(hasher: &foldhash::fast::RandomState, to: &[u8], type_name: &[u8], ask: bool) -> u64 {
    let mut state = hasher.build_hasher();
    to.hash(&mut state);
    type_name.hash(&mut state);
    ask.hash(&mut state);
    state.finish()
}

impl RouteCache {
    /// The route of `envelope` (an ask if `ask`), from the cache or else from `resolve`.
    /// `changes` is the node's count of changes to what it serves, read before resolving: a
    /// change made meanwhile moves the count past it, so what is cached now is dropped at the
    /// next envelope.
    pub(super) fn find(
        &mut self,
        changes: u64,
        envelope: &EnvelopeRef<'_>,
        ask: bool,
        resolve: impl FnOnce() -> Result<Route, RemoteError>,
    ) -> Result<&Route, RemoteError> {
        if changes != self.changes {
            self.routes.clear();
            self.changes = changes;
        }
        let RouteCache { routes, hasher, .. } = self;
        let hash = route_hash(hasher, envelope.to, envelope.type_name, ask);
        let same = |entry: &CachedRoute| {
            entry.ask == ask && *entry.to == *envelope.to && *entry.type_name == *envelope.type_name
        };
        let rehash =
            |entry: &CachedRoute| route_hash(hasher, &entry.to, &entry.type_name, entry.ask);
        let entry = match routes.entry(hash, same, rehash) {
            Entry::Occupied(known) => known.into_mut(),
            Entry::Vacant(vacant) => vacant
                .insert(CachedRoute {
                    to: envelope.to.into(),
                    type_name: envelope.type_name.into(),
                    ask,
                    route: resolve()?,
                })
                .into_mut(),
        };
        Ok(&entry.route)
    }

    /// Routes kept.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.routes.len()
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::sync::Arc;

    use super::*;

    fn envelope<'a>(to: &'a [u8], type_name: &'a [u8]) -> EnvelopeRef<'a> {
        EnvelopeRef {
            kind: 0,
            to,
            type_name,
            body: 0..0,
            request_id: 0,
            error_code: 0,
            error: b"",
            same_head: false,
        }
    }

    fn a_route() -> Route {
        Route::Tell(Arc::new(|_, _, _, _| {}))
    }

    #[test]
    fn a_route_is_resolved_once_per_process_type_and_kind_until_the_node_changes() {
        let mut cache = RouteCache::default();
        let resolved = Cell::new(0);
        let resolve = || {
            resolved.set(resolved.get() + 1);
            Ok(a_route())
        };
        // A thousand processes, each reached twice: each resolved once.
        for _ in 0..2 {
            for n in 0..1_000 {
                let to = format!("agent-{n}");
                let found = cache.find(1, &envelope(to.as_bytes(), b"t.Launch"), false, resolve);
                assert!(found.is_ok());
            }
        }
        assert_eq!(resolved.get(), 1_000);
        assert_eq!(cache.len(), 1_000);

        // Another type, or an ask of the same type, is another route.
        let to = b"agent-1".as_slice();
        cache.find(1, &envelope(to, b"t.Kill"), false, resolve).ok();
        cache
            .find(1, &envelope(to, b"t.Launch"), true, resolve)
            .ok();
        assert_eq!(resolved.get(), 1_002);

        // A change to what the node serves drops them all.
        cache
            .find(2, &envelope(to, b"t.Launch"), false, resolve)
            .ok();
        assert_eq!(resolved.get(), 1_003);
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn a_route_that_does_not_resolve_is_not_kept() {
        let mut cache = RouteCache::default();
        let tried = Cell::new(0);
        for _ in 0..3 {
            let found = cache.find(1, &envelope(b"nobody", b"t.Launch"), false, || {
                tried.set(tried.get() + 1);
                Err(RemoteError::UnknownProcess("nobody".into()))
            });
            assert!(matches!(found, Err(RemoteError::UnknownProcess(name)) if name == "nobody"));
        }
        assert_eq!(tried.get(), 3);
        assert_eq!(cache.len(), 0);
    }
}
