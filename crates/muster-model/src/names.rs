//! The rules every name and text of a submitted job follows: what a name may be, which
//! control characters a text may hold, and the error that names the field.

use crate::error::FieldError;

/// Whether `name` is 1 to 128 letters, digits, `-` or `_`: what job, group and check names
/// are.
pub(crate) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
}

/// A field's error.
pub(crate) fn invalid(field: impl Into<String>, problem: impl Into<String>) -> FieldError {
    FieldError::new(field, problem)
}

/// Which characters a text field of a job may hold.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Text {
    /// A program, a user, a variable's name, an attribute: no control character at all.
    Name,
    /// An argument or a variable's value: tab, newline and carriage return, but no other
    /// control character (NUL cannot reach a program through `execve` at all).
    Value,
}

/// Refuses a control character in `text` that `kind` does not allow, naming the first one and
/// where it is.
pub(crate) fn check_text(field: &str, text: &str, kind: Text) -> Result<(), FieldError> {
    let allowed = |c: char| kind == Text::Value && matches!(c, '\t' | '\n' | '\r');
    match text
        .char_indices()
        .find(|&(_, c)| c.is_control() && !allowed(c))
    {
        None => Ok(()),
        Some((at, c)) => Err(invalid(
            field,
            format!(
                "holds the control character U+{:04X} at byte {at}{}",
                c as u32,
                match kind {
                    Text::Name => "; none is allowed here",
                    Text::Value => "; only tab, newline and carriage return are allowed",
                }
            ),
        )),
    }
}
