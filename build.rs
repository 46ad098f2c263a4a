//! Generates the C header from src/capi with cbindgen into `$OUT_DIR/skv.h`, and copies it to
//! `target/<profile>/include/skv.h`, where `make header`, `make header-check` and
//! scripts/install.sh find it. The source tree is never written: include/skv.h is refreshed
//! by `make header`. The version macros come from Cargo.toml, and the shared library gets
//! its SONAME here.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};

fn var(name: &str) -> String {
    env::var(name).unwrap_or_else(|_| panic!("{name} is set by cargo"))
}

fn main() {
    let dir = PathBuf::from(var("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(var("OUT_DIR"));
    let version = var("CARGO_PKG_VERSION");
    let major = var("CARGO_PKG_VERSION_MAJOR");
    let minor = var("CARGO_PKG_VERSION_MINOR");
    let patch = var("CARGO_PKG_VERSION_PATCH");

    // A 0.x library breaks its ABI only with a new minor version, but the ABI number is
    // what the SONAME promises: libskv.so.<SKV_ABI_VERSION - 1>.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libskv.so.0");

    // The header's copy where the Makefile and scripts find it: OUT_DIR is
    // target[/<triple>]/<profile>/build/skv-<hash>/out.
    let profile_dir = out.ancestors().nth(3).expect("OUT_DIR is target/<profile>/build/<pkg>/out");
    let copy = profile_dir.join("include/skv.h");
    let generated = out.join("skv.h");

    let mut config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    config.after_includes = Some(format!(
        "\n/** The version of the headers, from Cargo.toml. */\n\
         #define SKV_VERSION \"{version}\"\n\
         #define SKV_VERSION_MAJOR {major}\n\
         #define SKV_VERSION_MINOR {minor}\n\
         #define SKV_VERSION_PATCH {patch}"
    ));
    match cbindgen::Builder::new().with_crate(&dir).with_config(config).generate() {
        Ok(bindings) => {
            bindings.write_to_file(&generated);
            fs::create_dir_all(copy.parent().expect("has a parent")).expect("create target/<profile>/include");
            let text = fs::read_to_string(&generated).expect("read the generated header");
            write_if_changed(&copy, &text);
        }
        // A half-edited source tree must not stop `cargo check`; rustc reports the real error.
        // No stale header is left behind for `make header` to pick up.
        Err(e) => {
            let _ = fs::remove_file(&generated);
            let _ = fs::remove_file(&copy);
            println!("cargo:warning=skv.h not generated: {e}");
        }
    }
    println!("cargo:rerun-if-changed=src/capi");
    println!("cargo:rerun-if-changed=cbindgen.toml");
}

/// Writes `text` unless the file already holds it, so that its timestamp moves only on a change.
fn write_if_changed(path: &Path, text: &str) {
    if fs::read_to_string(path).is_ok_and(|old| old == text) {
        return;
    }
    fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}
