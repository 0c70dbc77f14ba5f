//! Where a group's tasks may run and where they would rather run (Nomad's `constraint`,
//! `affinity` and `spread` blocks).
//!
//! A [`Constraint`] is a hard condition on an agent's attributes: an agent it does not admit
//! is never a candidate. [`ConstraintOp::DistinctHosts`] is the one constraint on an agent's
//! tasks rather than its attributes: the scheduler keeps two tasks of the group off one
//! agent. An [`Affinity`] is a soft one, with a weight: agents that match rank higher (or
//! lower, for a negative weight). A [`Spread`] ranks agents by how far the group's tasks
//! already on agents with the same value of an attribute fall short of that value's share.
//!
//! The matching rules live here, so that the schedulers, the blocked-queue and the convergence
//! check read one definition. Patterns and version requirements are compiled once per process
//! and kept in a small cache ([`Constraint::admits`] is called for every agent a slot looks
//! at).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use serde::{Deserialize, Serialize};

/// How a constraint or an affinity compares an agent attribute with its value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ConstraintOp {
    /// The attribute equals the value.
    Equal,
    /// The attribute is absent or differs from the value.
    NotEqual,
    /// The attribute matches the value, a regular expression (Rust's `regex` syntax; not
    /// anchored: `^` and `$` anchor it).
    Regexp,
    /// The attribute, read as a version (`1.2`, `v1.2.3`, `5.15.0-91-generic`: its leading
    /// numbers), meets the value, a requirement such as `>= 1.2, < 2`; a bare version means
    /// `=`.
    Version,
    /// The attribute, a comma-separated list, holds every item of the value's list.
    SetContains,
    /// The agent has the attribute (the value is empty).
    IsSet,
    /// The agent does not have the attribute (the value is empty).
    IsNotSet,
    /// No two tasks of the group on one agent (no attribute; the value is empty, `true` or
    /// `false`, which turns it off).
    DistinctHosts,
}

impl ConstraintOp {
    /// Every operator, in a fixed order.
    pub const ALL: [ConstraintOp; 8] = [
        ConstraintOp::Equal,
        ConstraintOp::NotEqual,
        ConstraintOp::Regexp,
        ConstraintOp::Version,
        ConstraintOp::SetContains,
        ConstraintOp::IsSet,
        ConstraintOp::IsNotSet,
        ConstraintOp::DistinctHosts,
    ];

    /// The word job files use (`=`, `regexp`, `distinct_hosts`).
    pub fn name(self) -> &'static str {
        match self {
            ConstraintOp::Equal => "=",
            ConstraintOp::NotEqual => "!=",
            ConstraintOp::Regexp => "regexp",
            ConstraintOp::Version => "version",
            ConstraintOp::SetContains => "set_contains",
            ConstraintOp::IsSet => "is_set",
            ConstraintOp::IsNotSet => "is_not_set",
            ConstraintOp::DistinctHosts => "distinct_hosts",
        }
    }

    /// The operator a job file's word names (`==` is `=` too), if any.
    pub fn from_name(word: &str) -> Option<ConstraintOp> {
        match word {
            "==" => Some(ConstraintOp::Equal),
            word => ConstraintOp::ALL.into_iter().find(|op| op.name() == word),
        }
    }
}

/// A condition on the agents a task group's tasks may run on.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Constraint {
    /// The attribute's name (`rack`); empty for [`ConstraintOp::DistinctHosts`].
    pub attribute: String,
    /// How to compare.
    pub op: ConstraintOp,
    /// The value to compare with.
    pub value: String,
}

impl Constraint {
    /// Whether an agent with `attributes` meets this constraint. A
    /// [`DistinctHosts`](ConstraintOp::DistinctHosts) constraint admits every agent here: it is
    /// about the agent's tasks, which the scheduler checks ([`Constraint::is_distinct_hosts`]).
    pub fn admits(&self, attributes: &BTreeMap<String, String>) -> bool {
        self.op == ConstraintOp::DistinctHosts
            || matches(
                self.op,
                attributes.get(&self.attribute).map(String::as_str),
                &self.value,
            )
    }

    /// Whether every one of `constraints` admits `attributes`.
    pub fn all_admit(constraints: &[Constraint], attributes: &BTreeMap<String, String>) -> bool {
        constraints.iter().all(|c| c.admits(attributes))
    }

    /// Whether this constraint keeps the group's tasks on distinct agents.
    pub fn is_distinct_hosts(&self) -> bool {
        self.op == ConstraintOp::DistinctHosts && self.value != "false"
    }

    /// Whether any of `constraints` keeps the group's tasks on distinct agents.
    pub fn any_distinct_hosts(constraints: &[Constraint]) -> bool {
        constraints.iter().any(Constraint::is_distinct_hosts)
    }

    /// Checks that the value suits the operator: a pattern that compiles, a requirement that
    /// parses, a non-empty list, an empty value where none is read.
    ///
    /// # Errors
    /// What is wrong, and with which part (`attribute` or `value`) as the first word.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        check_comparison(self.op, &self.attribute, &self.value, true)
    }
}

/// A soft condition on an agent's attributes (Nomad's `affinity`): among the agents a task
/// fits on, those that match rank higher for a positive weight and lower for a negative one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Affinity {
    /// The attribute's name (`zone`).
    pub attribute: String,
    /// How to compare (any operator but [`ConstraintOp::DistinctHosts`]).
    pub op: ConstraintOp,
    /// The value to compare with.
    pub value: String,
    /// How much it counts, from -100 to 100, not 0.
    pub weight: i8,
}

impl Affinity {
    /// Whether an agent with `attributes` matches.
    pub fn matches(&self, attributes: &BTreeMap<String, String>) -> bool {
        matches(
            self.op,
            attributes.get(&self.attribute).map(String::as_str),
            &self.value,
        )
    }

    /// Checks the operator, the value and the weight.
    ///
    /// # Errors
    /// What is wrong, and with which part (`attribute`, `value` or `weight`) as the first word.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if self.weight == 0 || !(-100..=100).contains(&self.weight) {
            return Err((
                "weight",
                format!("{} is not within -100..=100 or is 0", self.weight),
            ));
        }
        check_comparison(self.op, &self.attribute, &self.value, false)
    }
}

/// The weight of a [`Spread`] that names none (Nomad's default).
pub const DEFAULT_SPREAD_WEIGHT: u8 = 50;

/// Spreads a group's tasks over the values of an attribute (Nomad's `spread`): each value's
/// share of the group's count is its target's percentage, or with no targets an even share
/// of the values seen; agents whose value is furthest below its share rank highest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spread {
    /// The attribute's name (`zone`).
    pub attribute: String,
    /// How much it counts against the group's other spreads and affinities, 1 to 100.
    pub weight: u8,
    /// Each value's share; the values not listed share what is left of 100 %. Empty: even.
    pub targets: Vec<SpreadTarget>,
}

/// One value's share of a [`Spread`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpreadTarget {
    /// The attribute's value (`us-east-1a`).
    pub value: String,
    /// Its share of the group's tasks, in percent.
    pub percent: u8,
}

impl Spread {
    /// Checks the attribute, the weight and the targets: distinct values whose percentages
    /// add up to at most 100.
    ///
    /// # Errors
    /// What is wrong, and with which part (`attribute`, `weight` or `targets`) as the first
    /// word.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if self.attribute.is_empty() {
            return Err(("attribute", "must name an attribute".into()));
        }
        if !(1..=100).contains(&self.weight) {
            return Err(("weight", format!("{} is not within 1..=100", self.weight)));
        }
        let mut values = BTreeSet::new();
        let mut total = 0u32;
        for target in &self.targets {
            if !values.insert(target.value.as_str()) {
                return Err((
                    "targets",
                    format!("the value {:?} is listed twice", target.value),
                ));
            }
            total += u32::from(target.percent);
        }
        if total > 100 {
            return Err((
                "targets",
                format!("the targets' percentages add up to {total}, more than 100"),
            ));
        }
        Ok(())
    }

    /// The share of the group's tasks that agents with `value` should hold, in percent, and
    /// whether `value` is one the targets list (those not listed share the rest of 100 %).
    /// `None` with no targets: an even share of the values seen.
    pub fn target_percent(&self, value: &str) -> Option<(u32, bool)> {
        if self.targets.is_empty() {
            return None;
        }
        match self.targets.iter().find(|t| t.value == value) {
            Some(target) => Some((u32::from(target.percent), true)),
            None => {
                let listed: u32 = self.targets.iter().map(|t| u32::from(t.percent)).sum();
                Some((100u32.saturating_sub(listed), false))
            }
        }
    }
}

/// The most bytes a compiled pattern may take: a pattern that would take more is refused
/// when the job is submitted, and admits no agent if it ever reaches a scheduler.
const REGEX_SIZE_LIMIT: usize = 1 << 20;

fn check_comparison(
    op: ConstraintOp,
    attribute: &str,
    value: &str,
    distinct_hosts_allowed: bool,
) -> Result<(), (&'static str, String)> {
    if op == ConstraintOp::DistinctHosts {
        if !distinct_hosts_allowed {
            return Err((
                "operator",
                "distinct_hosts is a constraint, not an affinity".into(),
            ));
        }
        if !attribute.is_empty() {
            return Err(("attribute", "distinct_hosts takes no attribute".into()));
        }
        if !matches!(value, "" | "true" | "false") {
            return Err((
                "value",
                format!("distinct_hosts takes true, false or nothing, not {value:?}"),
            ));
        }
        return Ok(());
    }
    if attribute.is_empty() {
        return Err(("attribute", "must name an attribute".into()));
    }
    match op {
        ConstraintOp::Regexp => compile_regex(value).map(drop).map_err(|e| ("value", e)),
        ConstraintOp::Version => version_requirement(value)
            .map(drop)
            .map_err(|e| ("value", e)),
        ConstraintOp::SetContains if set_items(value).next().is_none() => Err((
            "value",
            "set_contains needs a comma-separated list of at least one item".into(),
        )),
        ConstraintOp::IsSet | ConstraintOp::IsNotSet if !value.is_empty() => Err((
            "value",
            format!("{} takes no value, not {value:?}", op.name()),
        )),
        _ => Ok(()),
    }
}

/// Whether an attribute's value (`None`: the agent lacks it) meets `op` with `value`.
fn matches(op: ConstraintOp, actual: Option<&str>, value: &str) -> bool {
    match op {
        ConstraintOp::Equal => actual == Some(value),
        ConstraintOp::NotEqual => actual != Some(value),
        ConstraintOp::IsSet => actual.is_some(),
        ConstraintOp::IsNotSet => actual.is_none(),
        ConstraintOp::DistinctHosts => true,
        ConstraintOp::Regexp => {
            actual.is_some_and(|actual| compiled_regex(value).is_some_and(|re| re.is_match(actual)))
        }
        ConstraintOp::Version => actual.and_then(leading_version).is_some_and(|version| {
            compiled_version(value).is_some_and(|req| req.matches(&version))
        }),
        ConstraintOp::SetContains => actual.is_some_and(|actual| {
            let held: BTreeSet<&str> = set_items(actual).collect();
            set_items(value).all(|item| held.contains(item))
        }),
    }
}

fn set_items(list: &str) -> impl Iterator<Item = &str> {
    list.split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
}

/// The version an attribute names: its leading dotted numbers (`v1.2` is 1.2.0,
/// `5.15.0-91-generic` is 5.15.0), whatever follows them.
fn leading_version(text: &str) -> Option<semver::Version> {
    let text = text.trim().trim_start_matches(['v', 'V']);
    let mut numbers = [0u64; 3];
    let mut parts = 0;
    for part in text.split('.') {
        let digits = part.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || parts == 3 {
            break;
        }
        numbers[parts] = part[..digits].parse().ok()?;
        parts += 1;
        if digits < part.len() {
            break;
        }
    }
    (parts > 0).then(|| semver::Version::new(numbers[0], numbers[1], numbers[2]))
}

/// Parses a requirement: comparators separated by commas, a bare version meaning `=`.
fn version_requirement(text: &str) -> Result<semver::VersionReq, String> {
    let normalized: Vec<String> = text
        .split(',')
        .map(str::trim)
        .map(|part| {
            if part.starts_with(|c: char| c.is_ascii_digit()) {
                format!("={part}")
            } else {
                part.to_owned()
            }
        })
        .collect();
    semver::VersionReq::parse(&normalized.join(", "))
        .map_err(|e| format!("{text:?} is not a version requirement such as \">= 1.2, < 2\": {e}"))
}

fn compile_regex(pattern: &str) -> Result<regex::Regex, String> {
    regex::RegexBuilder::new(pattern)
        .size_limit(REGEX_SIZE_LIMIT)
        .build()
        .map_err(|e| format!("{pattern:?} is not a regular expression this cluster takes: {e}"))
}

/// How many compiled values each cache keeps before it starts again.
const CACHE_ENTRIES: usize = 512;

/// Compiled values by their text; `None` for a text that does not compile.
type Cache<T> = Mutex<HashMap<String, Option<Arc<T>>>>;

/// The compiled form of `text` from `cache`, compiled by `compile` the first time: a lookup
/// by the text itself, which allocates only on a miss.
fn cached<T>(
    cache: &Cache<T>,
    text: &str,
    compile: impl FnOnce(&str) -> Option<T>,
) -> Option<Arc<T>> {
    let mut cache = cache
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(found) = cache.get(text) {
        return found.clone();
    }
    if cache.len() >= CACHE_ENTRIES {
        cache.clear();
    }
    let made = compile(text).map(Arc::new);
    cache.insert(text.to_owned(), made.clone());
    made
}

fn compiled_regex(pattern: &str) -> Option<Arc<regex::Regex>> {
    static REGEXES: OnceLock<Cache<regex::Regex>> = OnceLock::new();
    let cache = REGEXES.get_or_init(|| Mutex::new(HashMap::new()));
    cached(cache, pattern, |p| compile_regex(p).ok())
}

fn compiled_version(requirement: &str) -> Option<Arc<semver::VersionReq>> {
    static VERSIONS: OnceLock<Cache<semver::VersionReq>> = OnceLock::new();
    let cache = VERSIONS.get_or_init(|| Mutex::new(HashMap::new()));
    cached(cache, requirement, |r| version_requirement(r).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn on(attribute: &str, op: ConstraintOp, value: &str) -> Constraint {
        Constraint {
            attribute: attribute.into(),
            op,
            value: value.into(),
        }
    }

    #[test]
    fn each_operator_admits_what_it_says() {
        let a = agent(&[
            ("rack", "r1"),
            ("kernel", "5.15.0-91-generic"),
            ("features", "avx2, sse4, gpu"),
        ]);
        let cases = [
            (on("rack", ConstraintOp::Equal, "r1"), true),
            (on("rack", ConstraintOp::Equal, "r2"), false),
            (on("rack", ConstraintOp::NotEqual, "r2"), true),
            (on("zone", ConstraintOp::NotEqual, "z1"), true),
            (on("rack", ConstraintOp::Regexp, "^r[0-9]$"), true),
            (on("rack", ConstraintOp::Regexp, "^x"), false),
            (on("zone", ConstraintOp::Regexp, ".*"), false),
            (on("kernel", ConstraintOp::Version, ">= 5.10, < 6"), true),
            (on("kernel", ConstraintOp::Version, ">= 6"), false),
            (on("kernel", ConstraintOp::Version, "5.15.0"), true),
            (on("rack", ConstraintOp::Version, ">= 1"), false),
            (on("features", ConstraintOp::SetContains, "gpu,avx2"), true),
            (
                on("features", ConstraintOp::SetContains, "gpu,avx512"),
                false,
            ),
            (on("rack", ConstraintOp::IsSet, ""), true),
            (on("zone", ConstraintOp::IsSet, ""), false),
            (on("zone", ConstraintOp::IsNotSet, ""), true),
            (on("rack", ConstraintOp::IsNotSet, ""), false),
            (on("", ConstraintOp::DistinctHosts, ""), true),
        ];
        for (constraint, admitted) in cases {
            assert_eq!(constraint.admits(&a), admitted, "{constraint:?}");
            assert!(constraint.check().is_ok(), "{constraint:?}");
        }
    }

    #[test]
    fn versions_are_read_leniently_and_requirements_strictly() {
        assert_eq!(leading_version("v1.2"), Some(semver::Version::new(1, 2, 0)));
        assert_eq!(leading_version("10"), Some(semver::Version::new(10, 0, 0)));
        assert_eq!(
            leading_version("1.2.3.4"),
            Some(semver::Version::new(1, 2, 3))
        );
        assert_eq!(leading_version("latest"), None);
        let error = on("v", ConstraintOp::Version, ">= one")
            .check()
            .unwrap_err();
        assert_eq!(error.0, "value");
        assert!(error.1.contains("version requirement"), "{}", error.1);
    }

    #[test]
    fn a_value_that_does_not_suit_its_operator_is_refused_by_name() {
        let refused = [
            (on("rack", ConstraintOp::Regexp, "(unclosed"), "value"),
            (on("rack", ConstraintOp::SetContains, " , "), "value"),
            (on("rack", ConstraintOp::IsSet, "yes"), "value"),
            (on("rack", ConstraintOp::DistinctHosts, ""), "attribute"),
            (on("", ConstraintOp::DistinctHosts, "maybe"), "value"),
            (on("", ConstraintOp::Equal, "r1"), "attribute"),
            (
                on("rack", ConstraintOp::Regexp, "a{100000}{100000}"),
                "value",
            ),
        ];
        for (constraint, part) in refused {
            let error = constraint.check().unwrap_err();
            assert_eq!(error.0, part, "{constraint:?}: {}", error.1);
        }
        assert!(on("", ConstraintOp::DistinctHosts, "false").check().is_ok());
        assert!(!on("", ConstraintOp::DistinctHosts, "false").is_distinct_hosts());
        assert!(on("", ConstraintOp::DistinctHosts, "true").is_distinct_hosts());
    }

    #[test]
    fn affinities_and_spreads_check_their_weights_and_targets() {
        let affinity = |weight| Affinity {
            attribute: "zone".into(),
            op: ConstraintOp::Equal,
            value: "a".into(),
            weight,
        };
        assert!(affinity(50).check().is_ok());
        assert!(affinity(-100).check().is_ok());
        assert_eq!(affinity(0).check().unwrap_err().0, "weight");
        assert_eq!(affinity(-101).check().unwrap_err().0, "weight");
        let mut distinct = affinity(10);
        distinct.op = ConstraintOp::DistinctHosts;
        distinct.attribute.clear();
        assert_eq!(distinct.check().unwrap_err().0, "operator");

        let target = |value: &str, percent| SpreadTarget {
            value: value.into(),
            percent,
        };
        let mut spread = Spread {
            attribute: "zone".into(),
            weight: DEFAULT_SPREAD_WEIGHT,
            targets: vec![target("a", 50), target("b", 30)],
        };
        assert!(spread.check().is_ok());
        assert_eq!(spread.target_percent("a"), Some((50, true)));
        assert_eq!(spread.target_percent("c"), Some((20, false)));
        spread.targets.push(target("c", 30));
        assert!(spread.check().unwrap_err().1.contains("110"));
        spread.targets[2] = target("a", 10);
        assert!(spread.check().unwrap_err().1.contains("twice"));
        spread.targets.clear();
        assert_eq!(spread.target_percent("a"), None);
        spread.weight = 0;
        assert_eq!(spread.check().unwrap_err().0, "weight");
    }
}
