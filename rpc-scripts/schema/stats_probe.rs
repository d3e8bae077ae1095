//! The schema of `qos_stats_get`'s answer, read off the types that write it (tests only).
//!
//! Included with `#[path]` by the tests of `spdk-plugin/src/stats.rs`, which serialise
//! sample answers with this module's recording serializer and compare the schema that
//! comes out with the committed `rpc-scripts/schema/stats.json`. The readers of the
//! answer are checked against that file: it-harness and the cluster agent with
//! `stats_check.rs`, the exporter and `qos_rpc.py` with Python tests. So neither the
//! writer nor a reader can change a field without the other (see `rpc-scripts/README.md`,
//! "Schema").
//!
//! Nothing here is written per field. Serialising a sample records, at every place in
//! the answer, the JSON type written there. A value some sample writes as `null` may be
//! `null`; a key some sample leaves out (`skip_serializing_if`, a flattened `None`) is
//! optional. The samples must show both: a key no sample writes a value for, and a Rust
//! `Option` (seen as such through `serialize_some`) that every sample sets, are refused
//! with the place to populate. The result is a JSON Schema (draft 2020-12) with `additionalProperties:
//! false` everywhere, the fields that only the full form has marked `x-full-form-only`.

use std::fmt::Display;

use serde::Serialize;
use serde::ser::{self, Impossible};
use serde_json::{Map, Value, json};

/// The JSON types seen at one place of the answer, over every sample.
#[derive(Debug, Clone, Default)]
pub struct Node {
    kind: Option<Kind>,
    /// A sample wrote `null` here.
    nullable: bool,
    /// A Rust `Option` is written here (`serialize_some`): a sample must leave it out or
    /// write `null`, so that the schema says which of the two it is.
    option: bool,
    /// The Rust enum whose variant name is written here (a string).
    enum_name: Option<&'static str>,
}

#[derive(Debug, Clone)]
enum Kind {
    Bool,
    Integer,
    Number,
    Str,
    /// The elements' node (`None`: no sample had an element).
    Array(Option<Box<Node>>),
    Object(Object),
}

#[derive(Debug, Clone, Default)]
struct Object {
    /// How many objects were seen here.
    seen: usize,
    /// Keys in the order first written.
    props: Vec<Prop>,
}

#[derive(Debug, Clone)]
struct Prop {
    name: String,
    node: Node,
    /// How many of the objects had the key.
    present: usize,
}

impl Node {
    /// Records one more value at this place.
    fn merge(&mut self, other: Node) {
        self.nullable |= other.nullable;
        self.option |= other.option;
        self.enum_name = self.enum_name.or(other.enum_name);
        let Some(theirs) = other.kind else { return };
        self.kind = Some(match (self.kind.take(), theirs) {
            (None, k) => k,
            (Some(Kind::Integer), Kind::Number) | (Some(Kind::Number), Kind::Integer) => {
                Kind::Number
            }
            (Some(Kind::Array(a)), Kind::Array(b)) => Kind::Array(match (a, b) {
                (Some(mut a), Some(b)) => {
                    a.merge(*b);
                    Some(a)
                }
                (a, b) => a.or(b),
            }),
            (Some(Kind::Object(mut a)), Kind::Object(b)) => {
                a.seen += b.seen;
                for p in b.props {
                    match a.props.iter_mut().find(|q| q.name == p.name) {
                        Some(q) => {
                            q.present += p.present;
                            q.node.merge(p.node);
                        }
                        None => a.props.push(p),
                    }
                }
                Kind::Object(a)
            }
            (Some(a), b) => {
                assert!(
                    std::mem::discriminant(&a) == std::mem::discriminant(&b),
                    "stats schema: two JSON types at one place: {a:?} and {b:?}"
                );
                a
            }
        });
    }

    /// The JSON Schema of this place (both forms merged); `compact`: the same place in
    /// the compact form (`None` where the compact form has nothing here), to mark what
    /// only the full form writes. `at` names the place for a message.
    fn schema(&self, compact: Option<&Node>, at: &str) -> Value {
        let mut s = Map::new();
        let name = match &self.kind {
            None => panic!(
                "stats schema: {at} is null in every sample: give it a value in the samples \
                 (spdk-plugin/src/stats_tests.rs)"
            ),
            Some(Kind::Bool) => "boolean",
            Some(Kind::Integer) => "integer",
            Some(Kind::Number) => "number",
            Some(Kind::Str) => "string",
            Some(Kind::Array(_)) => "array",
            Some(Kind::Object(_)) => "object",
        };
        s.insert(
            "type".into(),
            if self.nullable {
                json!([name, "null"])
            } else {
                json!(name)
            },
        );
        if let Some(e) = self.enum_name {
            s.insert("x-rust-enum".into(), json!(e));
        }
        match &self.kind {
            Some(Kind::Array(items)) => {
                let items = items
                    .as_deref()
                    .unwrap_or_else(|| panic!("stats schema: {at} is empty in every sample"));
                let theirs = compact.and_then(|c| match &c.kind {
                    Some(Kind::Array(Some(i))) => Some(&**i),
                    _ => None,
                });
                s.insert("items".into(), items.schema(theirs, &format!("{at}[]")));
            }
            Some(Kind::Object(o)) => {
                let theirs = compact.and_then(|c| match &c.kind {
                    Some(Kind::Object(o)) => Some(o),
                    _ => None,
                });
                let mut props = Map::new();
                let mut required = Vec::new();
                for p in &o.props {
                    let at = format!("{at}.{}", p.name);
                    assert!(
                        !p.node.option || p.node.nullable || p.present < o.seen,
                        "stats schema: {at} is an Option that every sample sets: leave it out \
                         or make it null in one (spdk-plugin/src/stats_tests.rs)"
                    );
                    let in_compact = theirs
                        .and_then(|t| t.props.iter().find(|q| q.name == p.name))
                        .filter(|q| q.present > 0);
                    let mut ps = p.node.schema(in_compact.map(|q| &q.node), &at);
                    if compact.is_some() && in_compact.is_none() {
                        ps["x-full-form-only"] = json!(true);
                    }
                    // Required: written in every object of both forms (a field the
                    // compact form leaves out is not, and is marked full-form-only).
                    let everywhere = p.present == o.seen;
                    if everywhere {
                        required.push(p.name.clone());
                    }
                    props.insert(p.name.clone(), ps);
                }
                s.insert("properties".into(), Value::Object(props));
                s.insert("required".into(), json!(required));
                s.insert("additionalProperties".into(), json!(false));
                s.insert(
                    "x-order".into(),
                    json!(o.props.iter().map(|p| &p.name).collect::<Vec<_>>()),
                );
            }
            _ => {}
        }
        Value::Object(s)
    }
}

/// What one value serialises to, as a [`Node`].
pub fn record<T: Serialize + ?Sized>(value: &T) -> Node {
    value
        .serialize(Recorder)
        .unwrap_or_else(|e| panic!("stats schema: {e}"))
}

/// An array of `items` (the answer: one element per domain).
pub fn array_of(items: &Node) -> Node {
    Node {
        kind: Some(Kind::Array(Some(Box::new(items.clone())))),
        ..Node::default()
    }
}

/// The nodes of the samples of one form, merged.
pub fn form<'a>(samples: impl IntoIterator<Item = &'a Node>) -> Node {
    let mut all = Node::default();
    for s in samples {
        all.merge(s.clone());
    }
    all
}

/// The file `rpc-scripts/schema/stats.json`: the answer of `qos_stats_get` (an array,
/// one element per domain), `full` and `compact` the merged samples of each form.
pub fn render(full: &Node, compact: &Node, generated_by: &str) -> String {
    let mut answer = Map::new();
    answer.insert(
        "$schema".into(),
        json!("https://json-schema.org/draft/2020-12/schema"),
    );
    answer.insert("generated_by".into(), json!(generated_by));
    answer.insert(
        "description".into(),
        json!(
            "qos_stats_get's answer: one object per domain. `x-full-form-only`: written in \
             the full form only (not with `compact`); `x-order`: the order the target writes \
             the keys in; `x-rust-enum`: a unit variant of that Rust enum, in snake_case."
        ),
    );
    let mut all = full.clone();
    all.merge(compact.clone());
    let Value::Object(s) = all.schema(Some(compact), "answer") else {
        unreachable!()
    };
    answer.extend(s);
    let mut text = serde_json::to_string_pretty(&Value::Object(answer)).expect("JSON");
    text.push('\n');
    text
}

/// Compares `text` with the committed schema at `path` (or rewrites it with
/// `UPDATE_SCHEMA=1`); the failure names the places that differ.
pub fn check_golden(path: &std::path::Path, text: &str, command: &str) {
    if std::env::var_os("UPDATE_SCHEMA").is_some_and(|v| v == "1") {
        std::fs::write(path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        eprintln!("wrote {}", path.display());
        return;
    }
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    if committed == text {
        return;
    }
    let old: Value = serde_json::from_str(&committed).unwrap_or(Value::Null);
    let new: Value = serde_json::from_str(text).expect("JSON");
    let mut diff = Vec::new();
    differences("answer", &old, &new, &mut diff);
    if diff.is_empty() {
        diff.push("  the text differs (layout, or the notes)".into());
    }
    panic!(
        "qos_stats_get's answer as the Rust types write it differs from {} (committed -> \
         types):\n{}\nIf the change is meant, rewrite the file with\n    UPDATE_SCHEMA=1 \
         {command}\nthen make the readers agree (it-harness/src/stats.rs, cluster-agent/src/\
         target.rs, exporter/nvmf_qos_exporter.py, rpc-scripts/qos_rpc.py: their tests read \
         the file) and docs/rpc.md.",
        path.display(),
        diff.join("\n")
    );
}

/// The places where two schemas differ, one line each.
fn differences(at: &str, old: &Value, new: &Value, out: &mut Vec<String>) {
    let props = |v: &Value| v["properties"].as_object().cloned().unwrap_or_default();
    let (op, np) = (props(old), props(new));
    for (k, n) in &np {
        match op.get(k) {
            None => out.push(format!("  {at}.{k}: a new field")),
            Some(o) => differences(&format!("{at}.{k}"), o, n, out),
        }
    }
    for k in op.keys().filter(|k| !np.contains_key(*k)) {
        out.push(format!("  {at}.{k}: gone"));
    }
    if !old["items"].is_null() || !new["items"].is_null() {
        differences(&format!("{at}[]"), &old["items"], &new["items"], out);
    }
    // With a field added or gone, `required` and `x-order` differ too: said above.
    let same_fields = op.keys().eq(np.keys());
    let keys = [
        "type",
        "required",
        "x-order",
        "x-full-form-only",
        "x-rust-enum",
    ];
    for key in keys {
        let listed = ["required", "x-order"].contains(&key);
        if old[key] != new[key] && (same_fields || !listed) {
            out.push(format!("  {at}: {key} {} -> {}", old[key], new[key]));
        }
    }
}

#[derive(Debug)]
pub struct Error(String);

impl Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl ser::Error for Error {
    fn custom<T: Display>(msg: T) -> Self {
        Error(msg.to_string())
    }
}

/// Serialises a value into the [`Node`] of its JSON types.
struct Recorder;

fn leaf(kind: Kind) -> Result<Node, Error> {
    Ok(Node {
        kind: Some(kind),
        ..Node::default()
    })
}

/// The serializer's methods for values that are leaves of the answer.
macro_rules! leaves {
    ($($method:ident $t:ty => $kind:ident),* $(,)?) => {$(
        fn $method(self, _: $t) -> Result<Node, Error> {
            leaf(Kind::$kind)
        }
    )*};
}

impl ser::Serializer for Recorder {
    type Ok = Node;
    type Error = Error;
    type SerializeSeq = Seq;
    type SerializeTuple = Seq;
    type SerializeTupleStruct = Seq;
    type SerializeTupleVariant = Impossible<Node, Error>;
    type SerializeMap = Obj;
    type SerializeStruct = Obj;
    type SerializeStructVariant = Impossible<Node, Error>;

    leaves! {
        serialize_bool bool => Bool, serialize_char char => Str, serialize_str &str => Str,
        serialize_i8 i8 => Integer, serialize_i16 i16 => Integer, serialize_i32 i32 => Integer,
        serialize_i64 i64 => Integer, serialize_u8 u8 => Integer, serialize_u16 u16 => Integer,
        serialize_u32 u32 => Integer, serialize_u64 u64 => Integer,
        serialize_f32 f32 => Number, serialize_f64 f64 => Number,
    }
    fn serialize_bytes(self, _: &[u8]) -> Result<Node, Error> {
        Err(ser::Error::custom("bytes are not JSON"))
    }
    fn serialize_none(self) -> Result<Node, Error> {
        Ok(Node {
            nullable: true,
            ..Node::default()
        })
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<Node, Error> {
        let mut n = value.serialize(Recorder)?;
        n.option = true;
        Ok(n)
    }
    fn serialize_unit(self) -> Result<Node, Error> {
        self.serialize_none()
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<Node, Error> {
        self.serialize_none()
    }
    fn serialize_unit_variant(
        self,
        name: &'static str,
        _: u32,
        _: &'static str,
    ) -> Result<Node, Error> {
        Ok(Node {
            kind: Some(Kind::Str),
            enum_name: Some(name),
            ..Node::default()
        })
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<Node, Error> {
        value.serialize(Recorder)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<Node, Error> {
        // `{"variant": value}`: an object with that one key (the other variants'
        // keys come from other samples).
        let mut o = Obj::default();
        o.add(variant.to_string(), value.serialize(Recorder)?);
        ser::SerializeStruct::end(o)
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Seq, Error> {
        Ok(Seq::default())
    }
    fn serialize_tuple(self, _: usize) -> Result<Seq, Error> {
        Ok(Seq::default())
    }
    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Seq, Error> {
        Ok(Seq::default())
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Impossible<Node, Error>, Error> {
        Err(ser::Error::custom("tuple variants are not in the answer"))
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Obj, Error> {
        Ok(Obj::default())
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Obj, Error> {
        Ok(Obj::default())
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Impossible<Node, Error>, Error> {
        Err(ser::Error::custom("struct variants are not in the answer"))
    }
}

#[derive(Default)]
struct Seq {
    items: Option<Node>,
}

impl Seq {
    fn add<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        let n = value.serialize(Recorder)?;
        match &mut self.items {
            Some(items) => items.merge(n),
            None => self.items = Some(n),
        }
        Ok(())
    }

    fn done(self) -> Result<Node, Error> {
        leaf(Kind::Array(self.items.map(Box::new)))
    }
}

impl ser::SerializeSeq for Seq {
    type Ok = Node;
    type Error = Error;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        self.add(value)
    }
    fn end(self) -> Result<Node, Error> {
        self.done()
    }
}

impl ser::SerializeTuple for Seq {
    type Ok = Node;
    type Error = Error;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        self.add(value)
    }
    fn end(self) -> Result<Node, Error> {
        self.done()
    }
}

impl ser::SerializeTupleStruct for Seq {
    type Ok = Node;
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        self.add(value)
    }
    fn end(self) -> Result<Node, Error> {
        self.done()
    }
}

#[derive(Default)]
struct Obj {
    object: Object,
    /// The key of a map entry whose value comes next.
    key: Option<String>,
}

impl Obj {
    fn add(&mut self, name: String, node: Node) {
        self.object.props.push(Prop {
            name,
            node,
            present: 1,
        });
    }
}

impl ser::SerializeStruct for Obj {
    type Ok = Node;
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        self.add(key.to_string(), value.serialize(Recorder)?);
        Ok(())
    }
    fn skip_field(&mut self, key: &'static str) -> Result<(), Error> {
        // Left out by `skip_serializing_if`: the key is there, optional.
        self.object.props.push(Prop {
            name: key.to_string(),
            node: Node::default(),
            present: 0,
        });
        Ok(())
    }
    fn end(mut self) -> Result<Node, Error> {
        self.object.seen = 1;
        leaf(Kind::Object(self.object))
    }
}

impl ser::SerializeMap for Obj {
    type Ok = Node;
    type Error = Error;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Error> {
        // A key is a string in JSON (a unit variant, in the held counts).
        let key = serde_json::to_value(key).map_err(ser::Error::custom)?;
        let key = key
            .as_str()
            .ok_or_else(|| ser::Error::custom("a map key not a string"))?;
        self.key = Some(key.to_string());
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        let key = self
            .key
            .take()
            .ok_or_else(|| ser::Error::custom("a map value without a key"))?;
        self.add(key, value.serialize(Recorder)?);
        Ok(())
    }
    fn end(self) -> Result<Node, Error> {
        ser::SerializeStruct::end(self)
    }
}
