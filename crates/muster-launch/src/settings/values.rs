//! The kinds of value a setting takes as people write them, in a flag and in the config file
//! alike: durations ([`HumanDuration`], `10s`) and sizes ([`ByteSize`], `10MiB`).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

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
