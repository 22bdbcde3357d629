//! Finds libkiln (the README's "Linking"): the directory in KILN_LIB_DIR, else `pkg-config kiln`,
//! else the release build tree of the repository this crate lies in (build/lib/c_api).
//!
//! The library is also copied into OUT_DIR and linked from there: cargo puts link directories
//! inside its target directory on the loader path of `cargo test` and `cargo run`, so tests and
//! examples run without LD_LIBRARY_PATH. A program deployed elsewhere finds libkiln.so.1 like any
//! shared library (installed, rpath, or LD_LIBRARY_PATH).
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const SONAME: &str = "libkiln.so.1";

fn pkg_config_lib_dir() -> Option<PathBuf> {
    let out = Command::new("pkg-config").args(["--libs-only-L", "kiln"]).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?;
    text.split_whitespace()
        .filter_map(|flag| flag.strip_prefix("-L"))
        .map(PathBuf::from)
        .find(|dir| dir.join(SONAME).exists())
}

fn build_tree_lib_dir() -> Option<PathBuf> {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").ok()?);
    let dir = manifest.join("../../../build/lib/c_api");
    dir.join(SONAME).exists().then_some(dir)
}

fn main() {
    println!("cargo:rerun-if-env-changed=KILN_LIB_DIR");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    let dir = if let Ok(dir) = env::var("KILN_LIB_DIR") {
        let dir = PathBuf::from(dir);
        if !dir.join(SONAME).exists() {
            panic!("KILN_LIB_DIR={} holds no {SONAME}", dir.display());
        }
        dir
    } else if let Some(dir) = pkg_config_lib_dir() {
        dir
    } else if let Some(dir) = build_tree_lib_dir() {
        dir
    } else {
        panic!(
            "kiln-sys: cannot find {SONAME}: set KILN_LIB_DIR to the directory that holds it, or \
             make `pkg-config --libs kiln` find an installed kiln (PKG_CONFIG_PATH)"
        );
    };
    let library = dir.join(SONAME);
    println!("cargo:rerun-if-changed={}", library.display());
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("lib");
    std::fs::create_dir_all(&out).unwrap();
    copy(&library, &out.join(SONAME));
    // The link-time name: -lkiln looks for libkiln.so.
    copy(&library, &out.join("libkiln.so"));
    println!("cargo:rustc-link-search=native={}", out.display());
    println!("cargo:rustc-link-lib=dylib=kiln");
    println!("cargo:root={}", dir.display());
}

fn copy(from: &Path, to: &Path) {
    let _ = std::fs::remove_file(to);
    std::fs::copy(from, to).unwrap_or_else(|e| panic!("copying {} to {}: {e}", from.display(), to.display()));
}
