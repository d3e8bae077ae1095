//! What the tests run against: SPDK's build at `SPDK_DIR` (the target side, and the
//! initiator applications), the plugins' shared libraries built by this workspace, and
//! 2 MiB hugepages.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// An SPDK v25.09 shared-library build.
#[derive(Debug, Clone)]
pub struct Spdk {
    pub dir: PathBuf,
    pub nvmf_tgt: PathBuf,
    pub perf: PathBuf,
    pub lib_dir: PathBuf,
}

/// What "SPDK present" means, shared with the Makefile: paths under `SPDK_DIR`.
pub const SPDK_PRESENT_LIST: &str = include_str!("../../spdk-present.list");

/// The paths of [`SPDK_PRESENT_LIST`] missing under `dir` (empty: SPDK is present).
pub fn spdk_missing(dir: &Path, list: &str) -> Vec<PathBuf> {
    list.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| dir.join(l))
        .filter(|p| !p.exists())
        .collect()
}

/// Finds SPDK, or says why not (the caller prints it as the skip reason).
pub fn detect_spdk() -> Result<Spdk, String> {
    let dir = PathBuf::from(std::env::var("SPDK_DIR").unwrap_or_else(|_| "/opt/spdk".into()));
    let s = Spdk {
        nvmf_tgt: dir.join("build/bin/nvmf_tgt"),
        perf: dir.join("build/bin/spdk_nvme_perf"),
        lib_dir: dir.join("build/lib"),
        dir: dir.clone(),
    };
    let missing = spdk_missing(&dir, SPDK_PRESENT_LIST);
    if !missing.is_empty() {
        return Err(format!(
            "SPDK not present at {} (missing {}; set SPDK_DIR to an SPDK v25.09 shared-library build, \
             see spdk-present.list)",
            dir.display(),
            missing
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    Ok(s)
}

/// Prints the SKIPPED line straight to the process's stderr, past the test harness's
/// capture, so the skip is visible in CI logs.
pub(crate) fn or_skip<T>(what: &str, found: Result<T, String>) -> Option<T> {
    match found {
        Ok(s) => Some(s),
        Err(why) => {
            let _ = writeln!(std::io::stderr(), "SKIPPED: {what}: {why}");
            None
        }
    }
}

/// SPDK's initiator applications.
#[derive(Debug, Clone)]
pub struct Initiators {
    pub spdk: Spdk,
    pub bdevperf: PathBuf,
    /// fio's SPDK bdev ioengine and a fio binary, when both are present.
    pub fio: Option<(PathBuf, PathBuf)>,
}

/// Finds SPDK (target side) and bdevperf, or says why not.
pub fn detect() -> Result<Initiators, String> {
    let spdk = detect_spdk()?;
    let bdevperf = spdk.dir.join("build/examples/bdevperf");
    if !bdevperf.exists() {
        return Err(format!(
            "bdevperf not found at {} (SPDK built without examples?)",
            bdevperf.display()
        ));
    }
    let plugin = spdk.dir.join("build/fio/spdk_bdev");
    let fio = which("fio");
    let fio = match (plugin.exists(), fio) {
        (true, Some(f)) => Some((plugin, f)),
        _ => None,
    };
    Ok(Initiators {
        spdk,
        bdevperf,
        fio,
    })
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(name))
            .find(|f| f.is_file())
    })
}

/// The initiators, or `None` after printing the SKIPPED line. Also skips (never
/// panics) where SPDK is present but a plugin was not built.
pub fn initiators_or_skip(what: &str) -> Option<Initiators> {
    or_skip(
        what,
        detect().and_then(|s| ini_lib().and(tgt_lib()).map(|_| s)),
    )
}

/// A shared library built by this workspace: `$env`, else `<target dir>/release/`
/// then the test executable's own profile, then `debug/`. Panics when the build found
/// is older than one of its sources (not for `$env`).
pub fn built_lib(lib: &str, env: &str, package: &str) -> Result<PathBuf, String> {
    if let Ok(p) = std::env::var(env) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("{env}={}: no such file", p.display()))
        };
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    // <target>/<profile>/deps/<test> or <target>/<profile>/<bin>.
    let ancestors: Vec<&Path> = exe.ancestors().skip(1).take(3).collect();
    let mut candidates = Vec::new();
    if let Ok(t) = std::env::var("CARGO_TARGET_DIR") {
        candidates.push(Path::new(&t).join("release").join(lib));
    }
    candidates.extend(ancestors.iter().map(|a| a.join("release").join(lib)));
    candidates.extend(ancestors.iter().map(|a| a.join(lib)));
    candidates.extend(ancestors.iter().map(|a| a.join("debug").join(lib)));
    let found = candidates
        .into_iter()
        .find(|p| p.is_file())
        .ok_or_else(|| {
            format!(
                "{lib} not found: build it first with `cargo build --release -p {package}` \
             (same CARGO_TARGET_DIR) or set {env}"
            )
        })?;
    // Not a skip: where the build exists, testing old code must fail loudly.
    if let Some(src) = stale_source(&found) {
        panic!(
            "{} is older than {src}, one of its sources: rebuild it with `cargo build \
             --release -p {package}` (a test of a stale build measures old code)",
            found.display()
        );
    }
    Ok(found)
}

/// A source file newer than the build `built`, from the dependency list cargo writes
/// beside it (`<name>.d`, whose `.so` extension if any is dropped); `None` when every
/// source is older, or there is no list to read (a build from elsewhere).
fn stale_source(built: &Path) -> Option<String> {
    let built_at = std::fs::metadata(built).and_then(|m| m.modified()).ok()?;
    let list = std::fs::read_to_string(built.with_extension("d")).ok()?;
    let (_, deps) = list.lines().next()?.split_once(": ")?;
    // Paths are separated by spaces; a space inside a path is escaped as `\ `.
    let deps = deps.replace("\\ ", "\u{0}");
    deps.split(' ')
        .filter(|d| !d.is_empty())
        .map(|d| d.replace('\u{0}', " "))
        .find(|d| {
            std::fs::metadata(d)
                .and_then(|m| m.modified())
                .is_ok_and(|t| t > built_at)
        })
}

/// The target plugin, `libnvmf_qos_tgt.so` (`$NVMF_QOS_TGT_LIB` first).
pub fn tgt_lib() -> Result<PathBuf, String> {
    built_lib("libnvmf_qos_tgt.so", "NVMF_QOS_TGT_LIB", "spdk-plugin")
}

/// The initiator plugin, `libnvmf_qos_ini.so` (`$NVMF_QOS_INI_LIB` first).
pub fn ini_lib() -> Result<PathBuf, String> {
    built_lib("libnvmf_qos_ini.so", "NVMF_QOS_INI_LIB", "initiator-plugin")
}

/// Hugepages reserved for a test: while any guard lives, at least the pages asked for
/// are reserved; when the last one goes, the machine gets back the `nr_hugepages` it had
/// before the first (and hugetlbfs is unmounted if a guard mounted it), so a test run
/// directly (not through the Makefile) leaves the machine as it found it.
#[must_use = "the pages are given back when the guard is dropped"]
#[derive(Debug)]
pub struct Hugepages(());

/// Guards alive, the count found before the first, and whether hugetlbfs was mounted.
static HUGEPAGES: std::sync::Mutex<(u32, Option<u64>, bool)> =
    std::sync::Mutex::new((0, None, false));
const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";

/// Makes sure `pages` 2 MiB hugepages are reserved (root can raise them) and hugetlbfs is
/// mounted, until the returned guard is dropped.
pub fn ensure_hugepages(pages: u64) -> Result<Hugepages, String> {
    let mut g = HUGEPAGES.lock().unwrap_or_else(|e| e.into_inner());
    let path = NR_HUGEPAGES;
    let have: u64 = std::fs::read_to_string(path)
        .map_err(|e| format!("{path}: {e}"))?
        .trim()
        .parse()
        .unwrap_or(0);
    if have < pages {
        std::fs::write(path, pages.to_string()).map_err(|e| {
            format!("need {pages} hugepages (have {have}); as root: echo {pages} > {path}: {e}")
        })?;
        if g.1.is_none() {
            g.1 = Some(have);
        }
    }
    let mounted = std::fs::read_to_string("/proc/mounts")
        .map(|m| m.lines().any(|l| l.contains("hugetlbfs")))
        .unwrap_or(false);
    if !mounted {
        let _ = std::fs::create_dir_all("/dev/hugepages");
        let ok = Command::new("mount")
            .args(["-t", "hugetlbfs", "nodev", "/dev/hugepages"])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            return Err("cannot mount hugetlbfs on /dev/hugepages".into());
        }
        g.2 = true;
    }
    g.0 += 1;
    Ok(Hugepages(()))
}

impl Drop for Hugepages {
    fn drop(&mut self) {
        let mut g = HUGEPAGES.lock().unwrap_or_else(|e| e.into_inner());
        g.0 = g.0.saturating_sub(1);
        if g.0 > 0 {
            return;
        }
        if let Some(had) = g.1.take() {
            let _ = std::fs::write(NR_HUGEPAGES, had.to_string());
        }
        if std::mem::take(&mut g.2) {
            let _ = Command::new("umount").arg("/dev/hugepages").status();
        }
    }
}

/// Niceness of the SPDK processes: the machine is shared (2 cores), and busy-polling
/// processes lose badly to any other runnable process on their core. A small boost
/// (bounded by the tests' run time) keeps measurements meaningful; `nice` ignores it
/// when not permitted.
pub const NICE: &str = "-10";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_build_older_than_a_listed_source_is_stale() {
        let dir = std::env::temp_dir().join(format!("stale-build-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("src dir")).unwrap();
        let (built, old, new) = (
            dir.join("libx.so"),
            dir.join("src dir/old.rs"),
            dir.join("new.rs"),
        );
        for f in [&built, &old, &new] {
            std::fs::write(f, "").unwrap();
        }
        let at = |f: &Path, secs: u64| {
            let t = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(secs);
            std::fs::File::options()
                .write(true)
                .open(f)
                .unwrap()
                .set_modified(t)
                .unwrap();
        };
        at(&built, 2_000_000_000);
        at(&old, 1_000_000_000);
        at(&new, 1_000_000_000);
        // No list beside the build: nothing to say.
        assert_eq!(stale_source(&built), None);
        let list = format!(
            "{}: {} {}\n",
            built.display(),
            old.display().to_string().replace(' ', "\\ "),
            new.display()
        );
        std::fs::write(dir.join("libx.d"), list).unwrap();
        assert_eq!(stale_source(&built), None);
        at(&old, 3_000_000_000);
        assert_eq!(stale_source(&built), Some(old.display().to_string()));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn spdk_present_is_every_listed_path() {
        let dir = std::env::temp_dir().join(format!("spdk-present-{}", std::process::id()));
        let list = "# comment\nbuild/bin/nvmf_tgt\n\nbuild/lib/libspdk_nvmf.so\n";
        std::fs::create_dir_all(dir.join("build/bin")).unwrap();
        std::fs::write(dir.join("build/bin/nvmf_tgt"), "").unwrap();
        assert_eq!(
            spdk_missing(&dir, list),
            vec![dir.join("build/lib/libspdk_nvmf.so")]
        );
        std::fs::create_dir_all(dir.join("build/lib")).unwrap();
        std::fs::write(dir.join("build/lib/libspdk_nvmf.so"), "").unwrap();
        assert!(spdk_missing(&dir, list).is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
        // The shipped list names the libraries the Makefile used to test for.
        assert!(SPDK_PRESENT_LIST.contains("build/lib/libspdk_nvmf.so"));
    }
}
