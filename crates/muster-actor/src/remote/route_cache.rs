//! The routes a link's reader resolved lately, so that a run of messages of one type to one
//! process costs no map lookups.

use std::ops::Range;

use super::inbox::Route;
use super::wire::EnvelopeRef;
use crate::RemoteError;

/// The routes one link's reader resolved lately (a few: a link usually carries a few types to a
/// few processes), valid while the node's `changes` count stays where it was when they were
/// found. An envelope whose process, type and kind match an entry is delivered without the
/// node's or the process's maps.
#[derive(Default)]
pub(super) struct RouteCache {
    changes: u64,
    entries: Vec<CachedRoute>,
    /// The entry the next miss replaces once the cache is full (the oldest).
    next: usize,
    /// Room for a run of tells, kept from frame to frame.
    pub(super) bodies: Vec<Range<usize>>,
}

struct CachedRoute {
    /// The process's name and the type's name, as the envelope had them; a replaced entry
    /// keeps their buffers, so a miss allocates nothing once the cache is full.
    to: Vec<u8>,
    type_name: Vec<u8>,
    ask: bool,
    route: Route,
}

impl RouteCache {
    /// Entries kept at most; a miss replaces the oldest.
    const CAPACITY: usize = 8;

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
            self.entries.clear();
            self.next = 0;
            self.changes = changes;
        }
        let found = self.entries.iter().position(|entry| {
            entry.ask == ask && *entry.to == *envelope.to && *entry.type_name == *envelope.type_name
        });
        let at = match found {
            Some(at) => at,
            None => {
                let route = resolve()?;
                if self.entries.len() < Self::CAPACITY {
                    self.entries.push(CachedRoute {
                        to: envelope.to.to_vec(),
                        type_name: envelope.type_name.to_vec(),
                        ask,
                        route,
                    });
                    self.entries.len() - 1
                } else {
                    let at = self.next;
                    self.next = (at + 1) % Self::CAPACITY;
                    let entry = &mut self.entries[at];
                    entry.to.clear();
                    entry.to.extend_from_slice(envelope.to);
                    entry.type_name.clear();
                    entry.type_name.extend_from_slice(envelope.type_name);
                    entry.ask = ask;
                    entry.route = route;
                    at
                }
            }
        };
        Ok(&self.entries[at].route)
    }
}
