//! A small XML tree for ClickHouse configuration files: names are checked, text is escaped, and
//! the output is deterministic (same tree, same bytes), so hashes over it are stable.

use std::collections::BTreeMap;

use super::super::BuildError;

/// Root element of every generated file. ClickHouse accepts `<clickhouse>` from 22.x on as the
/// documented root, and 18.16 merges `config.d` files with any root name (verified by
/// `tests/model_boot.rs`).
pub const ROOT: &str = "clickhouse";

/// One XML element.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Element {
    name: String,
    attrs: Vec<(String, String)>,
    text: Option<String>,
    children: Vec<Element>,
}

pub use crate::conventions::is_element_name;

impl Element {
    /// An empty element. Names are the operator's own constants; user-given names go through
    /// [`Element::checked`].
    pub fn new(name: &str) -> Self {
        Element {
            name: name.to_string(),
            attrs: Vec::new(),
            text: None,
            children: Vec::new(),
        }
    }

    /// An element whose name comes from user input: an error names `field` when it is not a
    /// valid element name.
    pub fn checked(name: &str, field: &str) -> Result<Self, BuildError> {
        if is_element_name(name) {
            Ok(Element::new(name))
        } else {
            Err(BuildError::InvalidName {
                field: field.to_string(),
                name: name.to_string(),
            })
        }
    }

    /// `<name>text</name>`.
    pub fn leaf(name: &str, text: impl ToString) -> Self {
        Element::new(name).text(text)
    }

    /// Sets the text content.
    pub fn text(mut self, text: impl ToString) -> Self {
        self.text = Some(text.to_string());
        self
    }

    /// Adds an attribute.
    pub fn attr(mut self, name: &str, value: &str) -> Self {
        self.attrs.push((name.to_string(), value.to_string()));
        self
    }

    /// A credential: left out of the copy of the merged configuration the server writes to
    /// `preprocessed_configs/` on its data volume (`hide_in_preprocessed`, 23.8 and later;
    /// older servers ignore the attribute and write it, see SECURITY.md).
    pub fn secret(self) -> Self {
        self.attr("hide_in_preprocessed", "true")
    }

    /// Adds a child.
    pub fn child(mut self, child: Element) -> Self {
        self.children.push(child);
        self
    }

    /// Adds children.
    pub fn children(mut self, children: impl IntoIterator<Item = Element>) -> Self {
        self.children.extend(children);
        self
    }

    /// Elements from `a/b/c → value` paths, merged by common prefix: `logger/level: debug` and
    /// `logger/size: 1M` give one `<logger>` with two children. `field` names the spec field in
    /// errors.
    pub fn from_paths<'a>(
        paths: impl IntoIterator<Item = (&'a str, &'a str)>,
        field: &str,
    ) -> Result<Vec<Element>, BuildError> {
        Element::from_leaves(
            paths.into_iter().map(|(p, v)| (p, Element::leaf("-", v))),
            field,
        )
    }

    /// Elements from `a/b/c → environment variable` paths, as [`Element::from_paths`], each
    /// leaf taking its value from the variable (`from_env`) and hidden from the preprocessed
    /// copy ([`Element::secret`]).
    pub fn from_env_paths<'a>(
        paths: impl IntoIterator<Item = (&'a str, &'a str)>,
        field: &str,
    ) -> Result<Vec<Element>, BuildError> {
        Element::from_leaves(
            paths
                .into_iter()
                .map(|(p, var)| (p, Element::new("-").attr("from_env", var).secret())),
            field,
        )
    }

    /// Elements from `a/b/c → leaf` paths (the leaf's name is replaced by the last element).
    fn from_leaves<'a>(
        paths: impl IntoIterator<Item = (&'a str, Element)>,
        field: &str,
    ) -> Result<Vec<Element>, BuildError> {
        #[derive(Default)]
        struct Node {
            leaf: Option<Element>,
            children: BTreeMap<String, Node>,
        }
        let mut root = Node::default();
        for (path, leaf) in paths {
            let mut node = &mut root;
            for part in path.split('/') {
                if !is_element_name(part) {
                    return Err(BuildError::InvalidName {
                        field: field.to_string(),
                        name: path.to_string(),
                    });
                }
                node = node.children.entry(part.to_string()).or_default();
            }
            node.leaf = Some(leaf);
        }
        fn build(name: &str, node: Node) -> Element {
            let mut e = Element::new(name);
            if let Some(leaf) = node.leaf {
                e.text = leaf.text;
                e.attrs = leaf.attrs;
            }
            e.children = node
                .children
                .into_iter()
                .map(|(n, c)| build(&n, c))
                .collect();
            e
        }
        Ok(root
            .children
            .into_iter()
            .map(|(n, c)| build(&n, c))
            .collect())
    }

    /// The element as a document with an XML declaration.
    pub fn to_document(&self) -> String {
        let mut out = String::from("<?xml version=\"1.0\"?>\n");
        self.write(&mut out, 0);
        out
    }

    fn write(&self, out: &mut String, depth: usize) {
        let indent = "    ".repeat(depth);
        out.push_str(&indent);
        out.push('<');
        out.push_str(&self.name);
        for (k, v) in &self.attrs {
            out.push_str(&format!(" {k}=\"{}\"", escape(v)));
        }
        match (&self.text, self.children.is_empty()) {
            (None, true) => out.push_str("/>\n"),
            (Some(t), true) => out.push_str(&format!(">{}</{}>\n", escape(t), self.name)),
            (text, false) => {
                out.push_str(">\n");
                if let Some(t) = text {
                    out.push_str(&format!("{indent}    {}\n", escape(t)));
                }
                for c in &self.children {
                    c.write(out, depth + 1);
                }
                out.push_str(&format!("{indent}</{}>\n", self.name));
            }
        }
    }
}

/// Escapes text and attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_and_the_document_parses() {
        let doc = Element::new(ROOT)
            .child(Element::leaf("a", "<x> & \"y\""))
            .child(Element::new("b").attr("replace", "replace"))
            .to_document();
        let parsed = roxmltree::Document::parse(&doc).unwrap();
        let a = parsed.descendants().find(|n| n.has_tag_name("a")).unwrap();
        assert_eq!(a.text(), Some("<x> & \"y\""));
    }

    #[test]
    fn paths_merge_by_prefix_and_bad_names_are_errors() {
        let els = Element::from_paths(
            [("logger/level", "debug"), ("logger/size", "1M"), ("x", "1")],
            "f",
        )
        .unwrap();
        assert_eq!(els.len(), 2);
        let doc = Element::new(ROOT).children(els).to_document();
        assert_eq!(doc.matches("<logger>").count(), 1);
        assert!(matches!(
            Element::from_paths([("1bad", "x")], "spec.configuration.settings"),
            Err(BuildError::InvalidName { .. })
        ));
        assert!(Element::checked("a b", "f").is_err());
        assert!(Element::checked("user_1.x-y", "f").is_ok());
    }
}
