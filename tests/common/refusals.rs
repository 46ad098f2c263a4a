//! The refusals every export documents, read back: the `refuses:` line of its doc comment in
//! include/skv.h, and its section of docs/refusals.md. `tests/refusals.rs` checks that the two
//! agree with each other and with the code; the fuzzer checks that every status it sees a
//! function return is on that function's line.
//!
//! SKV_ERR_INTERNAL is on no line, by the rule the header's conventions state: any call
//! returning a status returns it for a libskv bug caught at the boundary, and every call taking
//! a handle returns it once such a bug poisoned the handle. A caller that sees it has found a
//! bug, which is why `header_refusals` never lists it.

use std::collections::{BTreeMap, BTreeSet};

/// Function name to the statuses it may return besides SKV_OK.
pub type Refusals = BTreeMap<String, BTreeSet<String>>;

/// The status every call may return without its line naming it (see the module's doc).
pub const UNLISTED: &str = "SKV_ERR_INTERNAL";

/// What a `refuses:` line starts with, after the comment's ` * `.
pub const PREFIX: &str = "refuses: ";

/// Every function of include/skv.h that returns `skv_status`, with the statuses on its
/// `refuses:` line. A line ending in ',' goes on on the next comment line, which is indented
/// (`refuses: A, B,` then ` *          C`), so that no line passes 100 columns. Panics, naming every problem, when a function returning a status has no
/// line (or two), a line names a status the header does not define (or SKV_OK, or
/// SKV_ERR_INTERNAL), lists one twice or out of the enum's order, or stands on a function that
/// returns no status.
pub fn header_refusals() -> Refusals {
    parse_header(&source("include/skv.h")).unwrap_or_else(|e| panic!("include/skv.h:\n  {}", e.join("\n  ")))
}

/// Every section of docs/refusals.md, with the statuses its numbered items name. Panics,
/// naming every problem, when an item names an unknown status or none, a section has no items,
/// or a function has two sections.
pub fn docs_refusals() -> Refusals {
    let statuses = header_statuses(&source("include/skv.h")).expect("include/skv.h defines skv_status");
    parse_docs(&source("docs/refusals.md"), &statuses)
        .unwrap_or_else(|e| panic!("docs/refusals.md:\n  {}", e.join("\n  ")))
}

/// A file of the source tree.
pub fn source(path: &str) -> String {
    let full = format!("{}/{path}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{full}: {e}"))
}

/// The members of `enum skv_status` as the header defines them, in numeric order.
pub fn header_statuses(header: &str) -> Result<Vec<(String, i64)>, String> {
    let body = header
        .split_once("typedef enum skv_status {")
        .and_then(|(_, rest)| rest.split_once("} skv_status;"))
        .map(|(body, _)| body)
        .ok_or("no `typedef enum skv_status { ... } skv_status;`")?;
    let mut out = Vec::new();
    for line in body.lines().map(str::trim) {
        let Some((name, value)) = line.strip_suffix(',').and_then(|l| l.split_once(" = ")) else { continue };
        if name.starts_with("SKV_") {
            let value = value.parse().map_err(|_| format!("{name} = {value} is no number"))?;
            out.push((name.to_string(), value));
        }
    }
    out.sort_by_key(|&(_, v)| v);
    match out.is_empty() {
        true => Err("enum skv_status has no members".into()),
        false => Ok(out),
    }
}

/// A function declaration of the header: a line in column 0 naming `skv_...(`, outside a
/// typedef. Returns its name and return type.
fn declaration(line: &str) -> Option<(&str, &str)> {
    if line.starts_with(|c: char| c.is_whitespace() || !c.is_ascii_alphabetic()) || line.starts_with("typedef") {
        return None;
    }
    let open = line.find('(')?;
    let head = &line[..open];
    let at = head.rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).map_or(0, |i| i + 1);
    let name = &head[at..];
    name.starts_with("skv_").then(|| (name, head[..at].trim()))
}

/// `parse_header` on the header's text.
pub fn parse_header(header: &str) -> Result<Refusals, Vec<String>> {
    let statuses = header_statuses(header).map_err(|e| vec![e])?;
    let mut errors = Vec::new();
    let mut out = Refusals::new();
    // The `refuses:` lines of the doc block just closed (with their line numbers, each with its
    // continuation lines joined on), until the item it documents.
    let mut pending: Option<Vec<(usize, String)>> = None;
    let mut block: Option<Vec<(usize, String)>> = None;
    // The previous line of the open block was a `refuses:` line (or its continuation) ending
    // in ',' (the list goes on), or one ending without (an indented line after it is a list
    // that lost a ',').
    let mut continued = false;
    let mut ended = false;
    for (i, line) in header.lines().enumerate() {
        let n = i + 1;
        let inner = line.trim_start();
        if let Some(b) = block.as_mut() {
            let text = inner.strip_prefix("* ").or(inner.strip_prefix("*").filter(|t| !t.starts_with('/')));
            let indented = text.filter(|t| t.starts_with(' ') && !t.trim().is_empty());
            if continued {
                continued = false;
                match indented {
                    Some(t) => {
                        let last = b.last_mut().expect("a refuses: line goes on");
                        last.1 = format!("{} {}", last.1, t.trim());
                        continued = last.1.ends_with(',');
                        ended = !continued;
                    }
                    None => errors.push(format!(
                        "line {n}: the refuses: line above ends in ',' but does not go on on an indented line"
                    )),
                }
            } else if ended && indented.is_some() {
                ended = false;
                errors.push(format!("line {n}: an indented line after a refuses: line that does not end in ','"));
            } else if let Some(text) = text {
                ended = false;
                if text.trim_start().starts_with(PREFIX.trim_end()) {
                    b.push((n, text.trim().to_string()));
                    continued = text.trim_end().ends_with(',');
                    ended = !continued;
                }
            }
            if inner.ends_with("*/") {
                (continued, ended) = (false, false);
                pending = block.take();
            }
            continue;
        }
        if inner.starts_with("/**") {
            if let Some(lines) = pending.take().filter(|l| !l.is_empty()) {
                errors.push(format!("line {}: a refuses: line on no function", lines[0].0));
            }
            block = Some(Vec::new());
            if inner.ends_with("*/") && inner.len() > 4 {
                pending = block.take();
            }
            continue;
        }
        if inner.is_empty() {
            continue;
        }
        let lines = pending.take().unwrap_or_default();
        let Some((name, ret)) = declaration(line) else {
            if let Some((at, _)) = lines.first() {
                errors.push(format!("line {at}: a refuses: line on no function (it documents `{}`)", line.trim()));
            }
            continue;
        };
        let returns_status = matches!(ret, "enum skv_status" | "skv_status");
        match (returns_status, lines.as_slice()) {
            (false, []) => continue,
            (false, [(at, _), ..]) => {
                errors.push(format!(
                    "line {at}: {name} returns no skv_status (it returns `{ret}`) but has a refuses: line"
                ));
                continue;
            }
            (true, []) => {
                errors.push(format!("line {n}: {name} returns skv_status but its doc comment has no refuses: line"));
                continue;
            }
            (true, [_, (at, _), ..]) => {
                errors.push(format!("line {at}: {name} has more than one refuses: line"));
                continue;
            }
            (true, [(at, text)]) => match parse_line(text, &statuses) {
                Ok(set) => {
                    if out.insert(name.to_string(), set).is_some() {
                        errors.push(format!("line {n}: {name} is declared twice"));
                    }
                }
                Err(e) => errors.push(format!("line {at}: {name}: {e}")),
            },
        }
    }
    match errors.is_empty() {
        true => Ok(out),
        false => Err(errors),
    }
}

/// One `refuses: A, B` line: known statuses other than SKV_OK and SKV_ERR_INTERNAL, each once,
/// in the enum's numeric order, separated by ", ".
pub fn parse_line(text: &str, statuses: &[(String, i64)]) -> Result<BTreeSet<String>, String> {
    let list = text.strip_prefix(PREFIX).ok_or_else(|| format!("`{text}` is not `{PREFIX}A, B, ...`"))?;
    let mut set = BTreeSet::new();
    let mut last: Option<(&str, i64)> = None;
    for name in list.split(", ") {
        let value = known(name, statuses)?;
        if let Some((before, v)) = last {
            if value <= v {
                return Err(format!("{name} after {before}: the statuses go in the enum's numeric order, each once"));
            }
        }
        last = Some((name, value));
        set.insert(name.to_string());
    }
    Ok(set)
}

/// The value of a status a refusal may name.
fn known(name: &str, statuses: &[(String, i64)]) -> Result<i64, String> {
    match statuses.iter().find(|(s, _)| s == name) {
        None => Err(format!("`{name}` is no skv_status")),
        Some((_, 0)) => Err(format!("{name} is success, not a refusal")),
        Some(_) if name == UNLISTED => {
            Err(format!("{name} is on no line: the conventions state it once for every call"))
        }
        Some(&(_, v)) => Ok(v),
    }
}

/// docs/refusals.md: each `### skv_name` section's numbered items each begin with the statuses
/// they give, in backticks (`` `SKV_ERR_STATE` `` or `` `SKV_ERR_NOT_FOUND`, `SKV_ERR_STATE` ``).
/// Every numbered item of such a section must; text and bullets between them are free.
pub fn parse_docs(docs: &str, statuses: &[(String, i64)]) -> Result<Refusals, Vec<String>> {
    let mut errors = Vec::new();
    let mut out = Refusals::new();
    let mut section: Option<(usize, String)> = None;
    fn close(section: &mut Option<(usize, String)>, out: &Refusals, errors: &mut Vec<String>) {
        if let Some((at, name)) = section.take() {
            if !out.contains_key(&name) {
                errors.push(format!("line {at}: the section of {name} lists no refusal"));
            }
        }
    }
    let mut seen = BTreeSet::new();
    let lines: Vec<&str> = docs.lines().collect();
    for (i, &line) in lines.iter().enumerate() {
        let n = i + 1;
        if line.starts_with('#') {
            close(&mut section, &out, &mut errors);
            let title = line.trim_start_matches('#').trim().trim_matches('`');
            let is_function = line.starts_with("### ")
                && title.starts_with("skv_")
                && title.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if is_function {
                if !seen.insert(title.to_string()) {
                    errors.push(format!("line {n}: a second section for {title}"));
                }
                section = Some((n, title.to_string()));
            }
            continue;
        }
        let Some((_, name)) = section.as_ref() else { continue };
        let Some(first) = numbered_item(line) else { continue };
        // An item goes on over its indented lines.
        let more = lines[i + 1..].iter().take_while(|l| l.starts_with(' ') && !l.trim().is_empty());
        let item = more.fold(first.to_string(), |item, l| format!("{item} {}", l.trim()));
        match leading_statuses(&item, statuses) {
            Ok(names) => out.entry(name.clone()).or_default().extend(names),
            Err(e) => errors.push(format!("line {n} ({name}): {e}")),
        }
    }
    close(&mut section, &out, &mut errors);
    match errors.is_empty() {
        true => Ok(out),
        false => Err(errors),
    }
}

/// The text of a top-level numbered list item (`12. text`).
fn numbered_item(line: &str) -> Option<&str> {
    let digits = line.len() - line.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    (digits > 0).then(|| line[digits..].strip_prefix(". ")).flatten()
}

/// The backticked statuses an item begins with, separated by ", ".
fn leading_statuses(item: &str, statuses: &[(String, i64)]) -> Result<Vec<String>, String> {
    let mut names = Vec::new();
    let mut rest = item;
    while let Some(tail) = rest.strip_prefix("`SKV_") {
        let Some((name, after)) = tail.split_once('`') else { return Err(format!("unclosed `SKV_{tail}")) };
        let name = format!("SKV_{name}");
        known(&name, statuses)?;
        names.push(name);
        match after.strip_prefix(", ") {
            Some(more) if more.starts_with("`SKV_") => rest = more,
            _ => break,
        }
    }
    match names.is_empty() {
        true => Err(format!("the item does not begin with the status it gives: `{item}`")),
        false => Ok(names),
    }
}

/// Where two refusal lists disagree, one line per function (empty when they agree).
pub fn differences(a_name: &str, a: &Refusals, b_name: &str, b: &Refusals) -> Vec<String> {
    let mut out = Vec::new();
    for f in a.keys().chain(b.keys()).collect::<BTreeSet<_>>() {
        match (a.get(f), b.get(f)) {
            (Some(_), None) => out.push(format!("{f}: in {a_name}, not in {b_name}")),
            (None, Some(_)) => out.push(format!("{f}: in {b_name}, not in {a_name}")),
            (Some(x), Some(y)) if x != y => {
                let only =
                    |p: &BTreeSet<String>, q: &BTreeSet<String>| -> Vec<String> { p.difference(q).cloned().collect() };
                out.push(format!("{f}: only in {a_name} {:?}, only in {b_name} {:?}", only(x, y), only(y, x)));
            }
            _ => {}
        }
    }
    out
}
