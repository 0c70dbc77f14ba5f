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

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::{ArgAction, CommandFactory, FromArgMatches};
use serde::Deserialize;
use serde::de::{self, DeserializeOwned, Deserializer, Visitor};

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

/// A duration as people write it, `10s`, `5m`, `1h 30m` (humantime), in a flag and in the
/// config file (a string there).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HumanDuration(pub Duration);

impl FromStr for HumanDuration {
    type Err = humantime::DurationError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        humantime::parse_duration(text).map(HumanDuration)
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        humantime::format_duration(self.0).fmt(f)
    }
}

impl From<Duration> for HumanDuration {
    fn from(duration: Duration) -> Self {
        HumanDuration(duration)
    }
}

impl From<HumanDuration> for Duration {
    fn from(duration: HumanDuration) -> Self {
        duration.0
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(|error| {
            de::Error::custom(format!(
                "{text:?} is not a duration (such as 10s, 5m or 1h 30m): {error}"
            ))
        })
    }
}

/// A number of bytes: in a flag, digits with an optional unit, `B`, `KiB`, `MiB` or `GiB`
/// (`K`, `M`, `G` for short; any case), as in `10MiB`; in the config file, the same text or a
/// plain number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

impl FromStr for ByteSize {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let digits = text
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len());
        let (number, unit) = text.split_at(digits);
        let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kib" => 1 << 10,
            "m" | "mib" => 1 << 20,
            "g" | "gib" => 1 << 30,
            _ => {
                return Err(format!(
                    "{text:?} is not a size: expected a number of bytes, optionally with a unit \
                     (B, KiB, MiB, GiB), such as 10MiB"
                ));
            }
        };
        let number: u64 = number.parse().map_err(|_| {
            format!("{text:?} is not a size: expected a number of bytes, such as 10485760 or 10MiB")
        })?;
        number
            .checked_mul(multiplier)
            .map(ByteSize)
            .ok_or_else(|| format!("{text:?} is too large a size"))
    }
}

impl fmt::Display for ByteSize {
    /// In the largest binary unit that divides it: `10MiB`, `1536KiB`, `1000` (bytes).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = self.0;
        for (unit, shift) in [("GiB", 30), ("MiB", 20), ("KiB", 10)] {
            if bytes != 0 && bytes.trailing_zeros() >= shift {
                return write!(f, "{}{unit}", bytes >> shift);
            }
        }
        write!(f, "{bytes}")
    }
}

impl From<u64> for ByteSize {
    fn from(bytes: u64) -> Self {
        ByteSize(bytes)
    }
}

impl From<ByteSize> for u64 {
    fn from(size: ByteSize) -> Self {
        size.0
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        /// A number, or text as the flag takes it.
        struct SizeVisitor;

        impl Visitor<'_> for SizeVisitor {
            type Value = ByteSize;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number of bytes, or a size such as \"10MiB\"")
            }

            fn visit_u64<E: de::Error>(self, bytes: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(bytes))
            }

            fn visit_i64<E: de::Error>(self, bytes: i64) -> Result<ByteSize, E> {
                u64::try_from(bytes)
                    .map(ByteSize)
                    .map_err(|_| E::custom(format!("{bytes} is not a size: it is negative")))
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<ByteSize, E> {
                text.parse().map_err(E::custom)
            }
        }

        deserializer.deserialize_any(SizeVisitor)
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
pub fn parse<S: FromArgMatches>(mut command: Command) -> S {
    let mut matches = command.get_matches_mut();
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

/// The keys serde reads a struct `T` from, aliases included, in order; empty if `T` is no
/// struct. The reference takes the file keys from here, so that it shows what the file takes.
pub fn keys_of<T: DeserializeOwned>() -> &'static [&'static str] {
    /// Records the fields a struct asks for, then stops it.
    struct Keys(&'static [&'static str]);

    /// Why [`Keys`] stops: it is no real input.
    #[derive(Debug)]
    struct Stop;

    impl fmt::Display for Stop {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("only the keys are read")
        }
    }

    impl std::error::Error for Stop {}

    impl de::Error for Stop {
        fn custom<M: fmt::Display>(_: M) -> Self {
            Stop
        }
    }

    impl<'de> Deserializer<'de> for &mut Keys {
        type Error = Stop;

        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
            Err(Stop)
        }

        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Stop> {
            self.0 = fields;
            Err(Stop)
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
            identifier ignored_any
        }
    }

    let mut keys = Keys(&[]);
    let _ = T::deserialize(&mut keys);
    keys.0
}

/// The reference of `command`'s settings, in Markdown: its about, then a table of each flag,
/// its key in the config file, its default and what it sets, all as `--help` shows them (the
/// default is split from the end of the help). Keys are those serde reads `S` from; `tables`
/// are its nested tables, each a name and its keys: an argument whose id is a key, or the
/// table's name, `_` and a key, is `table.key`. One that has no key is a flag only.
pub fn reference<S: DeserializeOwned>(command: &Command, tables: &[(&str, &[&str])]) -> String {
    let keys = keys_of::<S>();
    let mut command = command.clone();
    command.build();
    let mut out = format!("## `{}`\n\n", command.get_name());
    if let Some(about) = command.get_about() {
        let about = about.to_string();
        out.push_str(&escape(&about));
        // clap drops the full stop of a one-line doc comment.
        if !about.ends_with(['.', '!', '?', ')']) {
            out.push('.');
        }
        out.push_str("\n\n");
    }
    out.push_str("| flag | config file key | default | what it sets |\n|---|---|---|---|\n");
    for arg in command.get_arguments() {
        let id = arg.get_id().as_str();
        let Some(long) = arg.get_long() else {
            continue;
        };
        if arg.is_hide_set() || matches!(id, "help" | "version") {
            continue;
        }
        let takes_value = arg.get_action().takes_values()
            && arg
                .get_num_args()
                .is_none_or(|range| range.max_values() > 0);
        let mut flag = format!("`--{long}");
        if takes_value {
            let names = arg
                .get_value_names()
                .map(|names| names.iter().map(ToString::to_string).collect::<Vec<_>>())
                .unwrap_or_else(|| vec![id.to_uppercase()]);
            flag.push_str(&format!(" <{}>`", names.join("> <")));
        } else {
            flag.push('`');
        }
        if matches!(arg.get_action(), ArgAction::Append) {
            flag.push_str(", repeatable");
        }
        let key = file_key(id, keys, tables)
            .map_or_else(|| "none: a flag only".to_owned(), |key| format!("`{key}`"));
        let help = arg
            .get_long_help()
            .or_else(|| arg.get_help())
            .map(ToString::to_string)
            .unwrap_or_default();
        let (what, default) = split_default(&help);
        let default = match default {
            None => String::new(),
            Some(text) if text.contains(char::is_whitespace) => escape(text),
            Some(text) => format!("`{text}`"),
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            flag.replace('|', "\\|"),
            key,
            default,
            escape(what)
        ));
    }
    out
}

/// The file key of the argument `id`: itself, or in one of `tables` (see [`reference`]).
fn file_key(id: &str, keys: &[&str], tables: &[(&str, &[&str])]) -> Option<String> {
    if keys.contains(&id) {
        return Some(id.to_owned());
    }
    tables.iter().find_map(|(table, keys)| {
        let key = id
            .strip_prefix(table)
            .and_then(|rest| rest.strip_prefix('_'))
            .filter(|key| keys.contains(key))
            .or_else(|| keys.contains(&id).then_some(id))?;
        Some(format!("{table}.{key}"))
    })
}

/// A help text without its trailing `[default: …]`, and that default.
fn split_default(help: &str) -> (&str, Option<&str>) {
    help.strip_suffix(']')
        .and_then(|rest| rest.rsplit_once("[default: "))
        .map_or((help.trim(), None), |(what, default)| {
            (what.trim(), Some(default.trim()))
        })
}

/// Text for a Markdown table cell: `|` escaped, and `<` outside code spans (it would start an
/// HTML tag); line breaks become spaces.
fn escape(text: &str) -> String {
    text.split('`')
        .enumerate()
        .map(|(i, part)| {
            let part = part.replace('|', "\\|").replace('\n', " ");
            if i % 2 == 0 {
                part.replace('<', "&lt;")
            } else {
                part
            }
        })
        .collect::<Vec<_>>()
        .join("`")
}

/// Checks that the section `section` of the Markdown file at `path` (the lines between
/// `<!-- begin SECTION -->` and `<!-- end SECTION -->`) is `text`; or, when the variable
/// `MUSTER_BLESS` is `1`, writes it there (adding the section at the end if the file lacks
/// it, creating the file if need be).
///
/// # Errors
/// The section differs or is missing (naming the first line that differs, and how to write
/// it anew), or the file cannot be read or written.
pub fn check_reference(path: &Path, section: &str, text: &str) -> anyhow::Result<()> {
    let bless = std::env::var_os("MUSTER_BLESS").is_some_and(|value| value == "1");
    let current = match std::fs::read_to_string(path) {
        Ok(current) => current,
        Err(error) if bless && error.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(error) => {
            return Err(error).with_context(|| format!("cannot read {}", path.display()));
        }
    };
    if bless {
        let blessed = splice(&current, section, text);
        if blessed != current {
            std::fs::write(path, blessed)
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
        return Ok(());
    }
    let hint = "write it anew with MUSTER_BLESS=1 and the same test";
    let Some((inner, stop)) = find_section(&current, section) else {
        bail!("{} has no section {section}: {hint}", path.display());
    };
    let written = &current[inner..stop];
    if written != text {
        let line = written
            .lines()
            .zip(text.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| written.lines().count().min(text.lines().count()));
        bail!(
            "the section {section} of {} is out of date (from its line {}: it has {:?}, --help \
             gives {:?}): {hint}",
            path.display(),
            line + 1,
            written.lines().nth(line).unwrap_or(""),
            text.lines().nth(line).unwrap_or(""),
        );
    }
    Ok(())
}

/// Where the lines of `section` are in `text`: from after its begin marker to its end marker.
fn find_section(text: &str, section: &str) -> Option<(usize, usize)> {
    let begin = format!("<!-- begin {section} -->\n");
    let end = format!("<!-- end {section} -->\n");
    let inner = text.find(&begin)? + begin.len();
    let stop = inner + text[inner..].find(&end)?;
    Some((inner, stop))
}

/// `current` with the lines of `section` replaced by `text`, or with the section added at the
/// end.
fn splice(current: &str, section: &str, text: &str) -> String {
    match find_section(current, section) {
        Some((inner, stop)) => format!("{}{text}{}", &current[..inner], &current[stop..]),
        None => {
            let before = current.trim_end_matches('\n');
            let gap = if before.is_empty() { "" } else { "\n\n" };
            format!("{before}{gap}<!-- begin {section} -->\n{text}<!-- end {section} -->\n")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_bytes_or_binary_units_and_name_bad_text() {
        let size = |text: &str| text.parse::<ByteSize>().map(u64::from);
        assert_eq!(size("4096"), Ok(4096));
        assert_eq!(size("512KiB"), Ok(512 * 1024));
        assert_eq!(size("10MiB"), Ok(10 * 1024 * 1024));
        assert_eq!(size("10m"), Ok(10 * 1024 * 1024));
        assert_eq!(size("1 GiB"), Ok(1024 * 1024 * 1024));
        assert_eq!(size("7B"), Ok(7));
        for bad in ["", "MiB", "10MB", "ten", "-1", "99999999999999999999GiB"] {
            let Err(error) = size(bad) else {
                panic!("{bad:?} parsed as a size");
            };
            assert!(error.contains(&format!("{bad:?}")), "{error}");
        }
    }

    #[test]
    fn sizes_and_durations_show_as_they_are_written() {
        assert_eq!(ByteSize(10 << 20).to_string(), "10MiB");
        assert_eq!(ByteSize(1536 << 10).to_string(), "1536KiB");
        assert_eq!(ByteSize(1000).to_string(), "1000");
        assert_eq!(ByteSize(0).to_string(), "0");
        assert_eq!(HumanDuration(Duration::from_secs(300)).to_string(), "5m");
        assert_eq!(
            HumanDuration(Duration::from_millis(250)).to_string(),
            "250ms"
        );
        for size in [ByteSize(10 << 20), ByteSize(1000), ByteSize(3 << 30)] {
            assert_eq!(size.to_string().parse::<ByteSize>(), Ok(size));
        }
    }

    /// Settings of a test program.
    #[derive(Debug, Default, Deserialize, clap::Parser)]
    #[serde(default, deny_unknown_fields)]
    struct Test {
        /// How long.
        #[arg(long)]
        wait: Option<HumanDuration>,
        /// How much.
        #[arg(long)]
        size: Option<ByteSize>,
        /// Pairs.
        #[arg(long = "pair", value_parser = pair)]
        #[serde(deserialize_with = "table")]
        pairs: Vec<(String, String)>,
        /// A list.
        #[arg(long = "item")]
        items: Vec<String>,
        /// Not in the file.
        #[arg(long, num_args = 0, default_missing_value = "true")]
        #[serde(skip)]
        switch: Option<bool>,
        /// A table.
        #[command(flatten)]
        tls: crate::security::TlsFlags,
    }

    impl Layer for Test {
        fn over(self, lower: Self) -> Self {
            Test {
                wait: self.wait.over(lower.wait),
                size: self.size.over(lower.size),
                pairs: self.pairs.over(lower.pairs),
                items: self.items.over(lower.items),
                switch: self.switch.over(lower.switch),
                tls: self.tls.over(lower.tls),
            }
        }
    }

    fn pair(text: &str) -> Result<(String, String), String> {
        text.split_once('=')
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .ok_or_else(|| format!("{text:?} is no pair"))
    }

    #[test]
    fn the_file_takes_what_the_flags_take_and_flags_win() -> anyhow::Result<()> {
        let file: Test = toml::from_str(
            "wait = \"1m\"\nsize = 2048\nitems = [\"a\"]\n[pairs]\nx = \"1\"\ny = \"2\"\n\
             [tls]\ncluster = \"c\"\ninsecure = true\n",
        )?;
        let flags: Test = try_parse_from(
            Test::command(),
            ["test", "--size", "1KiB", "--pair", "y=3", "--switch"],
        )?;
        let merged = flags.over(file);
        assert_eq!(merged.wait, Some(HumanDuration(Duration::from_secs(60))));
        assert_eq!(merged.size, Some(ByteSize(1024)));
        assert_eq!(merged.items, ["a"]);
        assert_eq!(
            merged.pairs.value(),
            Some(BTreeMap::from([
                ("x".to_owned(), "1".to_owned()),
                ("y".to_owned(), "3".to_owned())
            ]))
        );
        assert_eq!(merged.switch, Some(true));
        assert_eq!(merged.tls.cluster.as_deref(), Some("c"));
        assert!(merged.tls.insecure);

        let flags: Test = try_parse_from(Test::command(), ["test", "--item", "b"])?;
        assert_eq!(flags.over(Test::default()).items, ["b"]);
        Ok(())
    }

    #[test]
    fn bad_values_in_the_file_name_the_key() {
        for (text, parts) in [
            ("wait = \"soon\"\n", ["wait", "\"soon\" is not a duration"]),
            ("size = \"lots\"\n", ["size", "\"lots\" is not a size"]),
            ("size = -1\n", ["size", "negative"]),
            ("switch = true\n", ["switch", "unknown field"]),
            ("[tls]\nca_file = \"x\"\n", ["ca_file", "unknown field"]),
        ] {
            let Err(error) = toml::from_str::<Test>(text) else {
                panic!("{text:?} was read");
            };
            let error = error.to_string();
            for part in parts {
                assert!(error.contains(part), "{text:?}: {error}");
            }
        }
    }

    #[test]
    fn the_reference_shows_keys_defaults_and_help() {
        let command = with_defaults(
            Test::command(),
            &[
                ("wait", "5m".to_owned()),
                ("items", "none at all".to_owned()),
            ],
        );
        let reference =
            reference::<Test>(&command, &[("tls", keys_of::<crate::security::TlsFlags>())]);
        for row in [
            "| `--wait <WAIT>` | `wait` | `5m` | How long |",
            "| `--item <ITEMS>`, repeatable | `items` | none at all | A list |",
            "| `--pair <PAIRS>`, repeatable | `pairs` |  | Pairs |",
            "| `--switch` | none: a flag only |  | Not in the file |",
            "| `--tls-ca <FILE>` | `tls.ca` |",
            "| `--cluster <CLUSTER>` | `tls.cluster` | `global` |",
            "| `--insecure` | `tls.insecure` |  |",
        ] {
            assert!(reference.contains(row), "{row}\n{reference}");
        }
        assert!(!reference.contains("--help"), "{reference}");
    }

    #[test]
    fn defaults_end_the_help() -> anyhow::Result<()> {
        let command = command::<Test>(&[("wait", "5m".to_owned())]);
        let help = command.clone().render_help().to_string();
        assert!(help.contains("How long [default: 5m]"), "{help}");
        let Err(error) = try_parse_from::<Test, _, _>(command, ["test", "--wait", "soon"]) else {
            bail!("a bad duration was parsed");
        };
        assert!(error.to_string().contains("--wait"), "{error}");
        Ok(())
    }

    #[test]
    fn a_section_is_checked_and_blessed() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("reference.md");
        std::fs::write(
            &path,
            "# Intro\n\n<!-- begin one -->\nold\n<!-- end one -->\nafter\n",
        )?;
        check_reference(&path, "one", "old\n")?;
        let error = check_reference(&path, "one", "new\n").err();
        let error = error.map(|e| e.to_string()).unwrap_or_default();
        assert!(
            error.contains("MUSTER_BLESS=1") && error.contains("line 1"),
            "{error}"
        );
        assert!(check_reference(&path, "two", "x\n").is_err());
        let current = std::fs::read_to_string(&path)?;
        assert_eq!(
            splice(&current, "one", "new\n"),
            "# Intro\n\n<!-- begin one -->\nnew\n<!-- end one -->\nafter\n"
        );
        assert_eq!(
            splice(&current, "two", "x\n"),
            format!("{}\n<!-- begin two -->\nx\n<!-- end two -->\n", current)
        );
        assert_eq!(
            splice("", "two", "x\n"),
            "<!-- begin two -->\nx\n<!-- end two -->\n"
        );
        Ok(())
    }
}
