//! Generates the SPDK bindings with bindgen from the SPDK tree at `SPDK_DIR` (default
//! `/opt/spdk`), compiles bindgen's wrappers of SPDK's `static inline` functions, and
//! links against SPDK's shared libraries through pkg-config
//! (`$SPDK_DIR/build/lib/pkgconfig`).
//!
//! SPDK must be a source tree configured `--with-shared` and built. Nothing here builds
//! SPDK. A missing tree is a build error that names `SPDK_DIR`.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// SPDK libraries the safe layer and the plugins call into.
const LIBS: &[&str] = &[
    "spdk_bdev",
    "spdk_thread",
    "spdk_json",
    "spdk_jsonrpc",
    "spdk_rpc",
    "spdk_log",
    "spdk_util",
    "spdk_init",
    "spdk_env_dpdk",
];

fn main() {
    println!("cargo:rerun-if-env-changed=SPDK_DIR");
    println!("cargo:rerun-if-changed=wrapper.h");
    let spdk_dir = PathBuf::from(env::var("SPDK_DIR").unwrap_or_else(|_| "/opt/spdk".into()));
    let header = spdk_dir.join("include/spdk/bdev_module.h");
    let pc_dir = spdk_dir.join("build/lib/pkgconfig");
    if !header.is_file() || !pc_dir.join("spdk_bdev.pc").is_file() {
        panic!(
            "\n\nSPDK not found at SPDK_DIR={dir}: expected {h} and {pc}.\n\
             Set SPDK_DIR to an SPDK v25.09 source tree configured with --with-shared and \
             built (make). spdk-sys, spdk-plugin and initiator-plugin need it; the default \
             workspace members (qos-core, qos-lab) do not.\n\n",
            dir = spdk_dir.display(),
            h = header.display(),
            pc = pc_dir.join("spdk_bdev.pc").display(),
        );
    }
    println!("cargo:rerun-if-changed={}", header.display());
    link(&spdk_dir, &pc_dir);
    generate(&spdk_dir);
}

/// Emits link flags from `pkg-config --libs` over SPDK's own `.pc` files.
fn link(spdk_dir: &Path, pc_dir: &Path) {
    let out = Command::new("pkg-config")
        .env("PKG_CONFIG_PATH", pc_dir)
        .arg("--libs")
        .args(LIBS)
        .output()
        .unwrap_or_else(|e| panic!("cannot run pkg-config (install it): {e}"));
    if !out.status.success() {
        panic!(
            "pkg-config --libs {} failed with PKG_CONFIG_PATH={} (SPDK_DIR={}): {}",
            LIBS.join(" "),
            pc_dir.display(),
            spdk_dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for flag in String::from_utf8_lossy(&out.stdout).split_whitespace() {
        if let Some(dir) = flag.strip_prefix("-L") {
            println!("cargo:rustc-link-search=native={dir}");
        } else if let Some(lib) = flag.strip_prefix("-l") {
            println!("cargo:rustc-link-lib=dylib={lib}");
        }
    }
    // SPDK's shared libraries leave symbols (ISA-L, DPDK) for the application binary to
    // provide; unit-test executables are not such applications and only need the
    // libraries to load (symbols bind lazily, on first call, which tests never make).
    println!("cargo:rustc-link-arg=-Wl,--allow-shlib-undefined");
    println!(
        "cargo:rustc-link-arg=-Wl,-rpath,{}",
        spdk_dir.join("build/lib").display()
    );
    // Exposed to dependents' build scripts as DEP_SPDK_LIB_DIR and DEP_SPDK_ROOT.
    println!("cargo:lib_dir={}", spdk_dir.join("build/lib").display());
    println!("cargo:root={}", spdk_dir.display());
}

fn generate(spdk_dir: &Path) {
    let out_dir = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let includes = [spdk_dir.join("build/include"), spdk_dir.join("include")];
    let wrappers = out_dir.join("static_wrappers");
    let mut builder = bindgen::Builder::default()
        .header("wrapper.h")
        .allowlist_function("spdk_.*")
        .allowlist_type("spdk_.*")
        .allowlist_var("SPDK_.*")
        // C enums arrive from SPDK in struct fields: a newtype over the integer cannot
        // hold an invalid value, unlike a Rust enum.
        .default_enum_style(bindgen::EnumVariation::NewType {
            is_bitfield: false,
            is_global: false,
        })
        .derive_default(true)
        .derive_debug(true)
        .impl_debug(false)
        // Doxygen text would become doc tests.
        .generate_comments(false)
        .layout_tests(true)
        .wrap_unsafe_ops(true)
        .generate_cstr(true)
        .wrap_static_fns(true)
        .wrap_static_fns_path(&wrappers)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    // bindgen lays these dword unions out wrongly (bitfields after a non-bitfield member;
    // unions with bitfield structs inside packed structs). Each is a 4-byte union of
    // `uint32_t raw` and bitfields, which has the ABI of a `u32`: bind it as one (the
    // layout tests of the structs that contain them check sizes and offsets).
    for t in [
        "spdk_nvme_cmd_cdw11",
        "spdk_nvme_feat_async_event_configuration",
        "spdk_bdev_nvme_cdw12",
        "spdk_bdev_nvme_cdw13",
    ] {
        builder = builder
            .blocklist_type(t)
            .blocklist_type(format!("{t}__bindgen_ty_.*"))
            .raw_line(format!("pub type {t} = u32;"));
    }
    // A packed struct that contains aligned members; not needed by the plugins.
    builder = builder.opaque_type("spdk_nvme_ctrlr_data");
    for inc in &includes {
        builder = builder.clang_arg(format!("-I{}", inc.display()));
    }
    let bindings = builder.generate().unwrap_or_else(|e| {
        panic!(
            "bindgen failed on the SPDK headers at SPDK_DIR={} (is libclang installed? \
             apt-get install libclang-dev): {e}",
            spdk_dir.display()
        )
    });
    bindings
        .write_to_file(out_dir.join("bindings.rs"))
        .expect("write bindings.rs");

    // bindgen wrote C wrappers for the `static inline` functions (spdk_io_channel_get_ctx,
    // spdk_bdev_io_from_ctx, spdk_thread_exec_msg...); compile them into this crate.
    let mut cc = cc::Build::new();
    cc.file(wrappers.with_extension("c"))
        .include(env::current_dir().expect("cwd"))
        .warnings(false)
        .flag_if_supported("-Wno-unused-parameter");
    for inc in &includes {
        cc.include(inc);
    }
    cc.compile("spdk_static_wrappers");
}
