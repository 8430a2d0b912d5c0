//! ARCHITECTURE.md stays the map of the code: every file under `src/` and
//! `lua/` is named in it, every path it names exists, every Lua script is
//! in its key and script table, and no source files import each other in a
//! circle (of any length: each file's imports lead only to lower layers).
//!
//! Pure file reading: no Redis, no build of anything.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn architecture() -> String {
    fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md at the root")
}

/// Every file under `dir` (relative to the root), recursively, sorted.
fn files(dir: &str) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&root().join(dir), &mut out);
    out.sort();
    out
}

/// `path` relative to `base` (under the root), with `/` separators.
fn relative(path: &Path, base: &str) -> String {
    let rel = path.strip_prefix(root().join(base)).unwrap();
    rel.components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join("/")
}

/// The text between backticks, everywhere in `doc`.
fn code_spans(doc: &str) -> Vec<&str> {
    doc.split('`').skip(1).step_by(2).collect()
}

#[test]
fn every_source_file_and_script_is_named_in_architecture_md() {
    let doc = architecture();
    let spans: BTreeSet<&str> = code_spans(&doc).into_iter().collect();
    let mut missing = Vec::new();
    for f in files("src") {
        // Source files are named relative to `src/`: `queue/keys.rs`.
        let rel = relative(&f, "src");
        if !spans.contains(rel.as_str()) {
            missing.push(format!("src/{rel} (name it as `{rel}`)"));
        }
    }
    for f in files("lua") {
        let rel = format!("lua/{}", relative(&f, "lua"));
        let name = relative(&f, "lua");
        if !spans.contains(rel.as_str()) && !spans.contains(name.as_str()) {
            missing.push(rel);
        }
    }
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md does not name these files; add each to the code map:\n  {}",
        missing.join("\n  ")
    );
}

#[test]
fn every_path_architecture_md_names_exists() {
    let doc = architecture();
    let mut gone = Vec::new();
    for span in code_spans(&doc) {
        // A glob (`lua/*.lua`) names no one file.
        let looks_like_a_path = !span.contains(' ')
            && !span.contains('*')
            && span.contains('/')
            && (span.ends_with(".rs") || span.ends_with(".lua") || span.ends_with('/'));
        if !looks_like_a_path {
            continue;
        }
        // Paths are relative to `src/`, or to the root for the rest.
        let found = root().join("src").join(span).exists() || root().join(span).exists();
        if !found {
            gone.push(span.to_owned());
        }
    }
    assert!(
        gone.is_empty(),
        "ARCHITECTURE.md names paths that do not exist (renamed or removed?):\n  {}",
        gone.join("\n  ")
    );
}

#[test]
fn every_lua_script_is_in_the_key_and_script_table() {
    let doc = architecture();
    let section = doc
        .split("\n## Redis keys and scripts")
        .nth(1)
        .expect("a section `## Redis keys and scripts`");
    let section = section.split("\n## ").next().unwrap();
    let table: String = section
        .lines()
        .filter(|l| l.starts_with('|'))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(!table.is_empty(), "the section has no table");
    let missing: Vec<String> = files("lua")
        .iter()
        .map(|f| relative(f, "lua"))
        .filter(|name| !table.contains(&format!("`{name}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "scripts missing from the key and script table of ARCHITECTURE.md: {missing:?}"
    );
}

/// The crate's modules: module path (`crate::queue::keys`) → file (relative
/// to `src/`). The binary is a crate of its own and is left out.
fn modules() -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for f in files("src") {
        let rel = relative(&f, "src");
        if rel.starts_with("bin/") || !rel.ends_with(".rs") {
            continue;
        }
        let mut parts: Vec<&str> = rel.trim_end_matches(".rs").split('/').collect();
        if matches!(parts.last(), Some(&"mod") | Some(&"lib")) {
            parts.pop();
        }
        let mut path = vec!["crate"];
        path.extend(parts);
        out.insert(path.join("::"), rel);
    }
    out
}

/// `source` without comments, string literals and its `#[cfg(test)] mod
/// tests { … }` (whose `super` is the file's own module).
fn code_of(source: &str) -> String {
    // `#[cfg(test)]`, `#[cfg(all(test, not(redwheel_loom)))]`…, then `mod tests {`.
    let tests_at = source.match_indices("mod tests {").find_map(|(i, _)| {
        let attr = source[..i].trim_end();
        (attr.ends_with(")]") && attr[attr.rfind("#[cfg(")?..].contains("test")).then_some(i)
    });
    let source = match tests_at {
        Some(i) => &source[..i],
        None => source,
    };
    let mut out = String::with_capacity(source.len());
    for line in source.lines() {
        let mut in_string = false;
        let mut prev = ' ';
        let mut kept = String::new();
        for (i, c) in line.char_indices() {
            if !in_string && line[i..].starts_with("//") {
                break;
            }
            if c == '"' && prev != '\\' {
                in_string = !in_string;
            } else if !in_string {
                kept.push(c);
            }
            prev = c;
        }
        out.push_str(&kept);
        out.push('\n');
    }
    out
}

/// The paths in `code` that start at `crate`, `super` or `self`, with
/// braces expanded: `use super::{a, b::C}` gives `super::a`, `super::b::C`.
///
/// A path inside an inline module (`mod sealed { use super::X; }`) is read
/// as if written at the file's level: one `super` per enclosing inline
/// module is dropped (and a `self::` gains the inline modules' names).
fn paths(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let bytes: Vec<char> = code.chars().collect();
    // Brace depth, and the names and depths of the inline modules we are in.
    let mut depth = 0usize;
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            '{' => depth += 1,
            '}' => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
            }
            _ => {}
        }
        let starts_word = i == 0 || !(bytes[i - 1].is_alphanumeric() || bytes[i - 1] == '_');
        if starts_word && bytes[i..].starts_with(&['m', 'o', 'd', ' ']) {
            let mut j = i + 4;
            let start = j;
            while j < bytes.len() && (bytes[j].is_alphanumeric() || bytes[j] == '_') {
                j += 1;
            }
            let name: String = bytes[start..j].iter().collect();
            while j < bytes.len() && bytes[j].is_whitespace() {
                j += 1;
            }
            if !name.is_empty() && j < bytes.len() && bytes[j] == '{' {
                inline.push((name, depth));
                depth += 1;
                i = j + 1;
                continue;
            }
        }
        let rest: String = bytes[i..bytes.len().min(i + 8)].iter().collect();
        let head = ["crate::", "super::", "self::"]
            .into_iter()
            .find(|h| rest.starts_with(h));
        match head {
            Some(_) if starts_word => {
                let (found, end) = read_tree(&bytes, i);
                for mut p in found {
                    match p.first().map(String::as_str) {
                        Some("super") if !inline.is_empty() => {
                            let drop_n = inline
                                .len()
                                .min(p.iter().take_while(|x| *x == "super").count());
                            let mut kept: Vec<String> = inline[..inline.len() - drop_n]
                                .iter()
                                .map(|(n, _)| n.clone())
                                .collect();
                            p.drain(..drop_n);
                            if p.first().map(String::as_str) == Some("super") {
                                kept.clear();
                            }
                            p = if kept.is_empty() {
                                if p.first().map(String::as_str) == Some("super") {
                                    p
                                } else {
                                    std::iter::once("self".to_owned()).chain(p).collect()
                                }
                            } else {
                                std::iter::once("self".to_owned())
                                    .chain(kept)
                                    .chain(p)
                                    .collect()
                            };
                        }
                        Some("self") if !inline.is_empty() => {
                            p = std::iter::once("self".to_owned())
                                .chain(inline.iter().map(|(n, _)| n.clone()))
                                .chain(p.into_iter().skip(1))
                                .collect();
                        }
                        _ => {}
                    }
                    out.push(p);
                }
                i = end.max(i + 1);
            }
            _ => i += 1,
        }
    }
    out
}

/// Reads a path tree (`a::b::{c, d::{e}}`) starting at `i`; the paths and
/// where it ended.
fn read_tree(s: &[char], mut i: usize) -> (Vec<Vec<String>>, usize) {
    let mut prefix = Vec::new();
    loop {
        while i < s.len() && s[i].is_whitespace() {
            i += 1;
        }
        if i < s.len() && s[i] == '{' {
            let mut out = Vec::new();
            i += 1;
            loop {
                while i < s.len() && (s[i].is_whitespace() || s[i] == ',') {
                    i += 1;
                }
                if i >= s.len() || s[i] == '}' {
                    return (out, i + 1);
                }
                let (inner, end) = read_tree(s, i);
                for p in inner {
                    let mut full = prefix.clone();
                    if p != ["self"] {
                        full.extend(p);
                    }
                    out.push(full);
                }
                i = end;
            }
        }
        let start = i;
        while i < s.len() && (s[i].is_alphanumeric() || s[i] == '_') {
            i += 1;
        }
        if start == i {
            return (vec![prefix], i);
        }
        prefix.push(s[start..i].iter().collect::<String>());
        if s[i..].starts_with(&[':', ':']) {
            i += 2;
        } else {
            return (vec![prefix], i);
        }
    }
}

/// `code` of a folder's front door (`mod.rs`, `lib.rs`) without its
/// re-exports: a `pub use` there draws no arrow (a file that names an item
/// through its parent's re-export points at the parent).
fn without_reexports(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = ["pub use ", "pub(crate) use ", "pub(super) use "]
        .iter()
        .filter_map(|h| {
            rest.match_indices(h)
                .find(|(i, _)| {
                    *i == 0 || !rest[..*i].ends_with(|c: char| c.is_alphanumeric() || c == '_')
                })
                .map(|(i, _)| i)
        })
        .min()
    {
        out.push_str(&rest[..at]);
        rest = match rest[at..].find(';') {
            Some(end) => &rest[at + end + 1..],
            None => "",
        };
    }
    out.push_str(rest);
    out
}

/// Who imports whom: file (relative to `src/`) → the files it names an item
/// of. An arrow is a `use` or an inline `crate::`/`super::`/`self::` path
/// naming an item of another file; a front door's `pub use` re-exports and
/// `mod` lines draw none (as `shared/tools/import-circles.py` reads them).
fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let modules = modules();
    let mut deps = BTreeMap::new();
    for (module, file) in &modules {
        let mut code = code_of(&fs::read_to_string(root().join("src").join(file)).unwrap());
        if file.ends_with("mod.rs") || file == "lib.rs" {
            code = without_reexports(&code);
        }
        let here: Vec<&str> = module.split("::").collect();
        let mut found = BTreeSet::new();
        for path in paths(&code) {
            let mut base: Vec<&str> = Vec::new();
            let mut rest = path.iter().map(String::as_str).peekable();
            match rest.peek() {
                Some(&"crate") => {
                    base.push("crate");
                    rest.next();
                }
                Some(&"self") => {
                    base.extend(&here);
                    rest.next();
                }
                Some(&"super") => {
                    base.extend(&here);
                    while rest.peek() == Some(&"super") {
                        base.pop();
                        rest.next();
                    }
                }
                _ => continue,
            }
            base.extend(rest);
            // The longest prefix that is a module of the crate.
            if let Some(target) = (1..=base.len())
                .rev()
                .map(|k| base[..k].join("::"))
                .find(|m| modules.contains_key(m))
                && target != *module
            {
                found.insert(modules[&target].clone());
            }
        }
        deps.insert(file.clone(), found);
    }
    deps
}

/// The import circles of `deps`: its strongly connected components of more
/// than one file (Tarjan's algorithm), each sorted, in a sorted list.
fn circles(deps: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Tarjan<'a> {
        deps: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    impl<'a> Tarjan<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.deps.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(lw);
                } else if self.on_stack.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                loop {
                    let w = self.stack.pop().unwrap();
                    self.on_stack.remove(w);
                    component.push(w.to_owned());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.out.push(component);
                }
            }
        }
    }
    let mut t = Tarjan {
        deps,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in deps.keys() {
        if !t.index.contains_key(v.as_str()) {
            t.visit(v);
        }
    }
    t.out.sort();
    t.out
}

#[test]
fn no_source_files_import_each_other_in_a_circle() {
    let found = circles(&imports());
    let listed: Vec<String> = found
        .iter()
        .map(|c| format!("{} files: {}", c.len(), c.join(", ")))
        .collect();
    assert!(
        found.is_empty(),
        "these files import each other in a circle (of any length); make the \
         files of each one layers, a file importing only lower ones:\n  {}",
        listed.join("\n  ")
    );
}

#[test]
fn a_circle_of_any_length_is_found_and_a_chain_is_not() {
    let deps = |edges: &[(&str, &str)]| {
        let mut d: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in edges {
            d.entry(a.to_string()).or_default().insert(b.to_string());
            d.entry(b.to_string()).or_default();
        }
        d
    };
    // a → b → c → a (no two import each other), and d ↔ e; f hangs off both.
    let found = circles(&deps(&[
        ("a", "b"),
        ("b", "c"),
        ("c", "a"),
        ("d", "e"),
        ("e", "d"),
        ("f", "a"),
        ("c", "f2"),
        ("f", "d"),
    ]));
    assert_eq!(found, [vec!["a", "b", "c"], vec!["d", "e"]]);
    // A chain and a diamond: layers, no circle.
    let found = circles(&deps(&[("a", "b"), ("b", "c"), ("a", "c"), ("c", "d")]));
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn a_front_door_reexport_draws_no_arrow() {
    let code =
        "pub use self::a::A;\n#[cfg(x)]\npub(crate) use self::b::{B,\n C};\nuse self::c::D;\n";
    assert_eq!(without_reexports(code), "\n#[cfg(x)]\n\nuse self::c::D;\n");
}

#[test]
fn the_import_reader_expands_braces_and_skips_comments_strings_and_tests() {
    let code = code_of(
        "use super::{a, b::{C, self}};\n// use crate::x;\nlet s = \"crate::y\";\n\
         f(crate::z::w());\n#[cfg(test)]\nmod tests {\n    use super::*;\n}\n",
    );
    let found: Vec<String> = paths(&code).iter().map(|p| p.join("::")).collect();
    assert_eq!(
        found,
        ["super::a", "super::b::C", "super::b", "crate::z::w"]
    );
    // Inside an inline module, `super` is the file's own module.
    let code = code_of(
        "mod sealed {\n    pub use super::parker::P;\n    use super::super::x::Y;\n}\n\
         use super::z;\n#[cfg(all(test, not(redwheel_loom)))]\nmod tests {\n    use super::*;\n}\n",
    );
    let found: Vec<String> = paths(&code).iter().map(|p| p.join("::")).collect();
    assert_eq!(found, ["self::parker::P", "super::x::Y", "super::z"]);
}
