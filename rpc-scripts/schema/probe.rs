//! The RPC parameter schema, read off the Rust parameter structs (tests only).
//!
//! Included with `#[path]` by the tests of `spdk-plugin/src/params.rs` and
//! `initiator-plugin/src/params.rs`, which describe their methods with it and compare the
//! result with the committed `rpc-scripts/schema/*.json`; `rpc-scripts/tests/
//! test_schema.py` compares `qos_rpc.py`'s options with the same files. So neither side
//! can change a parameter without the other (see `rpc-scripts/README.md`, "Schema").
//!
//! Nothing here is written by hand per field: for each method it finds
//!
//! - the fields, their JSON types and enum variants, by running the struct's
//!   `Deserialize` against a deserializer that records what each field asks for;
//! - which fields are required, by parsing `{}` and adding what serde says is missing;
//! - the value an omitted field takes, from the method's own resolution (the parameters
//!   as the target prints them back), or that it keeps its value (`*_update` methods);
//! - the range of every integer (and the length and characters of names the target
//!   checks), by asking the method's own validation which values it accepts, with the
//!   other parameters at the method's probing context (`context` in the file: the same
//!   call the Python test makes).

use std::collections::BTreeMap;

use serde::Deserializer;
use serde::de::value::{Error as DeError, StrDeserializer};
use serde::de::{self, DeserializeOwned, DeserializeSeed, IntoDeserializer, MapAccess, Visitor};
use serde_json::{Map, Value, json};

// spdk-plugin includes both probe.rs and stats_probe.rs: each has its own copy.
#[allow(clippy::duplicate_mod)]
#[path = "golden.rs"]
mod golden;

/// What a field's JSON value is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// An unsigned integer no larger than `max` (the Rust type's largest value).
    Integer {
        max: u64,
    },
    Bool,
    Str,
    /// One of these strings (a unit-variant enum).
    Enum(Vec<&'static str>),
}

/// A field of a parameter struct, as its `Deserialize` sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub name: &'static str,
    pub kind: Kind,
    /// `Option<_>` in Rust.
    pub optional: bool,
}

/// The fields of `T` (a struct deriving `Deserialize`), in declaration order.
pub fn fields<T: DeserializeOwned>() -> Vec<Field> {
    let mut out = Vec::new();
    if let Err(e) = T::deserialize(Top { out: &mut out }) {
        panic!("schema probe: {}: {e}", std::any::type_name::<T>());
    }
    out
}

/// Gives the struct its own field names back, one value of each requested type.
struct Top<'a> {
    out: &'a mut Vec<Field>,
}

impl<'de> Deserializer<'de> for Top<'_> {
    type Error = DeError;

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        visitor.visit_map(Fields {
            fields,
            next: 0,
            out: self.out,
        })
    }

    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, DeError> {
        Err(de::Error::custom("not a struct with named fields"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}

struct Fields<'a> {
    fields: &'static [&'static str],
    next: usize,
    out: &'a mut Vec<Field>,
}

impl<'de> MapAccess<'de> for Fields<'_> {
    type Error = DeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, DeError> {
        match self.fields.get(self.next) {
            Some(name) => {
                let key: StrDeserializer<'_, DeError> = name.into_deserializer();
                seed.deserialize(key).map(Some)
            }
            None => Ok(None),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, DeError> {
        let name = self.fields[self.next];
        self.next += 1;
        let mut seen = Seen::default();
        let value = seed.deserialize(TypeOf { seen: &mut seen })?;
        let kind = seen
            .kind
            .ok_or_else(|| de::Error::custom(format!("field {name}: no type seen")))?;
        self.out.push(Field {
            name,
            kind,
            optional: seen.optional,
        });
        Ok(value)
    }
}

#[derive(Default)]
struct Seen {
    kind: Option<Kind>,
    optional: bool,
}

/// Records the type a field's `Deserialize` asks for and gives it a value of that type.
struct TypeOf<'a> {
    seen: &'a mut Seen,
}

impl TypeOf<'_> {
    fn integer(self, max: u64) {
        self.seen.kind = Some(Kind::Integer { max });
    }
}

impl<'de> Deserializer<'de> for TypeOf<'_> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, DeError> {
        Err(de::Error::custom(
            "a type the schema probe does not know (teach rpc-scripts/schema/probe.rs)",
        ))
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.seen.optional = true;
        visitor.visit_some(self)
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.seen.kind = Some(Kind::Bool);
        visitor.visit_bool(false)
    }

    fn deserialize_u8<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.integer(u8::MAX.into());
        visitor.visit_u8(0)
    }

    fn deserialize_u16<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.integer(u16::MAX.into());
        visitor.visit_u16(0)
    }

    fn deserialize_u32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.integer(u32::MAX.into());
        visitor.visit_u32(0)
    }

    // `usize` asks for a `u64` too; serde_json refuses what does not fit.
    fn deserialize_u64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.integer(u64::MAX);
        visitor.visit_u64(0)
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.seen.kind = Some(Kind::Str);
        visitor.visit_str("probe")
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        self.seen.kind = Some(Kind::Enum(variants.to_vec()));
        let first: StrDeserializer<'_, DeError> = variants[0].into_deserializer();
        visitor.visit_enum(first)
    }

    serde::forward_to_deserialize_any! {
        i8 i16 i32 i64 i128 u128 f32 f64 char bytes byte_buf unit unit_struct
        newtype_struct seq tuple tuple_struct map struct identifier ignored_any
    }
}

/// What a method does with a parameter that is left out.
pub enum Omitted {
    /// It takes a value: the method's parameters resolved as the target uses (and
    /// prints) them, from a call with the required parameters only. A field missing
    /// from that object, or `null`, has no value (unset).
    Default(Box<dyn Fn(&Value) -> Value>),
    /// It keeps its current value (`*_update`): the function checks that a call with
    /// the required parameters only changes nothing.
    Keep(Box<dyn Fn(&Value) -> bool>),
}

/// Whether the target accepts a call (`Err`: why not).
pub type Check = Box<dyn Fn(&Value) -> Result<(), String>>;

/// One RPC method: its parameter struct, and how the target validates and resolves a
/// call to it.
pub struct Method {
    pub name: &'static str,
    /// The name of the parameter struct in the plugin's `rpc.rs` (checked there).
    pub rust_type: &'static str,
    pub fields: Vec<Field>,
    /// The call whose other parameters stay put while one is probed: the required
    /// parameters, plus what lifts limits that depend on other parameters (the largest
    /// period, the largest capacity), so that a range is the parameter's own.
    pub context: Value,
    /// Whether the target accepts a call, as its handler decides short of SPDK (the
    /// same parsing, checks and `qos_core` calls).
    pub accept: Check,
    /// Whether `accept` runs the checks of the names (lengths, characters): only then
    /// are string constraints recorded.
    pub checks_names: bool,
    pub omitted: Omitted,
    /// Parameters that only mean something with others (a burst needs a limit and a
    /// bucket): what is added to the context while each is probed (`with` in the file).
    pub companions: BTreeMap<&'static str, Value>,
    /// Parses a call as the parameter struct (serde alone).
    parse: Check,
}

impl Method {
    pub fn new<T: DeserializeOwned>(
        name: &'static str,
        rust_type: &'static str,
        context: Value,
        accept: impl Fn(&Value) -> Result<(), String> + 'static,
        omitted: Omitted,
    ) -> Self {
        Method {
            name,
            rust_type,
            fields: fields::<T>(),
            context,
            accept: Box::new(accept),
            checks_names: false,
            omitted,
            companions: BTreeMap::new(),
            parse: Box::new(|v| parse_as::<T>(v).map(|_| ())),
        }
    }

    /// Probes `name` with `companions` (an object of parameters) added to the context.
    pub fn probing_with(mut self, name: &'static str, companions: Value) -> Self {
        self.companions.insert(name, companions);
        self
    }

    /// The call `name` is probed in: the context and its companions.
    fn context_for(&self, name: &str) -> Value {
        let mut v = self.context.clone();
        if let (Value::Object(o), Some(Value::Object(extra))) = (&mut v, self.companions.get(name))
        {
            o.extend(extra.clone());
        }
        v
    }

    /// A method that only parses short of SPDK (lookups, bdevs), whose omitted
    /// parameters are the struct's serde defaults.
    pub fn query<T: DeserializeOwned + serde::Serialize + 'static>(
        name: &'static str,
        rust_type: &'static str,
        context: Value,
    ) -> Self {
        Method::new::<T>(
            name,
            rust_type,
            context,
            |v| parse_as::<T>(v).map(|_| ()),
            Omitted::Default(Box::new(|v| {
                serde_json::to_value(parse_as::<T>(v).expect("minimal call")).expect("JSON")
            })),
        )
    }

    /// Records the constraints the target puts on names (see [`Method::checks_names`]).
    pub fn checking_names(mut self) -> Self {
        self.checks_names = true;
        self
    }
}

/// Parses `params` as `T` the way the plugins do (`serde_json`), as a `Result<_, String>`.
pub fn parse_as<T: DeserializeOwned>(params: &Value) -> Result<T, String> {
    serde_json::from_value(params.clone()).map_err(|e| e.to_string())
}

/// `context` with `name` set to `value`.
fn with(context: &Value, name: &str, value: Value) -> Value {
    let mut v = context.clone();
    v[name] = value;
    v
}

/// The required fields, in the order serde asks for them: parse the context's
/// subset, starting from `{}`, adding each field serde says is missing.
fn required(m: &Method) -> Vec<String> {
    let mut call = Map::new();
    let mut names = Vec::new();
    loop {
        let Err(e) = (m.parse)(&Value::Object(call.clone())) else {
            return names;
        };
        let missing = e
            .strip_prefix("missing field `")
            .and_then(|rest| rest.split('`').next())
            .unwrap_or_else(|| panic!("{}: parsing the required fields: {e}", m.name));
        let value = m.context.get(missing).unwrap_or_else(|| {
            panic!(
                "{}: required field {missing} is not in the probing context",
                m.name
            )
        });
        call.insert(missing.to_string(), value.clone());
        names.push(missing.to_string());
    }
}

/// Integers tried first when looking for an accepted value.
const SEEDS: [u64; 12] = [
    1,
    2,
    10,
    100,
    512,
    1000,
    4096,
    65536,
    1 << 20,
    1 << 32,
    1 << 44,
    u64::MAX,
];

/// The accepted values of an integer field: `{0} ∪ [lo, hi]` or `[lo, hi]`, checked to
/// be that shape. None when it accepts a single value (it cannot change).
fn integer_range(m: &Method, name: &str, max: u64, default: Option<u64>) -> Value {
    let context = m.context_for(name);
    let ok = |v: u64| (m.accept)(&with(&context, name, json!(v))).is_ok();
    let seed = default
        .into_iter()
        .chain(m.context.get(name).and_then(Value::as_u64))
        .chain(SEEDS)
        .filter(|&v| (1..=max).contains(&v))
        .find(|&v| ok(v));
    let zero = ok(0);
    let Some(seed) = seed else {
        assert!(zero, "{}: {name} accepts no value", m.name);
        return json!({"fixed": true});
    };
    // The first accepted value in [1, seed], the last in [seed, max].
    let (mut a, mut b) = (1, seed);
    while a < b {
        let mid = a + (b - a) / 2;
        if ok(mid) { b = mid } else { a = mid + 1 }
    }
    let lo = a;
    let (mut a, mut b) = (seed, max);
    while a < b {
        let mid = b - (b - a) / 2;
        if ok(mid) { a = mid } else { b = mid - 1 }
    }
    let hi = a;
    // The shape: every value between lo and hi accepted (a sample of them).
    let span = hi - lo;
    for k in 0..=16u64 {
        let v = lo + ((span as u128 * k as u128 * k as u128) / 256) as u64;
        assert!(
            ok(v),
            "{}: {name} accepts {lo} and {hi} but not {v}: the schema cannot describe it",
            m.name
        );
    }
    if lo == hi && !zero {
        return json!({"fixed": true});
    }
    if zero && lo == 1 {
        json!({"min": 0, "max": hi})
    } else if zero {
        json!({"min": lo, "max": hi, "or_zero": true})
    } else {
        json!({"min": lo, "max": hi})
    }
}

/// Characters tried in names.
pub const NAME_CHARS: [char; 10] = [' ', '\t', '/', ':', '-', '_', '.', '@', '"', 'é'];
/// Longest name tried.
const LONGEST: usize = 4096;

/// The constraints on a name the target checks: `min_len`, `max_len` (bytes) and the
/// characters of [`NAME_CHARS`] it refuses. None for a name that must be an existing
/// object's or that the method does not check short of SPDK.
fn name_constraints(m: &Method, name: &str) -> Option<Value> {
    let context = m.context_for(name);
    let ok = |s: &str| (m.accept)(&with(&context, name, json!(s))).is_ok();
    if !(ok("qa") && ok("qb")) {
        return None; // a reference to an object
    }
    let min_len = if ok("") { 0 } else { 1 };
    let long = |n: usize| ok(&"q".repeat(n));
    let max_len = if long(LONGEST) {
        None
    } else {
        let (mut a, mut b) = (2, LONGEST - 1);
        while a < b {
            let mid = b - (b - a) / 2;
            if long(mid) { a = mid } else { b = mid - 1 }
        }
        Some(a)
    };
    let refused: String = NAME_CHARS
        .iter()
        .filter(|c| !ok(&format!("q{c}q")))
        .collect();
    if min_len == 0 && max_len.is_none() && refused.is_empty() {
        return None;
    }
    let mut v = json!({"min_len": min_len, "refused_chars": refused});
    if let Some(n) = max_len {
        v["max_len"] = json!(n);
    }
    Some(v)
}

/// The schema of one method (see the module's documentation).
pub fn describe(m: &Method) -> Value {
    (m.parse)(&m.context).unwrap_or_else(|e| panic!("{}: the context does not parse: {e}", m.name));
    (m.accept)(&m.context)
        .unwrap_or_else(|e| panic!("{}: the target refuses the context: {e}", m.name));
    let required = required(m);
    let minimal: Map<String, Value> = required
        .iter()
        .map(|n| (n.clone(), m.context[n.as_str()].clone()))
        .collect();
    let minimal = Value::Object(minimal);
    let resolved = match &m.omitted {
        Omitted::Default(resolve) => Some(resolve(&minimal)),
        Omitted::Keep(unchanged) => {
            assert!(
                unchanged(&minimal),
                "{}: a call with the required parameters only changed something",
                m.name
            );
            None
        }
    };
    let mut params = Vec::new();
    for f in &m.fields {
        let mut p = Map::new();
        p.insert("name".into(), json!(f.name));
        let is_required = required.iter().any(|r| r == f.name);
        p.insert("required".into(), json!(is_required));
        if let Some(with) = m.companions.get(f.name) {
            p.insert("with".into(), with.clone());
        }
        let default = resolved
            .as_ref()
            .map(|r| r.get(f.name).cloned().unwrap_or(Value::Null));
        if !is_required {
            match &default {
                Some(d) => p.insert("default".into(), d.clone()),
                None => p.insert("omitted".into(), json!("keep")),
            };
        }
        match &f.kind {
            Kind::Integer { max } => {
                p.insert("type".into(), json!("integer"));
                let d = default.as_ref().and_then(Value::as_u64);
                if let Value::Object(range) = integer_range(m, f.name, *max, d) {
                    p.extend(range);
                }
            }
            Kind::Bool => {
                p.insert("type".into(), json!("boolean"));
            }
            Kind::Str => {
                p.insert("type".into(), json!("string"));
                if m.checks_names
                    && let Some(Value::Object(c)) = name_constraints(m, f.name)
                {
                    p.extend(c);
                }
            }
            Kind::Enum(variants) => {
                p.insert("type".into(), json!("enum"));
                p.insert("choices".into(), json!(variants));
            }
        }
        params.push(Value::Object(p));
    }
    json!({"context": m.context, "params": params})
}

/// Every object's keys sorted, whatever `serde_json`'s features: the file is the same
/// from any build.
fn canonical(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let sorted: BTreeMap<&String, Value> =
                m.iter().map(|(k, v)| (k, canonical(v))).collect();
            let mut out = Map::new();
            for (k, v) in sorted {
                out.insert(k.clone(), v);
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(canonical).collect()),
        other => other.clone(),
    }
}

/// The file's text: `{"methods": {name: schema}}` with a note on where it comes from.
pub fn render(plugin: &str, methods: &[Method]) -> String {
    let mut all = Map::new();
    for m in methods {
        assert!(
            all.insert(m.name.to_string(), describe(m)).is_none(),
            "{} twice",
            m.name
        );
    }
    let doc = json!({
        "generated_by": format!(
            "the tests of {plugin}/src/params.rs (UPDATE_SCHEMA=1 rewrites this file); \
             rpc-scripts/tests/test_schema.py checks qos_rpc.py against it"
        ),
        "methods": all,
        "name_chars_tried": NAME_CHARS.iter().collect::<String>(),
    });
    let mut text = serde_json::to_string_pretty(&canonical(&doc)).expect("JSON");
    text.push('\n');
    text
}

/// Compares `text` with the committed file at `path`, or writes it with
/// `UPDATE_SCHEMA=1`. Panics with the differences and what to do.
pub fn check_golden(path: &std::path::Path, text: &str, command: &str) {
    let Some((old, new)) = golden::differs(path, text) else {
        return;
    };
    let mut diff = Vec::new();
    differences(&old["methods"], &new["methods"], &mut diff);
    if diff.is_empty() {
        diff.push("  the text differs (layout, or the note)".into());
    }
    panic!(
        "the RPC parameters of the Rust structs differ from {} (committed -> structs):\n{}\n\
         If the change is meant, rewrite the file with\n    UPDATE_SCHEMA=1 {command}\n\
         then make rpc-scripts/qos_rpc.py and docs/rpc.md agree and run \
         `make test-rpc` (rpc-scripts/tests/test_schema.py compares qos_rpc.py with it).",
        path.display(),
        diff.join("\n")
    );
}

/// The differences between two `methods` objects, one line each.
fn differences(old: &Value, new: &Value, out: &mut Vec<String>) {
    let empty = Map::new();
    let (old, new) = (
        old.as_object().unwrap_or(&empty),
        new.as_object().unwrap_or(&empty),
    );
    for (name, n) in new {
        let Some(o) = old.get(name) else {
            out.push(format!("  {name}: a new method"));
            continue;
        };
        if o["context"] != n["context"] {
            out.push(format!(
                "  {name}: context {} -> {}",
                o["context"], n["context"]
            ));
        }
        let by_name = |v: &Value| -> Vec<(String, Value)> {
            v["params"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| (p["name"].as_str().unwrap_or("?").to_string(), p.clone()))
                .collect()
        };
        let (op, np) = (by_name(o), by_name(n));
        for (pname, p) in &np {
            match op.iter().find(|(n, _)| n == pname) {
                None => out.push(format!("  {name} {pname}: a new parameter {p}")),
                Some((_, q)) if q != p => {
                    let keys: std::collections::BTreeSet<&String> = p
                        .as_object()
                        .into_iter()
                        .chain(q.as_object())
                        .flat_map(|m| m.keys())
                        .collect();
                    for k in keys.into_iter().filter(|k| p.get(*k) != q.get(*k)) {
                        let show = |v: Option<&Value>| v.map_or("(none)".into(), Value::to_string);
                        out.push(format!(
                            "  {name} {pname}: {k} {} -> {}",
                            show(q.get(k)),
                            show(p.get(k))
                        ));
                    }
                }
                Some(_) => {}
            }
        }
        for (pname, _) in op.iter().filter(|(n, _)| !np.iter().any(|(m, _)| m == n)) {
            out.push(format!("  {name} {pname}: no longer a parameter"));
        }
        let order = |v: &[(String, Value)]| v.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
        if op.len() == np.len() && order(&op) != order(&np) {
            out.push(format!("  {name}: the parameters' order changed"));
        }
    }
    for name in old.keys().filter(|n| !new.contains_key(*n)) {
        out.push(format!("  {name}: no longer a method"));
    }
}

/// Checks that `rpc.rs` (its source text) registers exactly `methods` and parses each
/// with the struct named in the table, so a new method cannot miss the schema. A
/// handler given as a function (`apply("m", p, registry::f)`) is looked up in
/// `modules` (name, source text): its first parameter's type counts.
pub fn check_registered(rpc_rs: &str, modules: &[(&str, &str)], methods: &[Method]) {
    let registered: Vec<&str> = rpc_rs
        .split("c\"")
        .skip(1)
        .filter_map(|s| s.split('"').next())
        .filter(|s| s.starts_with("qos_"))
        .collect();
    let mut listed: Vec<&str> = methods.iter().map(|m| m.name).collect();
    let mut got = registered.clone();
    listed.sort_unstable();
    got.sort_unstable();
    assert_eq!(
        got, listed,
        "the methods rpc.rs registers and those of the schema table differ: add the new \
         method to the table in params.rs (and to qos_rpc.py)"
    );
    for m in methods {
        let quoted = format!("(\"{}\"", m.name);
        let found = rpc_rs
            .match_indices(&quoted)
            .filter_map(|(at, _)| struct_at(rpc_rs, at, modules))
            .collect::<Vec<_>>();
        assert!(
            found.iter().any(|t| t == m.rust_type),
            "{}: rpc.rs parses it as {found:?}, the schema table says {}",
            m.name,
            m.rust_type
        );
    }
}

/// The parameter struct of the call whose method name is quoted at `at`:
/// `apply("m", p, |x: T|`, `apply("m", p, module::f)`, `let x: T = parse("m"` or
/// `rpc_delete::<P>("m"` (spdk-sys's own struct, written `vbdev::rpc_delete`).
fn struct_at(src: &str, at: usize, modules: &[(&str, &str)]) -> Option<String> {
    let line_start = src[..at].rfind('\n').map_or(0, |i| i + 1);
    let line_end = src[at..].find('\n').map_or(src.len(), |i| at + i);
    let (before, after) = (&src[line_start..at], &src[at..line_end]);
    if before.contains("rpc_delete::<") {
        return Some("vbdev::rpc_delete".into());
    }
    if let Some(let_at) = before.find("let ")
        && let Some(colon) = before[let_at..].find(':')
    {
        let rest = &before[let_at + colon + 1..];
        return rest.split('=').next().map(|t| t.trim().to_string());
    }
    // The handler: the third argument.
    let handler = after.splitn(3, ',').nth(2)?.trim();
    if let Some(closure) = handler.strip_prefix('|') {
        let (_, ty) = closure.split_once(':')?;
        return ty.split('|').next().map(|t| t.trim().to_string());
    }
    let path = handler.trim_end_matches([')', ';', '{', ' ']);
    let (module, f) = path.split_once("::")?;
    let (_, text) = modules.iter().find(|(n, _)| *n == module)?;
    let sig = text.split(&format!("fn {f}(")).nth(1)?;
    let (_, ty) = sig.split(')').next()?.split_once(':')?;
    Some(
        ty.split(',')
            .next()?
            .trim()
            .trim_start_matches('&')
            .to_string(),
    )
}
