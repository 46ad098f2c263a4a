//! The docs hold together.
//!
//! - Every relative link in README.md, CHANGELOG.md, benches/MEASUREMENTS.md and docs/*.md
//!   names a file or folder that exists and, when it has a `#fragment` into a markdown file,
//!   one of that file's anchors: a heading's GitHub slug (lower case, punctuation dropped,
//!   spaces to `-`, `-1`, `-2`, ... for repeats) or an `<a id="...">`.
//! - Every behaviour contract docs/rules.list names is where it says: the anchor exists and
//!   the rule's opening words follow it, before the next anchor or heading. So a rule moved
//!   out of the README, or written in docs/ since, cannot be dropped without dropping its
//!   line too. Every `<a id>` of docs/decisions.md has its line.
//! - include/skv.h's comments send the reader to docs/ for the long explanations: every
//!   `docs/NAME.md` or `docs/NAME.md#fragment` they name resolves, and no comment line passes
//!   100 columns.
//!
//! The checks read files through `Files`, so the tests at the end run them on texts with a
//! broken link or a deleted rule and see them fail.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

/// What the checks read: the repository, or a set of texts in memory.
trait Files {
    fn read(&self, path: &Path) -> Option<String>;
    fn exists(&self, path: &Path) -> bool;
}

/// The repository on disk; paths are relative to its root.
struct Repo(PathBuf);

impl Files for Repo {
    fn read(&self, path: &Path) -> Option<String> {
        std::fs::read_to_string(self.0.join(path)).ok()
    }
    fn exists(&self, path: &Path) -> bool {
        self.0.join(path).exists()
    }
}

fn repo() -> Repo {
    Repo(PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// The markdown files whose links are checked.
fn doc_files(repo: &Repo) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> =
        ["README.md", "CHANGELOG.md", "benches/MEASUREMENTS.md"].iter().map(PathBuf::from).collect();
    let mut pages: Vec<PathBuf> = std::fs::read_dir(repo.0.join("docs"))
        .expect("docs/ can be listed")
        .map(|e| PathBuf::from("docs").join(e.expect("a docs/ entry").file_name()))
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.sort();
    files.extend(pages);
    files
}

/// A place a `#fragment` can name: a heading, or an `<a id>` tag (`tag`).
struct Anchor {
    id: String,
    tag: bool,
    /// Where the heading line or the tag starts.
    start: usize,
    /// Where the text it heads starts: after the heading line, or after the tag.
    at: usize,
}

/// Lines outside fenced code blocks, each with its byte offset and line number (1-based).
fn prose_lines(md: &str) -> Vec<(usize, usize, &str)> {
    let mut out = Vec::new();
    let mut fence: Option<&str> = None;
    let mut offset = 0;
    for (n, line) in md.split_inclusive('\n').enumerate() {
        let start = offset;
        offset += line.len();
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
        match (fence, marker) {
            (None, Some(m)) => fence = Some(m),
            (Some(f), Some(m)) if f == m => fence = None,
            (None, None) => out.push((start, n + 1, line.trim_end_matches(['\n', '\r']))),
            _ => {}
        }
    }
    out
}

/// A heading's text as GitHub renders it for its slug: links as their text, no HTML tags.
fn heading_text(raw: &str) -> String {
    let mut text = String::new();
    let mut rest = raw;
    while let Some(i) = rest.find(['[', '<']) {
        text.push_str(&rest[..i]);
        rest = &rest[i..];
        let tag_end = rest.strip_prefix('<').and_then(|r| r.find('>')).map(|e| e + 2);
        let link = rest.find("](").and_then(|m| Some((m, m + 2 + rest[m + 2..].find(')')? + 1)));
        match (tag_end, link) {
            (Some(end), _) => rest = &rest[end..],
            (None, Some((mid, end))) if rest.starts_with('[') => {
                text.push_str(&rest[1..mid]);
                rest = &rest[end..];
            }
            _ => {
                text.push_str(&rest[..1]);
                rest = &rest[1..];
            }
        }
    }
    text.push_str(rest);
    text
}

/// GitHub's slug of a heading (without the suffix for repeats).
fn slug(heading: &str) -> String {
    heading_text(heading)
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '_' || c == '-' => Some(c),
            _ => None,
        })
        .collect()
}

/// Every anchor of a markdown text, in the order they appear.
fn anchors(md: &str) -> Vec<Anchor> {
    let mut out = Vec::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for (start, _, line) in prose_lines(md) {
        let hashes = line.len() - line.trim_start_matches('#').len();
        if (1..=6).contains(&hashes) && line[hashes..].starts_with(' ') {
            let base = slug(line[hashes..].trim().trim_end_matches('#'));
            let repeats = seen.entry(base.clone()).or_insert(0);
            let id = if *repeats == 0 { base } else { format!("{base}-{repeats}") };
            *repeats += 1;
            out.push(Anchor { id, tag: false, start, at: start + line.len() });
        }
        for attr in ["<a id=\"", "<a name=\""] {
            let mut from = 0;
            while let Some(i) = line[from..].find(attr) {
                let id_start = from + i + attr.len();
                let Some(len) = line[id_start..].find('"') else { break };
                let tag_end = line[id_start..].find('>').map_or(line.len(), |e| id_start + e + 1);
                let close = if line[tag_end..].starts_with("</a>") { tag_end + 4 } else { tag_end };
                let id = line[id_start..id_start + len].to_string();
                out.push(Anchor { id, tag: true, start: start + from + i, at: start + close });
                from = close;
            }
        }
    }
    out
}

/// The text an anchor heads: up to the next anchor (a heading or a tag).
fn block<'a>(md: &'a str, all: &[Anchor], id: &str) -> Option<&'a str> {
    let from = all.iter().find(|a| a.id == id)?.at;
    let end = all.iter().map(|a| a.start).filter(|&s| s >= from).min().unwrap_or(md.len());
    Some(&md[from..end])
}

/// `line` without its inline code spans.
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(i) = rest.find('`') {
        out.push_str(&rest[..i]);
        let ticks = rest[i..].len() - rest[i..].trim_start_matches('`').len();
        let fence = &rest[i..i + ticks];
        match rest[i + ticks..].find(fence) {
            Some(end) => rest = &rest[i + ticks + end + ticks..],
            None => {
                // an unclosed run is literal text
                out.push_str(fence);
                rest = &rest[i + ticks..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The link targets of a markdown text, each with its line number: inline links and images
/// (`[text](target "title")`) and reference definitions (`[name]: target`).
fn links(md: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (_, n, line) in prose_lines(md) {
        let line = without_code_spans(line);
        let trimmed = line.trim_start();
        if trimmed.starts_with('[') {
            if let Some(def) = trimmed.find("]:") {
                if let Some(target) = trimmed[def + 2..].split_whitespace().next() {
                    out.push((n, target.trim_matches(['<', '>']).to_string()));
                    continue;
                }
            }
        }
        let mut rest = line.as_str();
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let target = if let Some(angled) = after.strip_prefix('<') {
                angled.split('>').next().unwrap_or("").to_string()
            } else {
                let mut depth = 0usize;
                let end = after
                    .char_indices()
                    .find(|&(_, c)| match c {
                        '(' => {
                            depth += 1;
                            false
                        }
                        ')' if depth == 0 => true,
                        ')' => {
                            depth -= 1;
                            false
                        }
                        c => c.is_whitespace(),
                    })
                    .map_or(after.len(), |(e, _)| e);
                after[..end].to_string()
            };
            out.push((n, target));
            rest = after;
        }
    }
    out
}

/// `path` with `.` and `..` folded away (`None` when it climbs out of the repository).
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::Normal(p) => out.push(p),
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// Every broken relative link of `files`, one line each.
fn broken_links(fs: &dyn Files, files: &[PathBuf]) -> Vec<String> {
    let mut errors = Vec::new();
    for file in files {
        let Some(text) = fs.read(file) else {
            errors.push(format!("{}: cannot be read", file.display()));
            continue;
        };
        for (line, target) in links(&text) {
            let here = format!("{}:{line}: link {target}", file.display());
            let scheme = target.find(':').is_some_and(|c| !target[..c].contains(['/', '#']));
            if target.is_empty() || scheme {
                if target.is_empty() {
                    errors.push(format!("{here}: empty target"));
                }
                continue;
            }
            let (path, fragment) = match target.split_once('#') {
                Some((p, f)) => (p, Some(f)),
                None => (target.as_str(), None),
            };
            let dir = file.parent().unwrap_or(Path::new(""));
            let resolved = if path.is_empty() { Some(file.clone()) } else { normalize(&dir.join(path)) };
            let Some(resolved) = resolved else {
                errors.push(format!("{here}: leaves the repository"));
                continue;
            };
            if !fs.exists(&resolved) {
                errors.push(format!("{here}: {} does not exist", resolved.display()));
                continue;
            }
            let Some(fragment) = fragment else { continue };
            if resolved.extension().is_none_or(|e| e != "md") {
                continue; // a line of a source file, say: GitHub's, not checked here
            }
            let target_text = fs.read(&resolved).unwrap_or_default();
            if !anchors(&target_text).iter().any(|a| a.id == fragment) {
                errors.push(format!("{here}: {} has no heading or anchor #{fragment}", resolved.display()));
            }
        }
    }
    errors
}

/// Every `docs/NAME.md[#fragment]` (or folder, `docs/`) a C header's text names that does not
/// resolve, one line each.
fn broken_header_links(fs: &dyn Files, header: &str) -> Vec<String> {
    let mut errors = Vec::new();
    for (n, line) in header.lines().enumerate() {
        let mut rest = line;
        while let Some(at) = rest.find("docs/") {
            let tail = &rest[at..];
            let len = tail.find(|c: char| !(c.is_ascii_alphanumeric() || "/.-_#".contains(c))).unwrap_or(tail.len());
            rest = &tail[len..];
            let target = tail[..len].trim_end_matches('.');
            let (path, fragment) = target.split_once('#').map_or((target, None), |(p, f)| (p, Some(f)));
            let here = format!("include/skv.h:{}: {target}", n + 1);
            if !(path.ends_with(".md") || path.ends_with('/')) || !fs.exists(Path::new(path)) {
                errors.push(format!("{here}: no such page"));
                continue;
            }
            let Some(fragment) = fragment else { continue };
            if !anchors(&fs.read(Path::new(path)).unwrap_or_default()).iter().any(|a| a.id == fragment) {
                errors.push(format!("{here}: {path} has no heading or anchor #{fragment}"));
            }
        }
    }
    errors
}

/// The lines of a C header's comments (`/* ... */` and `//`) longer than `max` columns.
fn long_comment_lines(header: &str, max: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut open = false;
    for (n, line) in header.lines().enumerate() {
        let starts = line.trim_start().starts_with("/*");
        let comment = open || starts || line.contains("//");
        if comment && line.chars().count() > max {
            out.push(format!("include/skv.h:{}: {} columns", n + 1, line.chars().count()));
        }
        open = (open || starts) && !line.trim_end().ends_with("*/");
    }
    out
}

/// Whitespace runs as one space, so a phrase matches however the text is wrapped.
fn squeeze(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Every rule of `list` (docs/rules.list's format) that is not where it says, one line each;
/// and every `<a id>` of `index` (docs/decisions.md) that the list leaves out.
fn missing_rules(fs: &dyn Files, list: &str, index: &Path) -> Vec<String> {
    let mut errors = Vec::new();
    let mut listed: BTreeSet<(PathBuf, String)> = BTreeSet::new();
    let mut texts: BTreeMap<PathBuf, Option<String>> = BTreeMap::new();
    for (n, line) in list.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let here = format!("docs/rules.list:{}", n + 1);
        let Some((location, phrase)) = line.split_once(' ') else {
            errors.push(format!("{here}: not `FILE#ANCHOR the rule's opening words`"));
            continue;
        };
        let Some((file, id)) = location.split_once('#') else {
            errors.push(format!("{here}: {location} names no anchor"));
            continue;
        };
        let file = PathBuf::from(file);
        listed.insert((file.clone(), id.to_string()));
        let Some(text) = texts.entry(file.clone()).or_insert_with(|| fs.read(&file)) else {
            errors.push(format!("{here}: {} cannot be read", file.display()));
            continue;
        };
        match block(text, &anchors(text), id) {
            None => errors.push(format!("{here}: {} has no anchor #{id} (a rule deleted?)", file.display())),
            Some(body) if !squeeze(body).contains(&squeeze(phrase)) => errors.push(format!(
                "{here}: {}#{id} no longer says \"{}\" (a rule deleted or reworded?)",
                file.display(),
                phrase.trim()
            )),
            Some(_) => {}
        }
    }
    match fs.read(index) {
        None => errors.push(format!("{}: cannot be read", index.display())),
        Some(text) => {
            for anchor in anchors(&text) {
                if anchor.tag && !listed.contains(&(index.to_path_buf(), anchor.id.clone())) {
                    errors.push(format!("{}#{}: a rule docs/rules.list does not name", index.display(), anchor.id));
                }
            }
        }
    }
    errors
}

#[test]
fn every_relative_link_resolves() {
    let repo = repo();
    let errors = broken_links(&repo, &doc_files(&repo));
    assert!(errors.is_empty(), "broken links:\n  {}", errors.join("\n  "));
}

#[test]
fn every_rule_is_still_in_the_docs() {
    let repo = repo();
    let list = repo.read(Path::new("docs/rules.list")).expect("docs/rules.list");
    let errors = missing_rules(&repo, &list, Path::new("docs/decisions.md"));
    assert!(errors.is_empty(), "docs/rules.list:\n  {}", errors.join("\n  "));
    let rules = list.lines().filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#')).count();
    assert!(rules >= 30, "docs/rules.list names {rules} rules; the README alone moved more");
}

#[test]
fn the_header_s_doc_links_resolve_and_its_comments_fit_100_columns() {
    let repo = repo();
    let header = repo.read(Path::new("include/skv.h")).expect("include/skv.h");
    let errors = broken_header_links(&repo, &header);
    assert!(errors.is_empty(), "include/skv.h names docs that do not exist:\n  {}", errors.join("\n  "));
    assert!(header.contains("docs/operations.md"), "the header sends its reader to docs/");
    let long = long_comment_lines(&header, 100);
    assert!(long.is_empty(), "include/skv.h comment lines past 100 columns:\n  {}", long.join("\n  "));
}

/// Every name the header defines is libskv's: a macro without the `SKV_` prefix would collide
/// with an including program's own (`SESSION`, `PAGE_SIZE`, ...).
#[test]
fn every_macro_the_header_defines_is_prefixed() {
    let header = repo().read(Path::new("include/skv.h")).expect("include/skv.h");
    let bare: Vec<&str> = header
        .lines()
        .filter_map(|l| l.strip_prefix("#define "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| !name.starts_with("SKV_"))
        .collect();
    assert!(bare.is_empty(), "include/skv.h defines names without the SKV_ prefix: {bare:?}");
}

// The checks themselves, on the repository's texts with one thing broken.

/// The repository with some files' texts replaced.
struct Edited<'a> {
    repo: &'a Repo,
    texts: BTreeMap<PathBuf, String>,
}

impl Files for Edited<'_> {
    fn read(&self, path: &Path) -> Option<String> {
        self.texts.get(path).cloned().or_else(|| self.repo.read(path))
    }
    fn exists(&self, path: &Path) -> bool {
        self.texts.contains_key(path) || self.repo.exists(path)
    }
}

fn edited<'a>(repo: &'a Repo, file: &str, from: &str, to: &str) -> Edited<'a> {
    let text = repo.read(Path::new(file)).unwrap_or_else(|| panic!("{file}"));
    assert!(text.contains(from), "{file} no longer holds {from:?}: pick another edit for this test");
    Edited { repo, texts: BTreeMap::from([(PathBuf::from(file), text.replacen(from, to, 1))]) }
}

#[test]
fn a_link_to_a_missing_file_fails() {
    let repo = repo();
    let fs = edited(&repo, "README.md", "(docs/conventions.md)", "(docs/convention.md)");
    let errors = broken_links(&fs, &[PathBuf::from("README.md")]);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].contains("docs/convention.md does not exist"), "{}", errors[0]);
}

#[test]
fn a_link_to_a_missing_heading_fails() {
    let repo = repo();
    let fs = edited(&repo, "docs/external-mode.md", "## What a callback may call", "## What callbacks may call");
    let errors = broken_links(&fs, &[PathBuf::from("docs/decisions.md")]);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].contains("docs/external-mode.md has no heading or anchor #what-a-callback-may-call"),
        "{}",
        errors[0]
    );
}

#[test]
fn a_deleted_rule_fails() {
    let repo = repo();
    let list = repo.read(Path::new("docs/rules.list")).expect("docs/rules.list");
    let index = Path::new("docs/decisions.md");
    let text = repo.read(index).expect("docs/decisions.md");
    // the whole bullet: from its anchor to the next one
    let start = text.find("- <a id=\"row-belongs-to-one-slot\">").expect("the rule");
    let end = start + 2 + text[start + 2..].find("- <a id=").expect("a rule after it");
    let mut cut = text.clone();
    cut.replace_range(start..end, "");
    let fs = Edited { repo: &repo, texts: BTreeMap::from([(index.to_path_buf(), cut)]) };
    let errors = missing_rules(&fs, &list, index);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].contains("no anchor #row-belongs-to-one-slot"), "{}", errors[0]);
}

#[test]
fn a_rule_whose_words_went_fails() {
    let repo = repo();
    let from = "A first turn finishing on a row another session's slot holds";
    let fs = edited(&repo, "docs/decisions.md", from, "A first turn may finish on any row");
    let list = repo.read(Path::new("docs/rules.list")).expect("docs/rules.list");
    let errors = missing_rules(&fs, &list, Path::new("docs/decisions.md"));
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].contains("row-belongs-to-one-slot no longer says"), "{}", errors[0]);
}

#[test]
fn a_rule_the_list_leaves_out_fails() {
    let repo = repo();
    let list = repo.read(Path::new("docs/rules.list")).expect("docs/rules.list");
    let kept: String = list.lines().filter(|l| !l.contains("#set-hooks-null ")).map(|l| format!("{l}\n")).collect();
    let errors = missing_rules(&repo, &kept, Path::new("docs/decisions.md"));
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].contains("#set-hooks-null: a rule docs/rules.list does not name"), "{}", errors[0]);
}

#[test]
fn a_header_link_to_a_missing_page_or_heading_or_a_long_comment_line_fails() {
    let repo = repo();
    let e = broken_header_links(&repo, " * (docs/nowhere.md, docs/hybrid.md#no-such-heading).\n");
    assert_eq!(e.len(), 2, "{e:?}");
    assert!(e[0].contains("docs/nowhere.md: no such page"), "{e:?}");
    assert!(e[1].contains("docs/hybrid.md has no heading or anchor #no-such-heading"), "{e:?}");
    assert!(broken_header_links(&repo, " * docs/hybrid.md#the-window-step.\n").is_empty());
    let wide = format!("/**\n * {}\n */\nint f(void); {}\n", "x".repeat(98), "y".repeat(100));
    assert_eq!(long_comment_lines(&wide, 100), ["include/skv.h:2: 101 columns"]);
}

#[test]
fn slugs_are_githubs() {
    assert_eq!(slug("`skv_hand_back(c, session_id, branch_id, req)`"), "skv_hand_backc-session_id-branch_id-req");
    assert_eq!(slug("`key_len = prompt_len - 1`"), "key_len--prompt_len---1");
    assert_eq!(slug("Function × mode"), "function--mode");
    assert_eq!(slug("C++ (`include/skv.hpp`)"), "c-includeskvhpp");
    assert_eq!(slug("See [hybrid.md](hybrid.md) now"), "see-hybridmd-now");
    let ids: Vec<String> = anchors("# A\n\n```\n# not a heading\n```\n## A\n- <a id=\"x\"></a>**X.**\n")
        .into_iter()
        .map(|a| a.id)
        .collect();
    assert_eq!(ids, ["a", "a-1", "x"]);
}
