//! Every version fact of libskv comes from the crate version (Cargo.toml), by one rule:
//!
//! | crate version | SONAME          | SKV_ABI_VERSION | CMake compatibility |
//! |---------------|-----------------|-----------------|---------------------|
//! | 0.y.z         | `libskv.so.0.y` | y               | SameMinorVersion    |
//! | x.y.z, x >= 1 | `libskv.so.x`   | 1000 * x        | SameMajorVersion    |
//!
//! A 0.y release may break the ABI with each new minor version, an x.y release only with a
//! new major version (cargo-c's rule, which rustls-ffi and other Rust C libraries follow).
//! The ABI number grows with every break and never repeats: 1000 * x stays above every 0.y
//! ABI number. CMake's compatibility is "the same SONAME": the SONAME's version (0.y, or x)
//! is the part of a requested version that must match.
//!
//! This script
//! - passes the SONAME to the linker;
//! - writes `$OUT_DIR/version.rs` (`SKV_ABI_VERSION`, `SKV_SONAME`), included by
//!   src/capi/status.rs;
//! - generates the C header with cbindgen into `$OUT_DIR/skv.h`, with the macros
//!   SKV_VERSION, SKV_VERSION_MAJOR/MINOR/PATCH, SKV_ABI_VERSION and SKV_SONAME, and copies it
//!   to `target/<profile>/include/skv.h`, where `make header` and `make header-check` and
//!   scripts/install.sh find it. The source tree is never written: include/skv.h is refreshed
//!   by `make header`.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};

/// The facts derived from the crate version.
struct Version {
    full: String,
    major: u64,
    minor: u64,
    patch: u64,
    abi: u64,
    soname: String,
}

impl Version {
    fn from_parts(full: String, major: u64, minor: u64, patch: u64) -> Version {
        let (abi, soname) = if major == 0 {
            (minor, format!("libskv.so.0.{minor}"))
        } else {
            (1000 * major, format!("libskv.so.{major}"))
        };
        Version { full, major, minor, patch, abi, soname }
    }
}

fn var(name: &str) -> String {
    env::var(name).unwrap_or_else(|_| panic!("{name} is set by cargo"))
}

fn number(name: &str) -> u64 {
    var(name).parse().unwrap_or_else(|_| panic!("{name} is a number"))
}

#[path = "build/api_table.rs"]
mod api_table;

fn main() {
    let dir = PathBuf::from(var("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(var("OUT_DIR"));
    let v = Version::from_parts(
        var("CARGO_PKG_VERSION"),
        number("CARGO_PKG_VERSION_MAJOR"),
        number("CARGO_PKG_VERSION_MINOR"),
        number("CARGO_PKG_VERSION_PATCH"),
    );

    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{}", v.soname);

    let rust = format!(
        "/// The ABI this library implements; `skv_get_api` accepts it. From the crate version\n\
         /// (build.rs): 0.y gives y, x.y (x >= 1) gives 1000 * x.\n\
         pub const SKV_ABI_VERSION: u32 = {abi};\n\
         /// The shared library's SONAME, the name to load it by.\n\
         pub const SKV_SONAME: &str = \"{soname}\";\n",
        abi = v.abi,
        soname = v.soname
    );
    write_if_changed(&out.join("version.rs"), &rust);

    // The header's copy where the Makefile and scripts find it: OUT_DIR is
    // target[/<triple>]/<profile>/build/skv-<hash>/out.
    let profile_dir = out.ancestors().nth(3).expect("OUT_DIR is target/<profile>/build/<pkg>/out");
    let copy = profile_dir.join("include/skv.h");
    let generated = out.join("skv.h");

    // The dlopen table (skv_api) from the exports; its order's copy for `make header`.
    api_table::generate(&dir.join("src/capi"), &out);
    let order = fs::read_to_string(out.join("api.list")).expect("api.list generated");
    fs::create_dir_all(copy.parent().expect("has a parent")).expect("create target/<profile>/include");
    write_if_changed(&profile_dir.join("include/api.list"), &order);

    let mut config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    config.after_includes = Some(format!(
        "\n/** The version of the headers, from Cargo.toml. */\n\
         #define SKV_VERSION \"{full}\"\n\
         #define SKV_VERSION_MAJOR {major}\n\
         #define SKV_VERSION_MINOR {minor}\n\
         #define SKV_VERSION_PATCH {patch}\n\
         \n\
         /**\n \
         * The ABI this library implements; skv_get_api accepts it. A 0.y release implements ABI y,\n \
         * an x.y release (x >= 1) ABI 1000 * x.\n \
         */\n\
         #define SKV_ABI_VERSION {abi}\n\
         \n\
         /** The shared library's SONAME: libskv.so.0.y for 0.y releases, libskv.so.x from 1.0. */\n\
         #define SKV_SONAME \"{soname}\"",
        full = v.full,
        major = v.major,
        minor = v.minor,
        patch = v.patch,
        abi = v.abi,
        soname = v.soname
    ));
    match cbindgen::Builder::new().with_crate(&dir).with_src(out.join("api_table.rs")).with_config(config).generate() {
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
    // The C records are defined in core (cbindgen.toml renames them to their C names).
    println!("cargo:rerun-if-changed=src/core/records.rs");
    println!("cargo:rerun-if-changed=src/core/req.rs");
    println!("cargo:rerun-if-changed=cbindgen.toml");
}

/// Writes `text` unless the file already holds it, so that its timestamp moves only on a change.
fn write_if_changed(path: &Path, text: &str) {
    if fs::read_to_string(path).is_ok_and(|old| old == text) {
        return;
    }
    fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}
