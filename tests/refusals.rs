//! Every refusal written down: each function of include/skv.h returning `skv_status` carries
//! one `refuses:` line, docs/refusals.md gives the same statuses with their conditions, and
//! the code can reach no status the line leaves out.
//!
//! The last check reads the source (src/capi, src/core, src/device) with syn: every status an
//! export can return comes from an `Error` variant built in libskv's code (`bail!(Kind, ...)`,
//! `Error::Kind(...)`), mapped in one place (`status_of`), or a `skv_status` named directly.
//! It collects those in every function, follows calls by name (a method call to every method
//! of that name, which over-approximates, never misses one of libskv's own), and compares what
//! each export reaches with its line. What it reaches that the line leaves out must be listed
//! in `UNREACHABLE` with the reason no input gets there; an entry the code no longer reaches
//! fails too.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use common::refusals::*;
use syn::punctuated::Punctuated;
use syn::visit::{self, Visit};

#[test]
fn every_function_has_its_line_and_the_docs_give_the_same_statuses() {
    let header = header_refusals();
    let docs = docs_refusals();
    let diff = differences("include/skv.h", &header, "docs/refusals.md", &docs);
    assert!(diff.is_empty(), "the header's refuses: lines and docs/refusals.md disagree:\n  {}", diff.join("\n  "));
    let text = source("include/skv.h");
    let declared = text.lines().filter(|l| l.starts_with("enum skv_status skv_")).count();
    assert_eq!(header.len(), declared, "functions with a refuses: line against those declared returning skv_status");
}

/// What the code reaches that a line leaves out, each with why no input gets there.
const UNREACHABLE: &[(&str, &str, &str)] = &[
    (
        "skv_cache_stats",
        "SKV_ERR_UNSUPPORTED",
        "Cache::stats asks for the owned pool with `let Ok(..) else`: an external handle fills what it knows",
    ),
    (
        "skv_free_req",
        "SKV_ERR_CALLBACK",
        "owned mode only, and its frees (the row's tail and the row) run no hook: only a release's \
         dec_lock_ref and free_aux do",
    ),
    (
        "skv_free_req",
        "SKV_ERR_OUT_OF_MEMORY",
        "owned mode only: the pool's frees stage nothing (only the external pool's read_row staging allocates)",
    ),
    ("skv_hand_back", "SKV_ERR_CALLBACK", "it runs its state change through run_effects with no effect: no callback"),
    ("skv_hand_back", "SKV_ERR_OUT_OF_MEMORY", "no effect: nothing is staged"),
    ("skv_hand_back", "SKV_ERR_UNSUPPORTED", "no effect: no free to split at the SWA cursor"),
    (
        "skv_trim_overshoot",
        "SKV_ERR_UNSUPPORTED",
        "its free splits at the req's own cursor, and check_record's check_cursor has refused a req \
         whose cursor passed swa_dead_lo where ExternalPool::check_split would: no full-only piece",
    ),
    ("skv_free_tail", "SKV_ERR_UNSUPPORTED", "as skv_trim_overshoot: its free splits at the req's checked cursor"),
];

#[test]
fn every_status_the_code_reaches_is_on_the_line() {
    let code = code_refusals();
    let header = header_refusals();
    let exports: BTreeSet<&String> = code.keys().collect();
    let lined: BTreeSet<&String> = header.keys().collect();
    assert_eq!(exports, lined, "src/capi's exports returning skv_status against the header's functions with a line");
    let mut bad = Vec::new();
    for (f, reached) in &code {
        let line = &header[f];
        for s in line.difference(reached) {
            bad.push(format!("{f}: the line names {s}, which no code path of {f} builds"));
        }
        let excused: BTreeSet<String> =
            UNREACHABLE.iter().filter(|(g, _, _)| g == f).map(|(_, s, _)| s.to_string()).collect();
        for s in reached.difference(line) {
            if !excused.contains(s) {
                bad.push(format!("{f}: the code reaches {s}, which its refuses: line leaves out"));
            }
        }
        for s in &excused {
            if line.contains(s) || !reached.contains(s) {
                bad.push(format!(
                    "{f}: UNREACHABLE lists {s}, but {}",
                    match line.contains(s) {
                        true => "the line names it",
                        false => "the code no longer reaches it",
                    }
                ));
            }
        }
    }
    for (f, _, _) in UNREACHABLE {
        if !code.contains_key(*f) {
            bad.push(format!("UNREACHABLE names {f}, which is no export"));
        }
    }
    assert!(bad.is_empty(), "refusals against the code:\n  {}", bad.join("\n  "));
}

/// The parsers refuse what the checks above rely on them refusing.
#[test]
fn a_missing_wrong_or_disagreeing_line_fails() {
    let header = source("include/skv.h");
    let statuses = header_statuses(&header).unwrap();
    let good = parse_header(&header).expect("the header parses");
    let one =
        |f: &str| header.lines().find(|l| l.starts_with("enum skv_status ") && l.contains(&format!(" {f}("))).unwrap();
    let line_of = |f: &str| {
        let at = header.find(one(f)).unwrap();
        let start = header[..at].rfind(" * refuses: ").unwrap();
        // The line and its indented continuation lines.
        let mut end = start + header[start..].find('\n').unwrap();
        while header[end + 1..].starts_with(" *  ") {
            end += 1 + header[end + 1..].find('\n').unwrap();
        }
        (start, end)
    };
    let with = |f: &str, new: &str| {
        let (start, end) = line_of(f);
        format!("{}{new}{}", &header[..start], &header[end..])
    };
    let err = |text: String| parse_header(&text).expect_err("must fail").join("\n");

    let e = err(with("skv_commit", " * The caller must pass every pointer."));
    assert!(e.contains("skv_commit returns skv_status but its doc comment has no refuses: line"), "{e}");
    let e = err(with("skv_commit", " * refuses: SKV_ERR_NULL_ARG, SKV_ERR_BOGUS"));
    assert!(e.contains("skv_commit: `SKV_ERR_BOGUS` is no skv_status"), "{e}");
    let e = err(with("skv_commit", " * refuses: SKV_ERR_STATE, SKV_ERR_NULL_ARG"));
    assert!(e.contains("SKV_ERR_NULL_ARG after SKV_ERR_STATE"), "{e}");
    let e = err(with("skv_commit", " * refuses: SKV_ERR_NULL_ARG, SKV_ERR_INTERNAL"));
    assert!(e.contains("SKV_ERR_INTERNAL is on no line"), "{e}");
    let e = err(with("skv_commit", " * refuses: SKV_ERR_NULL_ARG\n * refuses: SKV_ERR_STATE"));
    assert!(e.contains("skv_commit has more than one refuses: line"), "{e}");
    // A line ending in ',' goes on on an indented line, and only there.
    let wrapped = parse_header(&with("skv_commit", " * refuses: SKV_ERR_NULL_ARG,\n *          SKV_ERR_STATE"))
        .expect("a wrapped line parses");
    assert_eq!(wrapped["skv_commit"], BTreeSet::from(["SKV_ERR_NULL_ARG".to_string(), "SKV_ERR_STATE".to_string()]));
    let e = err(with("skv_commit", " * refuses: SKV_ERR_NULL_ARG,\n * SKV_ERR_STATE"));
    assert!(e.contains("ends in ',' but does not go on on an indented line"), "{e}");
    let e = err(with("skv_commit", " * refuses: SKV_ERR_NULL_ARG,"));
    assert!(e.contains("ends in ',' but does not go on on an indented line"), "{e}");
    let e = err(with("skv_commit", " * refuses: SKV_ERR_NULL_ARG\n *          SKV_ERR_STATE"));
    assert!(e.contains("an indented line after a refuses: line that does not end in ','"), "{e}");
    let e = err(header.replace(
        "const char *skv_version(void);",
        "/**\n * refuses: SKV_ERR_NULL_ARG\n */\nconst char *skv_version2(void);\nconst char *skv_version(void);",
    ));
    assert!(e.contains("skv_version2 returns no skv_status"), "{e}");

    // A disagreement with the docs, either way round, names the function and the status.
    let docs = parse_docs(&source("docs/refusals.md"), &statuses).expect("the docs parse");
    let mut fewer = good.clone();
    fewer.get_mut("skv_commit").unwrap().remove("SKV_ERR_STATE");
    let d = differences("include/skv.h", &fewer, "docs/refusals.md", &docs).join("\n");
    assert!(d.contains("skv_commit: only in include/skv.h [], only in docs/refusals.md [\"SKV_ERR_STATE\"]"), "{d}");
    let mut more = docs.clone();
    more.insert("skv_nothing".into(), BTreeSet::from(["SKV_ERR_STATE".to_string()]));
    let d = differences("include/skv.h", &good, "docs/refusals.md", &more).join("\n");
    assert!(d.contains("skv_nothing: in docs/refusals.md, not in include/skv.h"), "{d}");

    // The docs' own structure.
    let e = parse_docs("### skv_commit\n\n1. `SKV_ERR_NOPE` — never.\n", &statuses).unwrap_err().join("\n");
    assert!(e.contains("`SKV_ERR_NOPE` is no skv_status"), "{e}");
    let e = parse_docs("### skv_commit\n\n1. When the handle is NULL.\n", &statuses).unwrap_err().join("\n");
    assert!(e.contains("does not begin with the status it gives"), "{e}");
    let e = parse_docs("### skv_commit\n\nNothing.\n\n### skv_commit\n\n1. `SKV_ERR_STATE` — x.\n", &statuses)
        .unwrap_err()
        .join("\n");
    assert!(e.contains("the section of skv_commit lists no refusal") && e.contains("a second section"), "{e}");
    let two = parse_docs("### `skv_commit`\n\n1. `SKV_ERR_NULL_ARG`, `SKV_ERR_STATE` — x.\n", &statuses).unwrap();
    assert_eq!(two["skv_commit"].len(), 2);
}

/// The static check must see a refusal added in the code: a new `bail!` of a status the line
/// leaves out, in a function an export calls, is reached.
#[test]
fn a_refusal_added_in_the_code_is_reached() {
    let mut files = source_files();
    let (_, text) = files.iter_mut().find(|(p, _)| p.ends_with("core/queries.rs")).expect("core/queries.rs");
    let anchor = "pub fn usage(&self, session: u64, branch: Option<u64>) -> Usage {";
    assert!(text.contains(anchor), "the anchor moved: update this test");
    *text = text.replace(anchor, &format!("{anchor}\n if session == 7 {{ bail!(NotFound, \"x\"); }}"));
    let before = &code_refusals()["skv_session_usage"];
    let after = &reach(&files)["skv_session_usage"];
    assert!(!before.contains("SKV_ERR_NOT_FOUND"), "{before:?}");
    assert!(after.contains("SKV_ERR_NOT_FOUND"), "{after:?}");
    assert!(!reach(&files)["skv_cache_stats"].contains("SKV_ERR_NOT_FOUND"), "only the callers reach it");
}

/// Every export returning `skv_status`, with the statuses its code can reach (less
/// SKV_ERR_INTERNAL).
fn code_refusals() -> Refusals {
    reach(&source_files())
}

/// libskv's source files, as (path, text); the unit tests left out.
fn source_files() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    for dir in ["src/capi", "src/core", "src/device"] {
        let mut paths: Vec<_> = std::fs::read_dir(root.join(dir))
            .unwrap_or_else(|e| panic!("{dir}: {e}"))
            .map(|e| e.unwrap().path())
            // tests.rs and test_*.rs hold the unit tests and their helpers (cfg(test) modules).
            .filter(|p| p.extension().is_some_and(|x| x == "rs") && !p.ends_with("tests.rs"))
            .filter(|p| !p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("test_")))
            .collect();
        paths.sort();
        for p in paths {
            let text = std::fs::read_to_string(&p).unwrap();
            out.push((p.strip_prefix(root).unwrap().display().to_string(), text));
        }
    }
    out
}

/// What one function builds and calls.
#[derive(Default, Debug)]
struct Body {
    /// `Error` variants built (`bail!(Kind, ..)`, `Error::Kind(..)`).
    kinds: BTreeSet<String>,
    /// `SKV_ERR_*` statuses named directly.
    statuses: BTreeSet<String>,
    /// Free functions named (called, or passed as a value).
    free: BTreeSet<String>,
    /// `Type::function` paths.
    typed: BTreeSet<(String, String)>,
    /// Methods called.
    methods: BTreeSet<String>,
}

/// One function of the source.
struct Def {
    /// The impl's type, or the trait of a trait's default method.
    ty: Option<String>,
    /// The trait an impl implements.
    of_trait: Option<String>,
    name: String,
    has_self: bool,
    body: Body,
}

struct Scan<'a> {
    body: &'a mut Body,
    self_ty: Option<&'a str>,
}

impl Scan<'_> {
    fn path(&mut self, path: &syn::Path) {
        let segs: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        let n = segs.len();
        let last = segs[n - 1].clone();
        if n >= 2 && segs[n - 2] == "Error" {
            self.body.kinds.insert(last);
        } else if last.starts_with("SKV_ERR_") {
            self.body.statuses.insert(last);
        } else if n == 1 {
            self.body.free.insert(last);
        } else if segs[n - 2] == "Self" {
            self.body.typed.insert((self.self_ty.unwrap_or("Self").to_string(), last));
        } else if segs[n - 2].starts_with(|c: char| c.is_ascii_uppercase()) {
            self.body.typed.insert((segs[n - 2].clone(), last));
        } else {
            self.body.free.insert(last);
        }
    }
}

impl<'ast> Visit<'ast> for Scan<'_> {
    fn visit_expr_path(&mut self, e: &'ast syn::ExprPath) {
        self.path(&e.path);
        visit::visit_expr_path(self, e);
    }

    fn visit_expr_method_call(&mut self, e: &'ast syn::ExprMethodCall) {
        self.body.methods.insert(e.method.to_string());
        visit::visit_expr_method_call(self, e);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        let name = m.path.segments.last().map(|s| s.ident.to_string()).unwrap_or_default();
        let args = m.parse_body_with(Punctuated::<syn::Expr, syn::Token![,]>::parse_terminated);
        match (name.as_str(), args) {
            // bail!(Kind, "format", args...)
            ("bail", Ok(args)) => {
                let mut args = args.into_iter();
                if let Some(syn::Expr::Path(kind)) = args.next() {
                    self.body.kinds.insert(kind.path.segments.last().unwrap().ident.to_string());
                }
                args.for_each(|a| self.visit_expr(&a));
            }
            // matches!(value, pattern): the pattern names what is tested, not what is built.
            ("matches", Ok(args)) => args.iter().take(1).for_each(|a| self.visit_expr(a)),
            (_, Ok(args)) => args.iter().for_each(|a| self.visit_expr(a)),
            (_, Err(_)) => {}
        }
    }

    // A nested item is its own function, never called by name here.
    fn visit_item(&mut self, _: &'ast syn::Item) {}
}

fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs
        .iter()
        .any(|a| a.path().is_ident("cfg") && a.meta.require_list().is_ok_and(|l| l.tokens.to_string() == "test"))
}

fn last_ident(ty: &syn::Type) -> Option<String> {
    match ty {
        syn::Type::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()),
        _ => None,
    }
}

fn scan(block: &syn::Block, self_ty: Option<&str>) -> Body {
    let mut body = Body::default();
    Scan { body: &mut body, self_ty }.visit_block(block);
    body
}

/// Every function of `items`, into `defs`; exports (`#[no_mangle]` `skv_*` returning
/// `skv_status`) by name into `exports`.
fn collect(items: &[syn::Item], defs: &mut Vec<Def>, exports: &mut BTreeMap<String, usize>) {
    for item in items {
        match item {
            syn::Item::Fn(f) if !is_test_only(&f.attrs) => {
                let name = f.sig.ident.to_string();
                let exported = f.attrs.iter().any(|a| a.path().is_ident("no_mangle"))
                    && name.starts_with("skv_")
                    && matches!(&f.sig.output, syn::ReturnType::Type(_, t) if last_ident(t).as_deref() == Some("skv_status"));
                if exported {
                    exports.insert(name.clone(), defs.len());
                }
                let body = match name.as_str() {
                    // The one mapping of every Error variant to its status: a call's status
                    // comes from the variant it built, not from this table.
                    "status_of" => Body::default(),
                    _ => scan(&f.block, None),
                };
                defs.push(Def { ty: None, of_trait: None, name, has_self: false, body });
            }
            syn::Item::Impl(i) if !is_test_only(&i.attrs) => {
                let ty = last_ident(&i.self_ty);
                let of_trait = i.trait_.as_ref().and_then(|(_, p, _)| p.segments.last()).map(|s| s.ident.to_string());
                for it in &i.items {
                    let syn::ImplItem::Fn(f) = it else { continue };
                    let name = f.sig.ident.to_string();
                    // `Error::at` rebuilds the variant it was given, every one of them: its
                    // callers pass on the kind they had.
                    let body = match (ty.as_deref(), name.as_str()) {
                        (Some("Error"), "at") => Body::default(),
                        _ => scan(&f.block, ty.as_deref()),
                    };
                    let has_self = f.sig.receiver().is_some();
                    defs.push(Def { ty: ty.clone(), of_trait: of_trait.clone(), name, has_self, body });
                }
            }
            syn::Item::Trait(t) if !is_test_only(&t.attrs) => {
                let ty = t.ident.to_string();
                for it in &t.items {
                    let syn::TraitItem::Fn(f) = it else { continue };
                    let Some(block) = &f.default else { continue };
                    let name = f.sig.ident.to_string();
                    let has_self = f.sig.receiver().is_some();
                    let body = scan(block, Some(&ty));
                    defs.push(Def { ty: Some(ty.clone()), of_trait: Some(ty.clone()), name, has_self, body });
                }
            }
            syn::Item::Mod(m) if !is_test_only(&m.attrs) => {
                if let Some((_, items)) = &m.content {
                    collect(items, defs, exports);
                }
            }
            _ => {}
        }
    }
}

/// `status_of`'s arms: each `Error` variant's status.
fn status_of_map(files: &[(String, String)]) -> BTreeMap<String, String> {
    let (_, text) = files.iter().find(|(p, _)| p.ends_with("capi/status.rs")).expect("src/capi/status.rs");
    let file = syn::parse_file(text).expect("status.rs parses");
    let f = file
        .items
        .iter()
        .find_map(|i| match i {
            syn::Item::Fn(f) if f.sig.ident == "status_of" => Some(f),
            _ => None,
        })
        .expect("status_of in src/capi/status.rs");
    let Some(syn::Stmt::Expr(syn::Expr::Match(m), _)) = f.block.stmts.last() else { panic!("status_of is one match") };
    let mut map = BTreeMap::new();
    for arm in &m.arms {
        let (syn::Pat::TupleStruct(p), syn::Expr::Path(s)) = (&arm.pat, &*arm.body) else {
            panic!("status_of's arms are `Error::Kind(_) => STATUS`")
        };
        let kind = p.path.segments.last().unwrap().ident.to_string();
        map.insert(kind, s.path.segments.last().unwrap().ident.to_string());
    }
    map
}

/// Every export returning `skv_status` of `files`, with the statuses it reaches.
fn reach(files: &[(String, String)]) -> Refusals {
    let (mut defs, mut exports) = (Vec::new(), BTreeMap::new());
    for (path, text) in files {
        let file = syn::parse_file(text).unwrap_or_else(|e| panic!("{path}: {e}"));
        collect(&file.items, &mut defs, &mut exports);
    }
    let status_of = status_of_map(files);
    // Who each function calls, by name.
    let callees: Vec<Vec<usize>> = defs
        .iter()
        .map(|d| {
            let b = &d.body;
            (0..defs.len())
                .filter(|&j| {
                    let c = &defs[j];
                    (c.ty.is_none() && b.free.contains(&c.name))
                        || (c.has_self && b.methods.contains(&c.name))
                        || b.typed.iter().any(|(t, n)| {
                            *n == c.name && (c.ty.as_deref() == Some(t) || c.of_trait.as_deref() == Some(t))
                        })
                })
                .collect()
        })
        .collect();
    let mut out = Refusals::new();
    for (name, &at) in &exports {
        let mut seen = BTreeSet::from([at]);
        let mut todo = vec![at];
        let mut got = BTreeSet::new();
        while let Some(i) = todo.pop() {
            let b = &defs[i].body;
            for k in &b.kinds {
                got.insert(status_of.get(k).unwrap_or_else(|| panic!("Error::{k} has no arm in status_of")).clone());
            }
            got.extend(b.statuses.iter().cloned());
            for &j in &callees[i] {
                if seen.insert(j) {
                    todo.push(j);
                }
            }
        }
        got.remove(UNLISTED);
        out.insert(name.clone(), got);
    }
    out
}
