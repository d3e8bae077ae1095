//! A fuzzing harness for stable Rust, which `make test` runs: inputs are generated from
//! a seeded PRNG by structure-aware mutation of seed corpora (bytes, JSON values, text
//! lines and numbers), not guided by coverage. The coverage-guided fuzzing (libFuzzer,
//! nightly: `fuzz/libfuzzer`, `make fuzz-cov`) runs the same [`targets`], and replays
//! its crash inputs through [`replay_regressions`].
//! [`run`] drives one target for a number of inputs, reports inputs per second, and on
//! a panic writes the input that caused it to `FUZZ_CRASH_DIR` (default
//! `target/fuzz-crashes`) before the process aborts, so every crash is reproducible.
//!
//! [`targets`] holds the targets that build without SPDK; the plugins' RPC-parameter
//! targets live in their crates' tests and use [`run`] and [`json_input`].

pub mod targets;

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde_json::{Map, Value, json};

/// xorshift64*: the inputs, reproducible from the seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }
    pub fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
}

/// Numbers that find edge cases: zero, one, limits of the integer types, huge and
/// fractional floats, negatives.
pub const INTERESTING: &[&str] = &[
    "0",
    "1",
    "-1",
    "255",
    "256",
    "65535",
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "9223372036854775808",
    "18446744073709551615",
    "18446744073709551616",
    "-9223372036854775808",
    "1e308",
    "-1e308",
    "0.5",
    "1.5",
    "-0.0",
    "1e-300",
];

fn interesting_value(rng: &mut Rng) -> Value {
    match rng.below(10) {
        0 => Value::Null,
        1 => json!(rng.chance(2)),
        2 => json!(""),
        3 => json!("x".repeat(300)),
        4 => json!("caf\u{e9} \u{0}\n"),
        5 => json!([]),
        6 => json!({}),
        _ => {
            let n = INTERESTING[rng.below(INTERESTING.len())];
            serde_json::from_str(n).unwrap_or(Value::Null)
        }
    }
}

/// One structural mutation somewhere in `v`: a value replaced by an interesting one, a
/// key dropped, an unknown key added, a value moved under another key, a value wrapped
/// in an array.
pub fn mutate_json(rng: &mut Rng, v: &mut Value) {
    match v {
        Value::Object(m) if !m.is_empty() && !rng.chance(4) => {
            let keys: Vec<String> = m.keys().cloned().collect();
            let k = keys[rng.below(keys.len())].clone();
            match rng.below(6) {
                0 => {
                    m.remove(&k);
                }
                1 => {
                    m.insert(format!("{k}_unknown"), interesting_value(rng));
                }
                2 => {
                    let other = keys[rng.below(keys.len())].clone();
                    let moved = m.get(&other).cloned().unwrap_or(Value::Null);
                    m.insert(k, moved);
                }
                _ => {
                    if let Some(child) = m.get_mut(&k) {
                        mutate_json(rng, child);
                    }
                }
            }
        }
        Value::Array(a) if !a.is_empty() && !rng.chance(4) => {
            let i = rng.below(a.len());
            mutate_json(rng, &mut a[i]);
        }
        _ => {
            *v = match rng.below(4) {
                0 => json!([v.clone()]),
                _ => interesting_value(rng),
            };
        }
    }
}

/// A few byte-level mutations: bit flips, interesting bytes, inserted, deleted or
/// repeated ranges, a splice with another seed.
pub fn mutate_bytes(rng: &mut Rng, b: &mut Vec<u8>, other: &[u8]) {
    for _ in 0..1 + rng.below(4) {
        let len = b.len();
        match rng.below(7) {
            0 if len > 0 => {
                let i = rng.below(len);
                b[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                b[i] = [0u8, 0xFF, 0x7F, 0x80, b'"', b'{', b']', b'\n', b'='][rng.below(9)];
            }
            2 => {
                let at = rng.below(len + 1);
                let n = 1 + rng.below(8);
                let ins: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
                b.splice(at..at, ins);
            }
            3 if len > 0 => {
                let at = rng.below(len);
                let n = 1 + rng.below((len - at).min(16));
                b.drain(at..at + n);
            }
            4 if len > 0 => {
                let at = rng.below(len);
                let n = 1 + rng.below((len - at).min(32));
                let rep: Vec<u8> = b[at..at + n].to_vec();
                b.splice(at..at, rep);
            }
            5 if !other.is_empty() => {
                let cut = rng.below(len + 1);
                let from = rng.below(other.len());
                b.truncate(cut);
                b.extend_from_slice(&other[from..]);
            }
            _ => {
                let at = rng.below(len + 1);
                b.insert(at, rng.next_u64() as u8);
            }
        }
    }
}

/// Text mutations that keep most of the structure: a number replaced by an interesting
/// one, a line deleted, duplicated or swapped, then now and then a byte mutation.
pub fn mutate_text(rng: &mut Rng, text: &str, other: &str) -> Vec<u8> {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    for _ in 0..1 + rng.below(3) {
        if lines.is_empty() {
            break;
        }
        let i = rng.below(lines.len());
        match rng.below(5) {
            0 => {
                lines.remove(i);
            }
            1 => {
                let l = lines[i].clone();
                lines.insert(i, l);
            }
            2 => {
                let j = rng.below(lines.len());
                lines.swap(i, j);
            }
            _ => {
                let l = &lines[i];
                let digits: Vec<usize> = l
                    .char_indices()
                    .filter(|(_, c)| c.is_ascii_digit())
                    .map(|(k, _)| k)
                    .collect();
                if let Some(&start) = digits.get(rng.below(digits.len().max(1))) {
                    let end = l[start..]
                        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
                        .map_or(l.len(), |e| start + e);
                    let n = INTERESTING[rng.below(INTERESTING.len())];
                    lines[i] = format!("{}{n}{}", &l[..start], &l[end..]);
                }
            }
        }
    }
    let mut out = lines.join("\n").into_bytes();
    if rng.chance(4) {
        mutate_bytes(rng, &mut out, other.as_bytes());
    }
    out
}

/// An input for a JSON target: a seed value mutated 1 to 4 times, serialised; now and
/// then its text mutated too (so the parser's own errors are exercised).
pub fn json_input(rng: &mut Rng, seeds: &[Value]) -> Vec<u8> {
    let mut v = seeds[rng.below(seeds.len())].clone();
    for _ in 0..1 + rng.below(4) {
        mutate_json(rng, &mut v);
    }
    let mut out = serde_json::to_vec(&v).unwrap_or_default();
    if rng.chance(8) {
        let other = serde_json::to_vec(&seeds[rng.below(seeds.len())]).unwrap_or_default();
        mutate_bytes(rng, &mut out, &other);
    }
    out
}

/// An input for an RPC target: a seed call `{"method", "params"}` whose parameters are
/// mutated 1 to 4 times (now and then the method or the whole call instead), serialised;
/// now and then its text mutated too.
pub fn rpc_input(rng: &mut Rng, seeds: &[Value]) -> Vec<u8> {
    let mut v = seeds[rng.below(seeds.len())].clone();
    for _ in 0..1 + rng.below(4) {
        if rng.chance(16) {
            mutate_json(rng, &mut v);
        } else if let Some(p) = v.get_mut("params") {
            mutate_json(rng, p);
        }
    }
    let mut out = serde_json::to_vec(&v).unwrap_or_default();
    if rng.chance(8) {
        let other = serde_json::to_vec(&seeds[rng.below(seeds.len())]).unwrap_or_default();
        mutate_bytes(rng, &mut out, &other);
    }
    out
}

/// The method of an RPC input if it is one of `known`, else `"other"` (for outcome
/// tallies).
fn method_of<'a>(input: &[u8], known: &[&'a str]) -> &'a str {
    let v: Value = serde_json::from_slice(input).unwrap_or(Value::Null);
    let m = v["method"].as_str().unwrap_or("");
    known.iter().copied().find(|k| *k == m).unwrap_or("other")
}

/// A method's refusal must say what to change: a negative errno code and a message.
pub fn check_refusal(code: i32, message: &str) {
    assert!(code < 0, "refusal code {code} is not a negative errno");
    assert!(!message.trim().is_empty(), "a refusal without a message");
}

/// Fuzzes an RPC target: `FUZZ_RUNS` inputs (default 20,000) made by [`rpc_input`] from
/// `seeds` (`{"method", "params"}` objects, replayed first), each given to `call`, which
/// says what became of it ("accepted", "refused", ...). Prints inputs per second and the
/// tally of outcomes by method, so a run shows that every method got past its parser.
pub fn fuzz_rpc(target: &str, seeds: &[Value], mut call: impl FnMut(&[u8]) -> &'static str) {
    let runs = std::env::var("FUZZ_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let replay: Vec<Vec<u8>> = seeds
        .iter()
        .map(|v| serde_json::to_vec(v).unwrap_or_default())
        .collect();
    let known: Vec<&str> = seeds.iter().filter_map(|v| v["method"].as_str()).collect();
    let mut outcomes: std::collections::BTreeMap<(&str, &str), u64> = Default::default();
    let r = run(
        target,
        runs,
        1,
        &replay,
        |rng| rpc_input(rng, seeds),
        |input| {
            let m = method_of(input, &known);
            *outcomes.entry((m, call(input))).or_default() += 1;
        },
    );
    println!(
        "{target}: {} inputs in {:.1} s, {:.0} inputs/s, no finding",
        r.runs,
        r.secs,
        r.per_sec()
    );
    println!("  outcomes (method, result): {outcomes:?}");
}

/// The JSON object `{"method": m, "params": p}` of each `(m, p)`.
pub fn rpc_seeds(calls: &[(&str, Value)]) -> Vec<Value> {
    calls
        .iter()
        .map(|(m, p)| {
            let mut o = Map::new();
            o.insert("method".into(), json!(m));
            o.insert("params".into(), p.clone());
            Value::Object(o)
        })
        .collect()
}

/// The JSON values of an RPC session: a stream of `{"method", "params"}` calls
/// separated by white space (one per line in the seeds), up to the first text that is
/// not JSON. The coverage-guided RPC targets replay each input as one session on a
/// fresh state, so that a finding reproduces from its input alone.
pub fn session_calls(input: &[u8]) -> Vec<Value> {
    serde_json::Deserializer::from_slice(input)
        .into_iter::<Value>()
        .map_while(Result::ok)
        .collect()
}

/// The calls of an SPDK `save_config` document (what `nvmf_tgt --json` and
/// `load_config` replay): every entry of every subsystem's `config`, in order. Anything
/// that is not such a document has no calls.
pub fn saved_config_calls(input: &[u8]) -> Vec<Value> {
    let Ok(doc) = serde_json::from_slice::<Value>(input) else {
        return Vec::new();
    };
    let subsystems = doc["subsystems"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    subsystems
        .iter()
        .filter_map(|s| s["config"].as_array())
        .flatten()
        .cloned()
        .collect()
}

/// The calls of the saved configuration seed (`fuzz/corpus/saved_config/
/// both_plugins.json`: a domain, a group, hosts and a QoS bdev of the target, a QoS
/// bdev of the initiator), which the plugins' tests check are accepted.
pub fn saved_config_seed() -> Vec<Value> {
    let path = corpus_dir("saved_config").join("both_plugins.json");
    let doc = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    saved_config_calls(&doc)
}

/// The seed corpus of the coverage-guided target `target` (`fuzz/corpus/<target>/`).
pub fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target)
}

/// The inputs that once crashed `target` (`fuzz/regressions/<target>/`, where `make
/// fuzz-cov` puts libFuzzer's crash, timeout and out-of-memory inputs), each given to
/// `check` so that what was fixed stays fixed. Returns how many there were; a missing
/// directory is a target that never crashed.
pub fn replay_regressions(target: &str, mut check: impl FnMut(&[u8])) -> usize {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("regressions")
        .join(target);
    let inputs = corpus(&dir);
    for input in &inputs {
        check(input);
    }
    inputs.len()
}

/// Checks that `fuzz/corpus/<target>/session.jsonl`, the coverage-guided target's seed
/// session, holds `seeds` (one per line), as the mutation fuzzer starts from them: a
/// seed added to one must reach the other.
pub fn check_session_seed(target: &str, seeds: &[Value]) {
    let path = corpus_dir(target).join("session.jsonl");
    let have = session_calls(&std::fs::read(&path).unwrap_or_default());
    let want: String = seeds.iter().map(|v| format!("{v}\n")).collect();
    assert!(
        have == seeds,
        "{} is not the seeds of {target} one per line; write it as:\n{want}",
        path.display()
    );
}

thread_local! {
    static CURRENT: RefCell<(String, Vec<u8>)> = const { RefCell::new((String::new(), Vec::new())) };
}

/// Where findings go when set by [`set_crash_dir`] (else `FUZZ_CRASH_DIR`, else
/// `target/fuzz-crashes`).
static CRASH_DIR: std::sync::Mutex<Option<PathBuf>> = std::sync::Mutex::new(None);

pub fn set_crash_dir(dir: PathBuf) {
    *CRASH_DIR.lock().unwrap_or_else(|e| e.into_inner()) = Some(dir);
}

fn crash_dir() -> PathBuf {
    if let Some(d) = CRASH_DIR.lock().ok().and_then(|d| d.clone()) {
        return d;
    }
    std::env::var_os("FUZZ_CRASH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target/fuzz-crashes"))
}

/// Writes the input being run to the crash directory when a target panics.
fn install_crash_hook() {
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        CURRENT.with(|c| {
            // A panic on a thread that runs no fuzz target (another test of the same
            // binary) is not a finding: nothing to save.
            if let Ok(c) = c.try_borrow()
                && !c.0.is_empty()
            {
                let dir = crash_dir();
                let _ = std::fs::create_dir_all(&dir);
                let path = dir.join(format!("{}-crash", c.0));
                let _ = std::fs::write(&path, &c.1);
                eprintln!(
                    "fuzz target {} panicked; input ({} bytes) saved to {}: {:?}",
                    c.0,
                    c.1.len(),
                    path.display(),
                    String::from_utf8_lossy(&c.1)
                );
            }
        });
        prev(info);
    }));
}

/// What a run did.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub target: String,
    pub runs: u64,
    pub secs: f64,
}

impl Report {
    pub fn per_sec(&self) -> f64 {
        self.runs as f64 / self.secs.max(1e-9)
    }
}

/// Runs `check` on `runs` inputs made by `gen` (after every seed of `replay` as it is),
/// printing progress every 10 s. A panic in `check` is a finding: the input is saved
/// (see the crate's doc) and the panic propagates.
pub fn run(
    target: &str,
    runs: u64,
    seed: u64,
    replay: &[Vec<u8>],
    mut gen_input: impl FnMut(&mut Rng) -> Vec<u8>,
    mut check: impl FnMut(&[u8]),
) -> Report {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(install_crash_hook);
    let mut rng = Rng::new(seed);
    let start = Instant::now();
    let mut last = start;
    let mut done = 0u64;
    let mut one = |input: Vec<u8>, done: &mut u64| {
        CURRENT.with(|c| {
            let mut c = c.borrow_mut();
            c.0.clear();
            c.0.push_str(target);
            c.1.clone_from(&input);
        });
        check(&input);
        *done += 1;
    };
    for r in replay {
        one(r.clone(), &mut done);
    }
    while done < runs {
        let input = gen_input(&mut rng);
        one(input, &mut done);
        if done % 4096 == 0 && last.elapsed().as_secs() >= 10 {
            last = Instant::now();
            eprintln!(
                "  {target}: {done} inputs, {:.0}/s",
                done as f64 / start.elapsed().as_secs_f64()
            );
        }
    }
    // Done: a later panic on this thread is no longer this target's.
    CURRENT.with(|c| c.borrow_mut().0.clear());
    Report {
        target: target.into(),
        runs: done,
        secs: start.elapsed().as_secs_f64(),
    }
}

/// The files of a corpus directory (seeds), sorted by name.
pub fn corpus(dir: &std::path::Path) -> Vec<Vec<u8>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    files.iter().filter_map(|p| std::fs::read(p).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutations_are_reproducible_from_the_seed() {
        let seeds = vec![json!({"a": 1, "b": [1, 2, {"c": "x"}]})];
        let a: Vec<Vec<u8>> = {
            let mut r = Rng::new(7);
            (0..50).map(|_| json_input(&mut r, &seeds)).collect()
        };
        let mut r = Rng::new(7);
        let b: Vec<Vec<u8>> = (0..50).map(|_| json_input(&mut r, &seeds)).collect();
        assert_eq!(a, b);
        assert!(
            a.iter()
                .any(|x| x != &serde_json::to_vec(&seeds[0]).unwrap())
        );
    }

    #[test]
    fn text_mutation_replaces_numbers() {
        let mut r = Rng::new(3);
        let changed = (0..200)
            .map(|_| mutate_text(&mut r, "a = 5\nb = 6\n", ""))
            .any(|t| {
                INTERESTING
                    .iter()
                    .any(|n| String::from_utf8_lossy(&t).contains(n) && *n != "5" && *n != "6")
            });
        assert!(changed);
    }

    #[test]
    fn a_finding_is_saved_before_the_panic_goes_on() {
        let dir = std::env::temp_dir().join(format!("qos-fuzz-{}", std::process::id()));
        set_crash_dir(dir.clone());
        let found = std::panic::catch_unwind(|| {
            run(
                "planted",
                100_000,
                5,
                &[b"seed".to_vec()],
                |rng| {
                    let mut b = b"seed".to_vec();
                    mutate_bytes(rng, &mut b, b"");
                    b
                },
                |input| assert!(!input.contains(&0xFF), "planted bug"),
            )
        });
        assert!(
            found.is_err(),
            "the planted bug was not found in 100,000 inputs"
        );
        let saved = std::fs::read(dir.join("planted-crash")).expect("crash input saved");
        assert!(saved.contains(&0xFF));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn run_counts_replay_and_generated_inputs() {
        let mut seen = 0;
        let r = run("t", 10, 1, &[vec![1], vec![2]], |_| vec![0], |_| seen += 1);
        assert_eq!((r.runs, seen), (10, 10));
    }
}
