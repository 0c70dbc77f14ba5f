//! A program's settings from three layers: its flags over its TOML config file (`--config`)
//! over the defaults of the library it configures. Each setting is declared once, in one
//! struct that derives both clap's parser and serde's deserializer, wrapped in
//! [`settings!`](crate::settings!) (which generates the merge and the conversion); `--help`
//! and the configuration reference (`docs/configuration.md`, see [`reference()`]) are
//! rendered from that one command.
//!
//! A setting is an `Option<T>` (`None`: not given), a `Vec<T>` for a repeatable flag, or a
//! nested struct flattened into the flags and a table in the file (as
//! [`TlsFlags`](crate::security::TlsFlags) is `[tls]`). [`Layer`] puts one layer over another,
//! field by field; [`Setting`] says what a given setting holds, for the library's config.
//! Durations are [`HumanDuration`]s (`10s`, `5m`) and sizes [`ByteSize`]s (`10MiB`), in the
//! flags and the file alike.

mod generate;
mod reference;
mod values;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::{CommandFactory, FromArgMatches};
use serde::Deserialize;
use serde::de::{DeserializeOwned, Deserializer};

pub use reference::{check_reference, keys_of, reference};
pub use values::{ByteSize, HumanDuration};

/// Declares a program's settings once: a struct of settings (all its attributes, clap's and
/// serde's, pass through), with the [`Layer`] that merges two of them field by field, and, for
/// the library config `Target` it fills in:
///
/// - `fn apply(&self, config: &mut Target)`: writes each setting that was given (by a flag or
///   the file) and names a place in `Target` (`=> place`) there, over the default;
/// - `fn defaults(defaults: &Target) -> Vec<(&'static str, String)>`: each setting's default
///   as `--help` shows it, by argument id: `[default: TEXT]` where given (any `Display`
///   expression: a constant, or prose for a default that is not a value), else the value at
///   its place in `defaults`, written as the flag takes it (see [`Show`]);
/// - `fn command(defaults: &Target) -> clap::Command`: the parser, its help showing those
///   defaults (see [`with_defaults`]).
///
/// ```
/// use muster_launch::settings::{self, HumanDuration, Layer as _};
/// use std::time::Duration;
///
/// /// What the library takes, with its defaults.
/// #[derive(Debug)]
/// struct Config {
///     listen: String,
///     timeout: Duration,
///     peers: Vec<String>,
/// }
///
/// muster_launch::settings! {
///     /// Runs the example.
///     #[derive(Debug, Default, clap::Parser, serde::Deserialize)]
///     #[serde(default, deny_unknown_fields)]
///     struct Flags: Config {
///         /// The TOML file.
///         #[arg(long)]
///         #[serde(skip)]
///         config: Option<std::path::PathBuf>,
///         /// Where to listen.
///         #[arg(long)]
///         listen: Option<String> => listen,
///         /// How long to wait.
///         #[arg(long)]
///         timeout: Option<HumanDuration> => timeout,
///         /// A peer; repeat for each.
///         #[arg(long = "peer")]
///         peers: Vec<String> => peers [default: "none"],
///     }
/// }
///
/// let defaults = Config {
///     listen: "127.0.0.1:1".into(),
///     timeout: Duration::from_secs(60),
///     peers: vec![],
/// };
/// let args = ["example", "--timeout", "5s"];
/// let flags: Flags = settings::try_parse_from(Flags::command(&defaults), args)?;
/// let file: Flags = toml::from_str("listen = \"0.0.0.0:2\"\ntimeout = \"1m\"\n")?;
/// let mut config = defaults;
/// flags.over(file).apply(&mut config);
/// assert_eq!(config.listen, "0.0.0.0:2");
/// assert_eq!(config.timeout, Duration::from_secs(5));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// The argument ids are the field names (clap's default: do not set `id`), and the file keys
/// are too (name the field as the key, and give the flag its own `long` where it differs; a
/// `#[serde(alias)]` is fine): the reference finds a setting's file key by its id. A setting
/// that is a flag only is `#[serde(skip)]`.
#[macro_export]
macro_rules! settings {
    (@default $defaults:ident, $ty:ty, [$($place:tt).*], [$default:expr]) => {
        ::core::option::Option::Some(::std::string::ToString::to_string(&$default))
    };
    (@default $defaults:ident, $ty:ty, [$($place:tt).+], []) => {
        $crate::settings::Show::show(
            &<<$ty as $crate::settings::Setting>::Value as ::core::convert::From<_>>::from(
                ::core::clone::Clone::clone(&$defaults.$($place).+),
            ),
        )
    };
    (@default $defaults:ident, $ty:ty, [], []) => {
        ::core::option::Option::<::std::string::String>::None
    };
    (
        $(#[$attr:meta])*
        $vis:vis struct $name:ident: $target:ty {
            $(
                $(#[$field_attr:meta])*
                $field_vis:vis $field:ident: $ty:ty
                $(=> $($place:tt).+)?
                $([default: $default:expr])?
            ),* $(,)?
        }
    ) => {
        $(#[$attr])*
        $vis struct $name {
            $(
                $(#[$field_attr])*
                $field_vis $field: $ty,
            )*
        }

        impl $crate::settings::Layer for $name {
            fn over(self, lower: Self) -> Self {
                Self {
                    $($field: $crate::settings::Layer::over(self.$field, lower.$field),)*
                }
            }
        }

        impl $name {
            /// Writes each setting that was given, and has a place in the config, there.
            #[allow(unused_variables)]
            $vis fn apply(&self, config: &mut $target) {
                $($(
                    if let ::core::option::Option::Some(value) =
                        $crate::settings::Setting::value(&self.$field)
                    {
                        config.$($place).+ = ::core::convert::From::from(value);
                    }
                )?)*
            }

            /// Each setting's default as `--help` shows it, by argument id.
            #[allow(unused_variables)]
            $vis fn defaults(
                defaults: &$target,
            ) -> ::std::vec::Vec<(&'static str, ::std::string::String)> {
                let mut shown = ::std::vec::Vec::new();
                $(
                    if let ::core::option::Option::Some(text) = $crate::settings!(
                        @default defaults, $ty, [$($($place).+)?], [$($default)?]
                    ) {
                        shown.push((::core::stringify!($field), text));
                    }
                )*
                shown
            }

            /// The command line parser, its help showing each setting's default.
            $vis fn command(defaults: &$target) -> $crate::settings::Command {
                $crate::settings::command::<Self>(&Self::defaults(defaults))
            }
        }
    };
}

/// clap's parser, as [`settings!`](crate::settings!) builds it.
pub use clap::Command;

/// One layer of settings over another: flags over the file, the file over nothing.
pub trait Layer {
    /// `self` where it was given, else `lower`.
    #[must_use]
    fn over(self, lower: Self) -> Self;
}

/// A setting, as the library's config takes it once given.
pub trait Setting {
    /// What it holds once given.
    type Value;

    /// Its value, if it was given.
    fn value(&self) -> Option<Self::Value>;
}

impl<T> Layer for Option<T> {
    fn over(self, lower: Self) -> Self {
        self.or(lower)
    }
}

impl<T: Clone> Setting for Option<T> {
    type Value = T;

    fn value(&self) -> Option<T> {
        self.clone()
    }
}

/// A repeatable flag: given at all, the flags' list replaces the file's.
impl Layer for Vec<String> {
    fn over(self, lower: Self) -> Self {
        if self.is_empty() { lower } else { self }
    }
}

impl Setting for Vec<String> {
    type Value = Vec<String>;

    fn value(&self) -> Option<Vec<String>> {
        (!self.is_empty()).then(|| self.clone())
    }
}

/// `KEY=VALUE` flags, a table in the file: a map, the file's entries and then the flags', a
/// later key winning (see [`table`]).
impl Layer for Vec<(String, String)> {
    fn over(self, mut lower: Self) -> Self {
        lower.extend(self);
        lower
    }
}

impl Setting for Vec<(String, String)> {
    type Value = BTreeMap<String, String>;

    fn value(&self) -> Option<BTreeMap<String, String>> {
        (!self.is_empty()).then(|| self.iter().cloned().collect())
    }
}

/// A default, written as the flag takes it; `None` for what has no value to show (a switch is
/// off unless given, a list is empty).
pub trait Show {
    /// The text, if any.
    fn show(&self) -> Option<String>;
}

macro_rules! show_display {
    ($($ty:ty),*) => {
        $(impl Show for $ty {
            fn show(&self) -> Option<String> {
                Some(self.to_string())
            }
        })*
    };
}

show_display!(
    u16,
    u32,
    u64,
    usize,
    i64,
    f64,
    String,
    HumanDuration,
    ByteSize
);

impl Show for bool {
    fn show(&self) -> Option<String> {
        None
    }
}

impl Show for PathBuf {
    fn show(&self) -> Option<String> {
        Some(self.display().to_string())
    }
}

impl<T> Show for Vec<T> {
    fn show(&self) -> Option<String> {
        None
    }
}

impl<K, V> Show for BTreeMap<K, V> {
    fn show(&self) -> Option<String> {
        None
    }
}

/// For `#[serde(deserialize_with = "muster_launch::settings::table")]`: a table of strings in
/// the file, as the `KEY=VALUE` pairs its repeatable flag gives.
///
/// # Errors
/// If the value is not a table of strings.
pub fn table<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<(String, String)>, D::Error> {
    BTreeMap::<String, String>::deserialize(deserializer).map(|map| map.into_iter().collect())
}

/// `command` (as clap derives it), each argument named in `defaults` showing its default at
/// the end of its help, `[default: TEXT]`, as clap shows its own.
///
/// # Panics
/// In debug builds (tests), if a default names no argument.
pub fn with_defaults(command: Command, defaults: &[(&'static str, String)]) -> Command {
    debug_assert!(
        defaults
            .iter()
            .all(|(id, _)| command.get_arguments().any(|arg| arg.get_id() == *id)),
        "a default for an argument {} lacks: {defaults:?}",
        command.get_name()
    );
    command.mut_args(|arg| {
        let Some((_, text)) = defaults.iter().find(|(id, _)| arg.get_id() == *id) else {
            return arg;
        };
        let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
        let long_help = arg.get_long_help().map(ToString::to_string);
        let arg = arg.help(format!("{help} [default: {text}]"));
        match long_help {
            Some(long) => arg.long_help(format!("{long} [default: {text}]")),
            None => arg,
        }
    })
}

/// The parser of `S`, its help showing `defaults` (see [`with_defaults`]).
pub fn command<S: CommandFactory>(defaults: &[(&'static str, String)]) -> Command {
    with_defaults(S::command(), defaults)
}

/// Parses this process's arguments with `command`; prints the help, the version or the error
/// and exits as clap does.
///
/// Every program gains `--generate KIND`, which prints its man page or its completions for a
/// shell from `command` and exits (see `generate`).
pub fn parse<S: FromArgMatches>(command: Command) -> S {
    let mut command = generate::with_generate(command);
    let mut matches = command.get_matches_mut();
    if let Some(kind) = matches.get_one::<String>(generate::GENERATE) {
        let mut out = std::io::stdout().lock();
        let written = generate::generate(&command, kind, &mut out).and_then(|()| out.flush());
        match written {
            // The reader went away (`--generate man | head`): what it wanted, it has.
            Err(error) if error.kind() != std::io::ErrorKind::BrokenPipe => {
                eprintln!("{}: --generate {kind}: {error}", command.get_name());
                std::process::exit(1);
            }
            _ => std::process::exit(0),
        }
    }
    S::from_arg_matches_mut(&mut matches).unwrap_or_else(|error| error.format(&mut command).exit())
}

/// Parses `args` (the program's name first) with `command`.
///
/// # Errors
/// clap's, for arguments it refuses (and for `--help` and `--version`).
pub fn try_parse_from<S, I, T>(mut command: Command, args: I) -> Result<S, clap::Error>
where
    S: FromArgMatches,
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let mut matches = command.try_get_matches_from_mut(args)?;
    S::from_arg_matches_mut(&mut matches).map_err(|error| error.format(&mut command))
}

/// `flags` over the TOML file at `path` (the same settings, keyed by their names; none: the
/// flags alone).
///
/// # Errors
/// If the file cannot be read, or is not TOML, or has a key that is no setting, or a value of
/// the wrong kind (the error names the file, and the key with its line).
pub fn over_file<S>(flags: S, path: Option<&Path>) -> anyhow::Result<S>
where
    S: Layer + DeserializeOwned + Default,
{
    let Some(path) = path else {
        return Ok(flags.over(S::default()));
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the config file {}", path.display()))?;
    let file: S =
        toml::from_str(&text).with_context(|| format!("bad config file {}", path.display()))?;
    Ok(flags.over(file))
}

#[cfg(test)]
mod tests;
