//! Where things are in a TOML file: byte offsets to line and column, a field path to its
//! span, and a span back to the field path that contains it. Used so that every error
//! about a scenario names the file, the line and the field.

use std::ops::Range;

use toml::de::{DeTable, DeValue};

/// One step of a field path: a table key or an array index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seg {
    Key(String),
    Index(usize),
}

/// A dotted field path such as `host[2].reservation_iops`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FieldPath(pub Vec<Seg>);

impl FieldPath {
    pub fn root() -> Self {
        FieldPath(Vec::new())
    }
    pub fn key(mut self, k: &str) -> Self {
        self.0.push(Seg::Key(k.to_string()));
        self
    }
    pub fn index(mut self, i: usize) -> Self {
        self.0.push(Seg::Index(i));
        self
    }
}

impl std::fmt::Display for FieldPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut first = true;
        for s in &self.0 {
            match s {
                Seg::Key(k) => {
                    if !first {
                        write!(f, ".")?;
                    }
                    write!(f, "{k}")?;
                }
                Seg::Index(i) => write!(f, "[{i}]")?,
            }
            first = false;
        }
        if first {
            write!(f, "(top level)")?;
        }
        Ok(())
    }
}

/// 1-based line and column of byte `offset` in `text`.
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let col = text[line_start..offset].chars().count() + 1;
    (line, col)
}

/// The span of the value at `path` (or of its key when the value spans several lines,
/// as a `[[host]]` table does), if the document parses and the path exists.
pub fn locate(text: &str, path: &FieldPath) -> Option<Range<usize>> {
    let doc = DeTable::parse(text).ok()?;
    let mut table: &DeTable<'_> = doc.get_ref();
    let mut value: Option<&toml::Spanned<DeValue<'_>>> = None;
    let mut key_span: Option<Range<usize>> = None;
    for seg in &path.0 {
        match seg {
            Seg::Key(k) => {
                if let Some(v) = value {
                    table = v.get_ref().as_table()?;
                }
                let (key, v) = table.get_key_value(k.as_str())?;
                key_span = Some(key.span());
                value = Some(v);
            }
            Seg::Index(i) => {
                let arr = value?.get_ref().as_array()?;
                let v = arr.get(*i)?;
                value = Some(v);
            }
        }
    }
    let v = value?;
    let span = v.span();
    // Tables of arrays span from their header; point at the value's start either way.
    if v.get_ref().is_table() {
        if let Some(k) = key_span
            && k.start < span.start
        {
            return Some(span.start..span.start);
        }
        return Some(span);
    }
    Some(span)
}

/// The innermost field whose key or value contains byte `offset`.
pub fn path_at(text: &str, offset: usize) -> Option<FieldPath> {
    let doc = DeTable::parse(text).ok()?;
    let mut best: Option<FieldPath> = None;
    walk_table(doc.get_ref(), FieldPath::root(), offset, &mut best);
    best
}

fn contains(r: &Range<usize>, offset: usize) -> bool {
    r.start <= offset && (offset < r.end || (r.start == r.end && offset == r.start))
}

fn walk_table(t: &DeTable<'_>, path: FieldPath, offset: usize, best: &mut Option<FieldPath>) {
    for (k, v) in t.iter() {
        let p = path.clone().key(k.get_ref());
        if contains(&k.span(), offset) || contains(&v.span(), offset) {
            *best = Some(p.clone());
        }
        walk_value(v.get_ref(), p, offset, best);
    }
}

fn walk_value(v: &DeValue<'_>, path: FieldPath, offset: usize, best: &mut Option<FieldPath>) {
    match v {
        DeValue::Table(t) => walk_table(t, path, offset, best),
        DeValue::Array(a) => {
            for (i, item) in a.iter().enumerate() {
                let p = path.clone().index(i);
                if contains(&item.span(), offset) {
                    *best = Some(p.clone());
                }
                walk_value(item.get_ref(), p, offset, best);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "a = 1\n[t]\nb = 2\n[[h]]\nc = 3\n[[h]]\nc = -4\n";

    #[test]
    fn line_and_column_are_one_based() {
        assert_eq!(line_col(DOC, 0), (1, 1));
        assert_eq!(line_col(DOC, 6), (2, 1));
        assert_eq!(line_col(DOC, 8), (2, 3));
    }

    #[test]
    fn paths_resolve_to_spans_and_back() {
        let p = FieldPath::root().key("h").index(1).key("c");
        assert_eq!(p.to_string(), "h[1].c");
        let span = locate(DOC, &p).unwrap();
        assert_eq!(&DOC[span.clone()], "-4");
        assert_eq!(line_col(DOC, span.start), (7, 5));
        assert_eq!(path_at(DOC, span.start), Some(p));
        let b = FieldPath::root().key("t").key("b");
        assert_eq!(&DOC[locate(DOC, &b).unwrap()], "2");
        assert!(locate(DOC, &FieldPath::root().key("zz")).is_none());
    }
}
