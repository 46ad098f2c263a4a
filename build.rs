//! Generates include/skv.h from src/capi with cbindgen. The version macros come from
//! Cargo.toml, and the shared library gets its SONAME here.

use std::env;
use std::path::PathBuf;

#[path = "build/api_table.rs"]
mod api_table;

fn main() {
    let dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let version = env::var("CARGO_PKG_VERSION").expect("set by cargo");
    let major = env::var("CARGO_PKG_VERSION_MAJOR").expect("set by cargo");
    let minor = env::var("CARGO_PKG_VERSION_MINOR").expect("set by cargo");
    let patch = env::var("CARGO_PKG_VERSION_PATCH").expect("set by cargo");

    // A 0.x library breaks its ABI only with a new minor version, but the ABI number is
    // what the SONAME promises: libskv.so.<SKV_ABI_VERSION - 1>.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libskv.so.0");

    let out_dir = PathBuf::from(env::var("OUT_DIR").expect("set by cargo"));
    api_table::generate(&dir.join("src/capi"), &out_dir);

    let mut config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    config.after_includes = Some(format!(
        "\n/** The version of the headers, from Cargo.toml. */\n\
         #define SKV_VERSION \"{version}\"\n\
         #define SKV_VERSION_MAJOR {major}\n\
         #define SKV_VERSION_MINOR {minor}\n\
         #define SKV_VERSION_PATCH {patch}"
    ));
    match cbindgen::Builder::new().with_crate(&dir).with_src(out_dir.join("api_table.rs")).with_config(config).generate() {
        Ok(bindings) => {
            bindings.write_to_file(dir.join("include/skv.h"));
        }
        // A half-edited source tree must not stop `cargo check`; rustc reports the real error.
        Err(e) => println!("cargo:warning=include/skv.h not regenerated: {e}"),
    }
    println!("cargo:rerun-if-changed=src/capi");
    println!("cargo:rerun-if-changed=cbindgen.toml");
}
