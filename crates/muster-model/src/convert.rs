//! Conversions between the model and its `muster.model.v1` messages, and helpers for reading
//! nested messages.
//!
//! A model value becomes its message with `From`, which never fails. A message becomes a model
//! value with `TryFrom`, which checks it: an unknown or unspecified enum value, a missing
//! required message, a priority above 255 or a cpu amount that is NaN, infinite or negative is
//! a [`FieldError`] naming the field. Encoding maps cpu amounts the model treats as zero (NaN,
//! negative) to zero and an infinite one to the largest finite amount, so whatever one side
//! encodes the other decodes. Enums travel as the `i32` prost stores them.
//!
//! Crates with wire types of their own (the scheduler SDK's snapshots and plans) build their
//! conversions from [`read`], [`required`] and [`each`], so every error names its path from
//! the outermost message down.

use std::collections::{BTreeMap, HashMap};

use crate::error::FieldError;

pub use lifecycle::{Lifecycle, task_lifecycle};

mod agent;
mod demand;
mod deployment;
mod eval;
mod job;
mod lifecycle;
mod ports;
mod resources;
mod task;

/// A job id as messages carry it: its namespace (empty for `default`) and its name apart.
pub fn job_id_to_wire(id: String) -> (String, String) {
    match id.split_once(':') {
        Some((namespace, name)) => (namespace.to_owned(), name.to_owned()),
        None => (String::new(), id),
    }
}

/// A job id from a message's namespace and name (a name that already carries its namespace,
/// as older messages did, is taken as it is).
pub fn job_id_from_wire(namespace: &str, name: String) -> String {
    if namespace.is_empty() || name.is_empty() {
        name
    } else {
        crate::namespace::job_id(namespace, &name)
    }
}

/// Reads `proto`, naming `field` in an error.
///
/// # Errors
/// The value's own [`FieldError`], seen from `field`.
pub fn read<T, P>(proto: P, field: &str) -> Result<T, FieldError>
where
    T: TryFrom<P, Error = FieldError>,
{
    T::try_from(proto).map_err(|e| e.within(field))
}

/// Reads the required message `proto` of `field`.
///
/// # Errors
/// [`FieldError`] if it is missing or invalid.
pub fn required<T, P>(proto: Option<P>, field: &str) -> Result<T, FieldError>
where
    T: TryFrom<P, Error = FieldError>,
{
    match proto {
        Some(proto) => read(proto, field),
        None => Err(FieldError::new(field, "missing")),
    }
}

/// Reads every element of the repeated field `field`.
///
/// # Errors
/// [`FieldError`] naming the first invalid element (`field[2].cpus`).
pub fn each<T, P>(protos: Vec<P>, field: &str) -> Result<Vec<T>, FieldError>
where
    T: TryFrom<P, Error = FieldError>,
{
    protos
        .into_iter()
        .enumerate()
        .map(|(i, proto)| read(proto, &format!("{field}[{i}]")))
        .collect()
}

/// Converts every element with `From`.
pub fn all<T, P: From<T>>(values: Vec<T>) -> Vec<P> {
    values.into_iter().map(P::from).collect()
}

/// A protobuf map (unordered) as the model keeps it (ordered).
pub fn sorted(map: HashMap<String, String>) -> BTreeMap<String, String> {
    map.into_iter().collect()
}

/// A model map as protobuf carries it.
pub fn unsorted(map: BTreeMap<String, String>) -> HashMap<String, String> {
    map.into_iter().collect()
}

/// A priority off the wire (`u32`) as the model keeps it (`u8`).
///
/// # Errors
/// [`FieldError`] naming `field` if it is above 255.
pub fn priority(value: u32, field: &str) -> Result<u8, FieldError> {
    u8::try_from(value)
        .map_err(|_| FieldError::new(field, format!("{value} is above the highest, 255")))
}

/// An enum value prost could not name, or the unspecified zero.
pub(crate) fn bad_enum(value: i32) -> FieldError {
    if value == 0 {
        FieldError::new("", "unspecified")
    } else {
        FieldError::new("", format!("unknown value {value}"))
    }
}
