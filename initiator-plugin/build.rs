//! Link arguments for SPDK's shared libraries (found by spdk-sys at `SPDK_DIR`): an
//! rpath to them, and, for the unit-test executables, permission for those libraries
//! to leave symbols (ISA-L, DPDK) to the application binary, bound lazily.

fn main() {
    if let Ok(dir) = std::env::var("DEP_SPDK_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,--allow-shlib-undefined");
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
