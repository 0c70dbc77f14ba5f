//! [`FieldError`]: a value that is not valid, and which field is wrong.

use std::fmt;

/// A value (a message off the wire, a submitted job) that is not valid, naming the field at
/// fault as a path from the value down (`groups[0].resources.cpus`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    field: String,
    problem: String,
}

impl FieldError {
    /// `field` (a path like `plan.place[1].resources`, or empty for the value itself) is wrong
    /// because of `problem`.
    pub fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            problem: problem.into(),
        }
    }

    /// The path of the field at fault; empty if the value itself is.
    pub fn field(&self) -> &str {
        &self.field
    }

    /// What is wrong with it.
    pub fn problem(&self) -> &str {
        &self.problem
    }

    /// The same error seen from the value that holds this one in its field `outer`.
    #[must_use]
    pub fn within(mut self, outer: &str) -> Self {
        self.field = if self.field.is_empty() {
            outer.to_owned()
        } else if self.field.starts_with('[') {
            format!("{outer}{}", self.field)
        } else {
            format!("{outer}.{}", self.field)
        };
        self
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "invalid value: {}", self.problem)
        } else {
            write!(f, "invalid {}: {}", self.field, self.problem)
        }
    }
}

impl std::error::Error for FieldError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_grow_outwards() {
        let e = FieldError::new("cpus", "NaN")
            .within("resources")
            .within("[2]")
            .within("groups");
        assert_eq!(e.field(), "groups[2].resources.cpus");
        assert_eq!(e.to_string(), "invalid groups[2].resources.cpus: NaN");
        assert_eq!(FieldError::new("", "x").within("plan").field(), "plan");
    }
}
