//! What the transport keeps of each message type it sends for the life of the program: its
//! proto full name and the head of the replies that carry it, built once per type.

use std::any::TypeId;
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::RwLock;

use muster_proto::transport::Kind;

use crate::wire::EnvelopeHead;

/// What the transport keeps of one message type for the life of the program: its proto full
/// name and the head of the replies that carry it. `prost::Name::full_name` allocates a new
/// `String` on every call, too much for every envelope.
struct MessageType {
    name: &'static [u8],
    reply: EnvelopeHead,
}

/// What the transport keeps of `M`, built once per type. The type this thread asked for last
/// is answered from a thread-local slot, without the shared map's lock or hash.
fn message_type<M: prost::Name + 'static>() -> &'static MessageType {
    thread_local! {
        static LAST: Cell<Option<(TypeId, &'static MessageType)>> = const { Cell::new(None) };
    }
    static TYPES: RwLock<Option<HashMap<TypeId, &'static MessageType>>> = RwLock::new(None);
    let id = TypeId::of::<M>();
    if let Some((last, known)) = LAST.get()
        && last == id
    {
        return known;
    }
    let known = TYPES
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .and_then(|types| types.get(&id).copied());
    let known = known.unwrap_or_else(|| {
        *TYPES
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert_with(HashMap::new)
            .entry(id)
            .or_insert_with(|| {
                let name: &'static [u8] = M::full_name().leak().as_bytes();
                Box::leak(Box::new(MessageType {
                    name,
                    reply: EnvelopeHead::new(Kind::Reply, b"", name),
                }))
            })
    });
    LAST.set(Some((id, known)));
    known
}

/// The proto full name of `M` (one string per message type a node sends, kept for good).
pub(crate) fn type_name<M: prost::Name + 'static>() -> &'static [u8] {
    message_type::<M>().name
}

/// The head of replies carrying an `M`, encoded once per type.
pub(crate) fn reply_head<M: prost::Name + 'static>() -> &'static EnvelopeHead {
    &message_type::<M>().reply
}
