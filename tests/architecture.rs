//! ARCHITECTURE.md stays the map of the code: every file under `src/` and
//! `lua/` is named in it, every path it names exists, every Lua script is
//! in its key and script table, and no two source files import each other.
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

/// Pairs of files that import each other today and are being taken apart
/// elsewhere (the timer's split, issue 19). A pair that no longer imports
/// each other must leave this list; no pair may join it.
const KNOWN_MUTUAL: &[(&str, &str)] = &[];

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

#[test]
fn no_two_source_files_import_each_other() {
    let modules = modules();
    let mut deps: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (module, file) in &modules {
        let code = code_of(&fs::read_to_string(root().join("src").join(file)).unwrap());
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
                found.insert(modules[&target].as_str());
            }
        }
        deps.insert(file.as_str(), found);
    }
    let mut mutual = Vec::new();
    for (a, ds) in &deps {
        for b in ds {
            if a < b && deps.get(b).is_some_and(|d| d.contains(a)) {
                mutual.push((a.to_string(), b.to_string()));
            }
        }
    }
    let known: BTreeSet<(String, String)> = KNOWN_MUTUAL
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    let new: Vec<_> = mutual.iter().filter(|p| !known.contains(*p)).collect();
    assert!(
        new.is_empty(),
        "these files import each other; make one of them the lower layer: {new:?}"
    );
    let mended: Vec<_> = known.iter().filter(|p| !mutual.contains(p)).collect();
    assert!(
        mended.is_empty(),
        "these pairs no longer import each other; remove them from KNOWN_MUTUAL: {mended:?}"
    );
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
