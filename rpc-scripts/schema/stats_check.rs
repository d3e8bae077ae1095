//! A Rust reader of `qos_stats_get`'s answer checked against `rpc-scripts/schema/
//! stats.json` (tests only).
//!
//! Included with `#[path]` by the tests of it-harness (`src/stats.rs`) and the cluster
//! agent (`src/target.rs`). The reader's `Deserialize` is run against a deserializer
//! that walks the schema: every field the reader's structs ask for must be in the schema
//! at that place, with a JSON type the reader's Rust type takes; a value the schema lets
//! be `null` must be an `Option` in the reader. It runs twice: once with every field of
//! the schema given, once with the optional fields left out and the nullable ones
//! `null`, so a reader that needs what the target may leave out fails too. The schema is
//! written from the target's types (`stats_probe.rs`): a field renamed there, with the
//! schema regenerated, fails the reader here.

use std::fmt::Display;

use serde::de::{self, DeserializeOwned, DeserializeSeed, IntoDeserializer, MapAccess, SeqAccess};
use serde::de::{Deserializer, Visitor};
use serde_json::Value;

/// The committed schema (`path`: `rpc-scripts/schema/stats.json`).
pub fn load(path: &std::path::Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `Err` with every place where `T`, read as the whole answer, disagrees with `schema`
/// (the first per pass: serde stops there).
pub fn check<T: DeserializeOwned>(schema: &Value) -> Result<(), String> {
    let mut problems = Vec::new();
    for sparse in [false, true] {
        let at = At {
            node: schema,
            path: "answer".into(),
            optional: false,
            sparse,
        };
        if let Err(e) = T::deserialize(at) {
            let pass = if sparse {
                "with the optional fields left out and the nullable ones null"
            } else {
                "with every field"
            };
            problems.push(format!("{} ({pass})", e.0));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
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

impl de::Error for Error {
    fn custom<T: Display>(msg: T) -> Self {
        Error(msg.to_string())
    }
}

/// One place of the answer, as the schema describes it.
struct At<'a> {
    node: &'a Value,
    path: String,
    /// The reader takes `null` here (an `Option`).
    optional: bool,
    /// The second pass: optional keys left out, nullable values `null`.
    sparse: bool,
}

impl At<'_> {
    fn types(&self) -> Vec<&str> {
        match &self.node["type"] {
            Value::String(t) => vec![t.as_str()],
            Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        }
    }

    /// The schema has one of `want` here, and the reader takes `null` if it may be.
    fn expect(&self, want: &[&str], reader: &str) -> Result<(), Error> {
        let types = self.types();
        if !want.iter().any(|w| types.contains(w)) {
            return Err(Error(format!(
                "{}: the reader reads {reader}, the schema (rpc-scripts/schema/stats.json) \
                 says {types:?}",
                self.path
            )));
        }
        if types.contains(&"null") && !self.optional {
            return Err(Error(format!(
                "{}: the schema lets it be null, the reader reads {reader} and does not take \
                 null (make it an Option)",
                self.path
            )));
        }
        Ok(())
    }

    /// In the sparse pass, a nullable value the reader takes as `Option` is `null`.
    fn null_here(&self) -> bool {
        self.sparse && self.optional && self.types().contains(&"null")
    }
}

macro_rules! integer {
    ($($method:ident $visit:ident $t:ty),*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
            self.expect(&["integer"], stringify!($t))?;
            visitor.$visit(<$t>::default())
        }
    )*};
}

impl<'de> Deserializer<'de> for At<'_> {
    type Error = Error;

    /// A reader that takes any JSON here (`serde_json::Value`): nothing to check inside.
    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_unit()
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_unit()
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let at = At {
            optional: true,
            ..self
        };
        if at.null_here() {
            visitor.visit_none()
        } else {
            visitor.visit_some(at)
        }
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.expect(&["boolean"], "a bool")?;
        visitor.visit_bool(false)
    }

    integer! {
        deserialize_u8 visit_u8 u8, deserialize_u16 visit_u16 u16,
        deserialize_u32 visit_u32 u32, deserialize_u64 visit_u64 u64,
        deserialize_i8 visit_i8 i8, deserialize_i16 visit_i16 i16,
        deserialize_i32 visit_i32 i32, deserialize_i64 visit_i64 i64
    }

    fn deserialize_f32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_f64(visitor)
    }

    fn deserialize_f64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.expect(&["number", "integer"], "a number")?;
        visitor.visit_f64(0.0)
    }

    fn deserialize_char<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_str(visitor)
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.expect(&["string"], "a string")?;
        visitor.visit_str("")
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_str(visitor)
    }

    fn deserialize_bytes<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Error> {
        Err(Error(format!("{}: bytes are not JSON", self.path)))
    }

    fn deserialize_byte_buf<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_bytes(visitor)
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_unit()
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_unit()
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.expect(&["array"], "a sequence")?;
        visitor.visit_seq(OneItem {
            item: Some(At {
                node: &self.node["items"],
                path: format!("{}[]", self.path),
                optional: false,
                sparse: self.sparse,
            }),
        })
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, _: usize, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: usize,
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_seq(visitor)
    }

    /// A map: the reader takes whatever keys the schema has here.
    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.expect(&["object"], "a map")?;
        let keys: Vec<&str> = self.node["properties"]
            .as_object()
            .map(|p| p.keys().map(String::as_str).collect())
            .unwrap_or_default();
        let path = self.path.clone();
        visitor
            .visit_map(Keys::new(&self, keys))
            .map_err(|e| in_place(&path, e))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.expect(&["object"], "a struct")?;
        let props = self.node["properties"].as_object();
        let keys = fields
            .iter()
            .map(|&f| {
                if props.is_some_and(|p| p.contains_key(f)) {
                    Ok(f)
                } else {
                    Err(Error(format!(
                        "{}.{f}: the reader reads it, the schema (rpc-scripts/schema/stats.json) \
                         has no such field",
                        self.path
                    )))
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        let path = self.path.clone();
        visitor
            .visit_map(Keys::new(&self, keys))
            .map_err(|e| in_place(&path, e))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.expect(&["string"], "an enum")?;
        let first: &str = variants.first().copied().unwrap_or_default();
        visitor.visit_enum(first.into_deserializer())
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_str(visitor)
    }
}

/// An error of an object's own visitor (a field missing), named with the object's place.
fn in_place(path: &str, e: Error) -> Error {
    if e.0.starts_with("answer") {
        e
    } else {
        Error(format!("{path}: {}", e.0))
    }
}

/// An array with one element.
struct OneItem<'a> {
    item: Option<At<'a>>,
}

impl<'de> SeqAccess<'de> for OneItem<'_> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        self.item.take().map(|at| seed.deserialize(at)).transpose()
    }
}

/// The keys of an object given to the reader.
struct Keys<'a> {
    node: &'a Value,
    path: String,
    sparse: bool,
    keys: std::vec::IntoIter<&'a str>,
    value: Option<&'a str>,
}

impl<'a> Keys<'a> {
    fn new(at: &At<'a>, keys: Vec<&'a str>) -> Self {
        let required: Vec<&str> = at.node["required"]
            .as_array()
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        // The sparse pass leaves out what the schema says may be absent.
        let keys: Vec<&str> = keys
            .into_iter()
            .filter(|k| !at.sparse || required.contains(k))
            .collect();
        Keys {
            node: at.node,
            path: at.path.clone(),
            sparse: at.sparse,
            keys: keys.into_iter(),
            value: None,
        }
    }
}

impl<'de> MapAccess<'de> for Keys<'_> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        let Some(key) = self.keys.next() else {
            return Ok(None);
        };
        self.value = Some(key);
        seed.deserialize(key.into_deserializer()).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        let key = self.value.take().expect("a key before its value");
        seed.deserialize(At {
            node: &self.node["properties"][key],
            path: format!("{}.{key}", self.path),
            optional: false,
            sparse: self.sparse,
        })
    }
}
