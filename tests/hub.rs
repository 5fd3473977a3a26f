//! Mounting from the Hugging Face Hub (`hf://ORG/REPO[@REV][/PATH]`),
//! through the real binary, against a local stand-in of the Hub's HTTP
//! protocol (`tests/python/fake_hub.py`: the API route, `resolve` with 302
//! to a CDN on a second host name, Range, gated repos, signed URLs that
//! expire, injected 429/5xx/stalls). The first test proves the stand-in
//! faithful: the real `huggingface_hub` client works against it.
//!
//! These tests need FUSE and `.venv/bin/python` (or `$ZT_PYTHON`) with
//! `huggingface_hub` and `safetensors` (`scripts/setup.sh --test`); they
//! fail, not skip, without them.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};
use support::{Mount, Run};

const C1: &str = "1111111111111111111111111111111111111111";
const C2: &str = "2222222222222222222222222222222222222222";
const C3: &str = "3333333333333333333333333333333333333333";
const C4: &str = "4444444444444444444444444444444444444444";
const C5: &str = "5555555555555555555555555555555555555555";
const TOKEN: &str = "hf_granted";

fn python() -> PathBuf {
    let py = support::python::Python::from_env();
    if let Err(why) = py.probe("import huggingface_hub, safetensors") {
        panic!("{why} (scripts/setup.sh --test makes it)");
    }
    py.exe().to_path_buf()
}

/// What most tests start from, in the order it is dropped back: the
/// lock that runs them one at a time, a scratch mount, the repos written
/// under it, and the stand-in serving them.
fn setup() -> (std::sync::MutexGuard<'static, ()>, Mount, Repos, Hub) {
    let s = support::serial();
    let py = python();
    let m = scratch();
    let repos = write_repos(&m.scratch_path("files"));
    let hub = Hub::start(&py, &repos.config, 0);
    (s, m, repos, hub)
}

fn scratch() -> Mount {
    Mount::scratch().expect("FUSE is needed by this test (/dev/fuse and fusermount3)")
}

/// `n` pseudo-random bytes (no two blocks alike, so a block served at the
/// wrong place shows).
fn noise(seed: u64, n: usize) -> Vec<u8> {
    let mut r = support::Rng(seed);
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        out.extend_from_slice(&r.next_u64().to_le_bytes());
    }
    out.truncate(n);
    out
}

/// A safetensors file of uint8 tensors (name, bytes), in name order.
fn safetensors(path: &Path, tensors: &[(&str, &[u8])]) {
    let mut header = serde_json::Map::new();
    let mut at = 0;
    for (name, b) in tensors {
        header.insert(
            name.to_string(),
            json!({"dtype": "U8", "shape": [b.len()], "data_offsets": [at, at + b.len()]}),
        );
        at += b.len();
    }
    let mut h = serde_json::to_vec(&Value::Object(header)).unwrap();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(&(h.len() as u64).to_le_bytes()).unwrap();
    f.write_all(&h).unwrap();
    for (_, b) in tensors {
        f.write_all(b).unwrap();
    }
}

/// Tensor name → bytes.
type Tensors = [(String, Vec<u8>)];

/// The repos of the stand-in, written under `dir`, and the tensors each
/// commit's weights hold.
struct Repos {
    config: Value,
    /// Tensor name → bytes, per commit of org/single and org/sharded.
    c1: Vec<(String, Vec<u8>)>,
    c2: Vec<(String, Vec<u8>)>,
    c3: Vec<(String, Vec<u8>)>,
}

fn write_repos(dir: &Path) -> Repos {
    std::fs::create_dir_all(dir).unwrap();
    let f = |n: &str| dir.join(n).to_string_lossy().into_owned();
    let st = |name: &str, ts: &[(String, Vec<u8>)]| {
        let v: Vec<(&str, &[u8])> = ts.iter().map(|(n, b)| (n.as_str(), &b[..])).collect();
        safetensors(&dir.join(name), &v);
        f(name)
    };
    let c1 = vec![
        ("embed".to_string(), noise(1, 1_500_000)),
        ("head".to_string(), noise(2, 70_000)),
    ];
    let c2 = vec![
        ("embed".to_string(), noise(3, 1_500_000)),
        ("head".to_string(), noise(4, 70_000)),
    ];
    let c3 = vec![
        ("w1".to_string(), noise(5, 400_000)),
        ("w2".to_string(), noise(6, 300_000)),
    ];
    let s1 = st("c1.safetensors", &c1);
    let s2 = st("c2.safetensors", &c2);
    let sh1 = st("c3-1.safetensors", &c3[..1]);
    let sh2 = st("c3-2.safetensors", &c3[1..]);
    std::fs::write(dir.join("config.json"), b"{\"model_type\": \"test\"}\n").unwrap();
    std::fs::write(dir.join("tokenizer.json"), b"{}\n").unwrap();
    let index = json!({"metadata": {"total_size": 700_000}, "weight_map": {
        "w1": "model-00001-of-00002.safetensors", "w2": "model-00002-of-00002.safetensors"}});
    std::fs::write(dir.join("index.json"), index.to_string()).unwrap();
    std::fs::write(dir.join("q4.gguf"), noise(7, 1000)).unwrap();
    std::fs::write(dir.join("q8.gguf"), noise(8, 1000)).unwrap();
    let config = json!({
        "tokens": [TOKEN],
        "renamed": {"old/single": "org/single"},
        "moved_away": {"away/single": "org/single"},
        "repos": {
            "org/single": {
                "refs": {"main": C1, "v1": C1, "dev": C2},
                "commits": {
                    C1: {"model.safetensors": s1, "config.json": f("config.json"),
                         "tokenizer.json": f("tokenizer.json")},
                    C2: {"model.safetensors": s2, "config.json": f("config.json")},
                }
            },
            "org/sharded": {
                "refs": {"main": C3},
                "commits": {C3: {
                    "model.safetensors.index.json": f("index.json"),
                    "model-00001-of-00002.safetensors": sh1,
                    "model-00002-of-00002.safetensors": sh2,
                    "config.json": f("config.json"),
                }}
            },
            "org/gated": {
                "gated": true,
                "refs": {"main": C4},
                "commits": {C4: {"model.safetensors": s1.clone()}}
            },
            "datasets/org/data": {
                "refs": {"main": C2},
                "commits": {C2: {"data.safetensors": s1.clone(), "README.md": f("config.json")}}
            },
            "org/quants": {
                "refs": {"main": C5},
                "commits": {C5: {"m.Q4_K_M.gguf": f("q4.gguf"), "m.Q8_0.gguf": f("q8.gguf"),
                                 "README.md": f("config.json")}}
            },
        }
    });
    Repos { config, c1, c2, c3 }
}

/// The stand-in Hub, killed (and reaped) on drop.
type Hub = support::server::Server;

impl Hub {
    fn start(py: &Path, config: &Value, latency_ms: u32) -> Hub {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("hub.json");
        std::fs::write(&cfg, config.to_string()).unwrap();
        let latency = latency_ms.to_string();
        let mut hub = Hub::script(
            Command::new(py),
            "fake_hub.py",
            &[cfg.as_os_str(), latency.as_ref()],
        );
        hub.dir = Some(dir);
        hub
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn get(&self, path: &str) -> Vec<u8> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        let at = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
        assert!(out.starts_with(b"HTTP/1.1 200"), "{path}: {out:?}");
        out[at + 4..].to_vec()
    }

    fn control(&self, q: &str) {
        self.get(q);
    }

    fn stats(&self) -> Value {
        serde_json::from_slice(&self.get("/__stats")).unwrap()
    }

    fn count(&self, key: &str) -> u64 {
        self.stats()[key].as_u64().unwrap()
    }
}

/// Mounts `url` from `hub` with `env` added to a clean Hub environment
/// (no token, an empty HF_HOME of the scratch dir).
fn hf_run(m: &mut Mount, hub: &str, url: &str, cache: &Path, env: &[(&str, &str)]) -> Run {
    hf_run_args(m, hub, url, cache, env, &[])
}

fn hf_run_args(
    m: &mut Mount,
    hub: &str,
    url: &str,
    cache: &Path,
    env: &[(&str, &str)],
    args: &[&str],
) -> Run {
    std::fs::create_dir_all(cache).unwrap();
    let home = m.scratch_path("hf_home");
    std::fs::create_dir_all(&home).unwrap();
    let mut cmd = Command::new(support::bin());
    cmd.arg(url)
        .arg(&m.mp)
        .arg("--log-file")
        .arg(&m.log)
        .arg("--cache-dir")
        .arg(cache)
        .args(["-o", "block_size=64K,remote_timeout=2,remote_retries=3"])
        .args(args);
    for k in [
        "HF_TOKEN",
        "HF_TOKEN_PATH",
        "HF_HUB_OFFLINE",
        "HF_HUB_CACHE",
        "HUGGINGFACE_HUB_CACHE",
        "XDG_CACHE_HOME",
    ] {
        cmd.env_remove(k);
    }
    cmd.env("HF_ENDPOINT", hub)
        .env("HF_HOME", &home)
        .envs(env.iter().copied());
    let r = support::run_with_timeout(&mut cmd, Duration::from_secs(30));
    if r.ok() {
        m.pid = support::daemon_pids(&m.mp).into_iter().max();
    }
    r
}

fn hf_mount(m: &mut Mount, hub: &str, url: &str, cache: &Path, env: &[(&str, &str)]) {
    let r = hf_run(m, hub, url, cache, env);
    assert!(
        r.ok(),
        "mounting {url} failed: {}{}\nlog: {}",
        r.stderr,
        r.stdout,
        m.log_text()
    );
}

/// The one line a refused mount prints.
fn refused(r: &Run) -> &str {
    assert!(!r.ok(), "mounted: {r:?}");
    assert_eq!(r.stderr.lines().count(), 1, "not one line: {:?}", r.stderr);
    r.stderr.trim_end()
}

fn assert_tensors(m: &Mount, want: &[(String, Vec<u8>)]) {
    for (name, bytes) in want {
        let got = m.read(name);
        assert!(got == *bytes, "{name}: wrong bytes ({} read)", got.len());
    }
}

fn source(m: &Mount) -> Value {
    m.index()["attributes"]["source"].clone()
}

#[test]
fn huggingface_hub_itself_accepts_the_stand_in() {
    let _s = support::serial();
    let py = python();
    let dir = tempfile::tempdir().unwrap();
    let repos = write_repos(&dir.path().join("files"));
    let hub = Hub::start(&py, &repos.config, 0);
    let script = r#"
import sys, hashlib
from huggingface_hub import HfApi, hf_hub_download
from huggingface_hub.errors import (GatedRepoError, RepositoryNotFoundError,
    RevisionNotFoundError, EntryNotFoundError)
ep, cache, token = sys.argv[1], sys.argv[2], sys.argv[3]
i = HfApi(endpoint=ep).model_info("org/single", revision="v1", files_metadata=True)
print(i.sha, sorted((s.rfilename, s.size, s.lfs.size if s.lfs else None) for s in i.siblings))
for rev, name in [("main", "model.safetensors"), ("dev", "model.safetensors"), ("main", "config.json")]:
    p = hf_hub_download("org/single", name, revision=rev, cache_dir=cache, endpoint=ep, token=False)
    print(rev, name, p.split("/snapshots/")[1].split("/")[0], hashlib.sha256(open(p, "rb").read()).hexdigest())
def fails(**kw):
    try:
        hf_hub_download(cache_dir=cache, endpoint=ep, **kw)
        return "downloaded"
    except (GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError, EntryNotFoundError) as e:
        return type(e).__name__
print(fails(repo_id="org/gated", filename="model.safetensors", token=False))
p = hf_hub_download("org/gated", "model.safetensors", cache_dir=cache, endpoint=ep, token=token)
print("gated with token", hashlib.sha256(open(p, "rb").read()).hexdigest())
print(fails(repo_id="org/none", filename="x", token=False))
print(fails(repo_id="org/single", filename="x", revision="nope", token=False))
print(fails(repo_id="org/single", filename="nope.bin", token=False))
print("renamed", HfApi(endpoint=ep).model_info("old/single", revision="v1").sha)
p = hf_hub_download("old/single", "model.safetensors", cache_dir=cache, endpoint=ep, token=False)
print("renamed", hashlib.sha256(open(p, "rb").read()).hexdigest())
d = HfApi(endpoint=ep).dataset_info("org/data", files_metadata=True)
p = hf_hub_download("org/data", "data.safetensors", repo_type="dataset", cache_dir=cache, endpoint=ep, token=False)
print("dataset", d.sha, sorted(s.rfilename for s in d.siblings), hashlib.sha256(open(p, "rb").read()).hexdigest())
"#;
    let cache = dir.path().join("hf_cache");
    let out = Command::new(&py)
        .arg("-c")
        .arg(script)
        .arg(hub.endpoint())
        .arg(&cache)
        .arg(TOKEN)
        .env("HF_HUB_DISABLE_TELEMETRY", "1")
        .env("HF_HUB_DISABLE_XET", "1")
        .env("HF_HOME", dir.path().join("home"))
        .env_remove("HF_TOKEN")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sha = |p: &str| {
        use sha2::Digest;
        let d = sha2::Sha256::digest(std::fs::read(p).unwrap());
        d.iter().map(|b| format!("{b:02x}")).collect::<String>()
    };
    let files = dir.path().join("files");
    let f = |n: &str| files.join(n).to_string_lossy().into_owned();
    let size = |n: &str| std::fs::metadata(files.join(n)).unwrap().len();
    let want = format!(
        "{C1} [('config.json', {}, None), ('model.safetensors', {}, {}), ('tokenizer.json', 3, None)]\n\
         main model.safetensors {C1} {}\n\
         dev model.safetensors {C2} {}\n\
         main config.json {C1} {}\n\
         GatedRepoError\n\
         gated with token {}\n\
         RepositoryNotFoundError\n\
         RevisionNotFoundError\n\
         RemoteEntryNotFoundError\n\
         renamed {C1}\n\
         renamed {}\n\
         dataset {C2} ['README.md', 'data.safetensors'] {}\n",
        size("config.json"),
        size("c1.safetensors"),
        size("c1.safetensors"),
        sha(&f("c1.safetensors")),
        sha(&f("c2.safetensors")),
        sha(&f("config.json")),
        sha(&f("c1.safetensors")),
        sha(&f("c1.safetensors")),
        sha(&f("c1.safetensors")),
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), want);
    // The large files came from the CDN host, which never saw the token.
    let st = hub.stats();
    assert!(st["cdn_requests"].as_u64().unwrap() >= 3, "{st}");
}

#[test]
fn a_single_file_repo_mounts_pinned_to_its_commit_without_the_token_on_the_cdn() {
    let (_s, mut m, repos, hub) = setup();
    let cache = m.scratch_path("cache");
    hf_mount(
        &mut m,
        &hub.endpoint(),
        "hf://org/single",
        &cache,
        &[("HF_TOKEN", TOKEN)],
    );
    assert_tensors(&m, &repos.c1);
    let src = source(&m);
    assert_eq!(src["repo"], "org/single");
    assert_eq!(src["revision"], "main");
    assert_eq!(src["commit"], C1);
    assert_eq!(src["path"], "model.safetensors");
    assert_eq!(src["other_files"], json!(["config.json", "tokenizer.json"]));
    assert_eq!(
        m.index()["file"],
        format!("hf://org/single@{C1}/model.safetensors")
    );
    assert!(
        m.log_text()
            .contains(&format!("mounted hf://org/single@{C1}/model.safetensors")),
        "{}",
        m.log_text()
    );
    // Said while the revision was resolved, before the daemon (and its
    // log) existed: in that log all the same.
    assert!(
        m.log_text().contains(&format!(
            "revision main is commit {C1}; mounting model.safetensors"
        )),
        "{}",
        m.log_text()
    );
    let st = hub.stats();
    assert_eq!(st["cdn_auth"], 0, "the token went to the CDN: {st}");
    let log = st["log"].as_array().unwrap();
    // The API once, the resolve once; every byte from the CDN host.
    let hub_reqs: Vec<&Value> = log.iter().filter(|e| e[0] == "127.0.0.1").collect();
    assert_eq!(hub_reqs.len(), 2, "{hub_reqs:?}");
    assert_eq!(hub_reqs[0][2], "/api/models/org/single/revision/main");
    assert_eq!(
        hub_reqs[1][2],
        format!("/org/single/resolve/{C1}/model.safetensors")
    );
    m.unmount_ok();
}

#[test]
fn a_dataset_repo_mounts_by_its_hf_filesystem_name() {
    let (_s, mut m, repos, hub) = setup();
    let cache = m.scratch_path("cache");
    hf_mount(
        &mut m,
        &hub.endpoint(),
        "hf://datasets/org/data",
        &cache,
        &[],
    );
    assert_tensors(&m, &repos.c1);
    assert_eq!(source(&m)["repo"], "datasets/org/data");
    assert_eq!(
        m.index()["file"],
        format!("hf://datasets/org/data@{C2}/data.safetensors")
    );
    let st = hub.stats();
    let paths: Vec<&str> = st["log"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e[2].as_str())
        .collect();
    assert_eq!(
        paths[0], "/api/datasets/org/data/revision/main",
        "{paths:?}"
    );
    assert_eq!(
        paths[1],
        format!("/datasets/org/data/resolve/{C2}/data.safetensors")
    );
    m.unmount_ok();
}

#[test]
fn a_sharded_repo_mounts_through_its_index() {
    let (_s, mut m, repos, hub) = setup();
    let cache = m.scratch_path("cache");
    hf_mount(&mut m, &hub.endpoint(), "hf://org/sharded", &cache, &[]);
    assert_tensors(&m, &repos.c3);
    let src = source(&m);
    assert_eq!(src["commit"], C3);
    assert_eq!(src["path"], "model.safetensors.index.json");
    assert_eq!(
        m.index()["file"],
        format!("hf://org/sharded@{C3}/model.safetensors.index.json")
    );
    m.unmount_ok();
}

#[test]
fn a_branch_a_tag_a_commit_a_path_and_revision_choose_what_is_mounted() {
    let (_s, mut m, repos, hub) = setup();
    let cache = m.scratch_path("cache");
    let ep = hub.endpoint();
    // A renamed repo's old name: the Hub redirects it to the new one.
    let cases: [(&str, &[&str], &str, &Tensors); 6] = [
        ("hf://org/single@dev", &[], C2, &repos.c2),
        ("hf://old/single@v1", &[], C1, &repos.c1),
        ("hf://org/single@v1", &[], C1, &repos.c1),
        (&format!("hf://org/single@{C2}"), &[], C2, &repos.c2),
        (
            "hf://org/single/model.safetensors",
            &["--revision", "dev"],
            C2,
            &repos.c2,
        ),
        (
            "hf://org/sharded/model-00002-of-00002.safetensors",
            &[],
            C3,
            &repos.c3[1..],
        ),
    ];
    for (url, args, commit, want) in cases {
        let r = hf_run_args(&mut m, &ep, url, &cache, &[], args);
        assert!(r.ok(), "{url}: {}", r.stderr);
        assert_tensors(&m, want);
        assert_eq!(source(&m)["commit"], commit, "{url}");
        m.unmount_ok();
    }
    let r = hf_run_args(
        &mut m,
        &ep,
        "hf://org/single@v1",
        &cache,
        &[],
        &["--revision", "dev"],
    );
    assert_eq!(
        refused(&r),
        "ztensor-mount: hf://org/single@v1: the URL names revision \"v1\" and --revision \"dev\"; give one"
    );
}

#[test]
fn a_gated_repo_needs_a_token_from_hf_token_or_the_token_file() {
    let (_s, mut m, repos, hub) = setup();
    let cache = m.scratch_path("cache");
    let ep = hub.endpoint();
    let r = hf_run(&mut m, &ep, "hf://org/gated", &cache, &[]);
    assert_eq!(
        refused(&r),
        "ztensor-mount: hf://org/gated@main: the repo is gated: its files need a token \
         (HF_TOKEN, or `huggingface-cli login`) of an account that accepted its conditions"
    );
    let r = hf_run(
        &mut m,
        &ep,
        "hf://org/gated",
        &cache,
        &[("HF_TOKEN", "hf_other")],
    );
    assert_eq!(
        refused(&r),
        "ztensor-mount: hf://org/gated@main: the repo is gated, and the token's account has \
         not been granted access (accept its conditions on the Hub)"
    );
    // Pasted with its newline and spaces, as huggingface_hub takes it.
    let pasted = format!(" {TOKEN}\n");
    hf_mount(
        &mut m,
        &ep,
        "hf://org/gated",
        &cache,
        &[("HF_TOKEN", &pasted)],
    );
    assert_tensors(&m, &repos.c1);
    m.unmount_ok();
    // The file `huggingface-cli login` writes: $HF_HOME/token.
    std::fs::create_dir_all(m.scratch_path("hf_home")).unwrap();
    std::fs::write(
        m.scratch_path("hf_home").join("token"),
        format!("{TOKEN}\n"),
    )
    .unwrap();
    hf_mount(&mut m, &ep, "hf://org/gated", &cache, &[]);
    assert_tensors(&m, &repos.c1);
    assert_eq!(hub.count("cdn_auth"), 0);
    m.unmount_ok();
    // A token file that cannot be read is named, not passed over.
    let not_a_file = m.scratch_path("hf_home");
    let r = hf_run(
        &mut m,
        &ep,
        "hf://org/gated",
        &cache,
        &[("HF_TOKEN_PATH", not_a_file.to_str().unwrap())],
    );
    assert_eq!(
        refused(&r),
        format!(
            "ztensor-mount: hf://org/gated@main: the repo is gated: its files need a token \
             (HF_TOKEN, or `huggingface-cli login`) of an account that accepted its conditions \
             (the token file {} cannot be read: not a regular file)",
            not_a_file.display()
        )
    );
}

#[test]
fn an_unknown_repo_revision_or_file_and_an_ambiguous_repo_are_refused_in_one_line() {
    let (_s, mut m, _repos, hub) = setup();
    let cache = m.scratch_path("cache");
    let ep = hub.endpoint();
    let cases = [
        (
            "hf://org/none",
            "ztensor-mount: hf://org/none@main: no such repo (or it is private: give a token \
             with HF_TOKEN or `huggingface-cli login`)"
                .to_string(),
        ),
        (
            "hf://org/single@nope",
            "ztensor-mount: hf://org/single@nope: no such revision (branch, tag or commit)"
                .to_string(),
        ),
        (
            "hf://org/single/nope.safetensors",
            format!(
                "ztensor-mount: hf://org/single@main/nope.safetensors: no such file at commit {C1}"
            ),
        ),
        (
            "hf://org/quants",
            "ztensor-mount: hf://org/quants@main: the repo has several weights files; name one: \
             hf://org/quants@main/m.Q4_K_M.gguf hf://org/quants@main/m.Q8_0.gguf"
                .to_string(),
        ),
        (
            "hf://org",
            "ztensor-mount: hf://org: expected hf://[datasets/|spaces/]ORG/REPO[@REVISION][/PATH]"
                .to_string(),
        ),
    ];
    for (url, want) in cases {
        let r = hf_run(&mut m, &ep, url, &cache, &[]);
        assert_eq!(refused(&r), want, "{url}");
    }
    let r = hf_run(&mut m, &ep, "hf://org/none", &cache, &[("HF_TOKEN", TOKEN)]);
    assert_eq!(
        refused(&r),
        "ztensor-mount: hf://org/none@main: no such repo, or the token cannot see it"
    );
    // No header can carry it: said by name, not by the HTTP client.
    let r = hf_run(
        &mut m,
        &ep,
        "hf://org/single",
        &cache,
        &[("HF_TOKEN", "hf_a\u{1}b")],
    );
    assert!(
        refused(&r).ends_with("HF_TOKEN holds a control character"),
        "{}",
        refused(&r)
    );
}

/// Reads `name` in 64 KiB pieces, calling `between` after the first half.
fn read_in_halves(m: &Mount, name: &str, between: impl FnOnce()) -> std::io::Result<Vec<u8>> {
    let f = std::fs::File::open(m.path(name))?;
    let len = f.metadata()?.len() as usize;
    let mut out = vec![0u8; len];
    let half = len / 2;
    f.read_exact_at(&mut out[..half], 0)?;
    between();
    f.read_exact_at(&mut out[half..], half as u64)?;
    Ok(out)
}

#[test]
fn a_signed_url_that_expires_mid_read_is_resolved_again() {
    let (_s, mut m, repos, hub) = setup();
    let cache = m.scratch_path("cache");
    hf_mount(&mut m, &hub.endpoint(), "hf://org/single", &cache, &[]);
    let resolves_before = hub.count("hub_requests");
    let got = read_in_halves(&m, "embed", || hub.control("/__expire")).unwrap();
    assert!(got == repos.c1[0].1, "wrong bytes after the URL expired");
    // One resolve more (the HEAD that signed a new URL), nothing else.
    assert_eq!(hub.count("hub_requests"), resolves_before + 1);
    assert!(
        m.log_text().contains(
            "model.safetensors: the signed URL was refused (expired?); resolving it again"
        ),
        "{}",
        m.log_text()
    );
    m.unmount_ok();
}

/// Reads 4 KiB of `embed` at `at`, which must fail with `errno`; the
/// mount's log after.
fn failed_read_log(m: &Mount, at: u64, errno: i32) -> String {
    let f = std::fs::File::open(m.path("embed")).unwrap();
    let mut buf = vec![0u8; 4096];
    let e = f.read_exact_at(&mut buf, at).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(errno), "{e}");
    m.log_text()
}

#[test]
fn rate_limits_5xx_and_a_stall_recover_a_lasting_429_fails_the_read_and_a_lasting_403_is_eacces() {
    let (_s, mut m, repos, hub) = setup();
    let cache = m.scratch_path("cache");
    // At mount: the API and resolve answer 429, then 503, then serve.
    hub.control("/__fault?kind=status&status=429&count=2&on=hub");
    hub.control("/__fault?kind=status&status=503&count=1&on=hub");
    hf_mount(&mut m, &hub.endpoint(), "hf://org/single", &cache, &[]);
    assert!(
        m.log_text().is_empty() || !m.log_text().contains("ERROR"),
        "{}",
        m.log_text()
    );
    // While reading: each fault once, then a read that must get through.
    for fault in [
        "kind=status&status=429&count=2",
        "kind=status&status=500&count=1",
        "kind=status&status=503&count=2",
        "kind=stall&secs=3&count=1",
    ] {
        hub.control(&format!("/__fault?{fault}&on=cdn"));
    }
    assert_tensors(&m, &repos.c1);
    m.unmount_ok();
    // A 429 that lasts: the read fails with EIO, and the log says why.
    let cache2 = m.scratch_path("cache2");
    hf_mount(&mut m, &hub.endpoint(), "hf://org/single", &cache2, &[]);
    hub.control("/__fault?kind=status&status=429&count=1000&on=cdn");
    let log = failed_read_log(&m, 700_000, libc::EIO);
    assert!(
        log.contains("rate limited by the CDN at localhost (429) after 4 tries; try again later"),
        "{log}"
    );
    hub.control("/__reset");
    m.unmount_ok();
    // A CDN that refuses every freshly signed URL (403): access denied,
    // EACCES, after resolving it again three times.
    let cache3 = m.scratch_path("cache3");
    hf_mount(&mut m, &hub.endpoint(), "hf://org/single", &cache3, &[]);
    hub.control("/__fault?kind=status&status=403&count=1000&on=cdn");
    let log = failed_read_log(&m, 700_000, libc::EACCES);
    assert!(
        log.contains("model.safetensors: the CDN refused its freshly signed URL three times"),
        "{log}"
    );
    hub.control("/__reset");
    m.unmount_ok();
}

/// A 429 from the Hub that lasts refuses the mount in one line, which
/// suggests a token only to a mount that has none.
#[test]
fn a_lasting_429_at_mount_suggests_a_token_only_without_one() {
    let (_s, mut m, _repos, hub) = setup();
    let ep = hub.endpoint();
    for (i, (env, hint)) in [(&[][..], true), (&[("HF_TOKEN", TOKEN)][..], false)]
        .into_iter()
        .enumerate()
    {
        hub.control("/__fault?kind=status&status=429&count=1000&on=hub");
        let cache = m.scratch_path(&format!("cache{i}"));
        let r = hf_run(&mut m, &ep, "hf://org/single", &cache, env);
        let line = refused(&r);
        assert!(
            line.contains("(429) after 4 tries; try again later"),
            "{line}"
        );
        assert_eq!(
            line.contains("a token raises the Hub's limits"),
            hint,
            "{line}"
        );
        hub.control("/__reset");
    }
}

/// A repo the Hub sends to another host is refused in one line naming it;
/// the token goes nowhere but the Hub.
#[test]
fn a_repo_the_hub_sends_to_another_host_is_refused_naming_it_and_gets_no_token() {
    let (_s, mut m, _repos, hub) = setup();
    let cache = m.scratch_path("cache");
    let r = hf_run(
        &mut m,
        &hub.endpoint(),
        "hf://away/single",
        &cache,
        &[("HF_TOKEN", TOKEN)],
    );
    let line = refused(&r);
    assert!(
        line.contains("the Hub redirects the repo to \"http://localhost:")
            && line.contains("another host, which is not followed")
            && !line.contains("blobs="),
        "{line}"
    );
    // Not followed: nothing went to the other host.
    let st = hub.stats();
    let log = st["log"].as_array().unwrap();
    assert!(log.iter().all(|e| e[0] != "localhost"), "{st}");
}

/// A repo listing many files (a dataset's): the list is counted against
/// `--index-memory` as the API's answer is parsed (a JSON tree of it took
/// some 17 times the answer), so a list over it refuses the mount in one
/// line naming the limit, and within it the mount command's peak memory
/// stays near the answer's own size (22 MB here).
#[test]
fn a_repo_listing_many_files_is_read_within_the_index_memory() {
    let (_s, mut m, repos, hub) = setup();
    hub.control("/__many?count=300000");
    let cache = m.scratch_path("cache");
    let slow = ["-o", "remote_timeout=60"];
    let small = [&slow[..], &["--index-memory", "16M"]].concat();
    let r = hf_run_args(
        &mut m,
        &hub.endpoint(),
        "hf://org/single",
        &cache,
        &[],
        &small,
    );
    // 70 bytes a file counted (22 of name): over 16 MiB at about 240 000.
    let line = refused(&r);
    assert!(
        line.starts_with(
            "ztensor-mount: hf://org/single@main: the Hub lists more files than the 16 MiB \
             --index-memory allows for their list (over it at file 2396"
        ) && line.ends_with("); raise --index-memory"),
        "{line}"
    );
    let r = hf_run_args(
        &mut m,
        &hub.endpoint(),
        "hf://org/single",
        &cache,
        &[],
        &slow,
    );
    assert!(r.ok(), "{}{}", r.stderr, m.log_text());
    // SAFETY: getrusage writes the struct it is given, alive for the call.
    let peak_kib = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut u);
        u.ru_maxrss
    };
    assert!(peak_kib < 192 << 10, "a mount command took {peak_kib} KiB");
    let about = source(&m);
    assert_eq!(about["other_files"].as_array().unwrap().len(), 10_000);
    assert!(
        about["other_files_not_listed"].as_u64() >= Some(290_000),
        "{about}"
    );
    assert_tensors(&m, &repos.c1);
    m.unmount_ok();
}

/// A Hub whose X-Linked-Size differs from the size its CDN sends: the
/// mount is refused naming both sizes (it said the object had changed
/// since mount, before anything was mounted).
#[test]
fn a_cdn_that_disagrees_with_the_hubs_size_is_named_as_such() {
    let (_s, mut m, _repos, hub) = setup();
    hub.control("/__linked_size?delta=-100");
    let cache = m.scratch_path("cache");
    let r = hf_run(&mut m, &hub.endpoint(), "hf://org/single", &cache, &[]);
    let line = refused(&r);
    assert!(
        line.contains("the CDN at localhost sends the file as ")
            && line.contains(" bytes, where the Hub gives its size as ")
            && line.ends_with(" (X-Linked-Size)")
            && !line.contains("changed"),
        "{line}"
    );
    hub.control("/__linked_size?delta=0");
}

/// A CDN answer sent chunked is refused: a body whose chunk sizes lie
/// hands the next chunk's size line over as data before its framing
/// fails, and those bytes were served and kept in the cache. The read
/// fails with the reason in the log, and once the CDN answers with a
/// Content-Length the right bytes are served.
#[test]
fn a_cdn_answer_sent_chunked_is_refused_and_none_of_it_served_or_kept() {
    let (_s, mut m, repos, hub) = setup();
    let cache = m.scratch_path("cache");
    hf_mount(&mut m, &hub.endpoint(), "hf://org/single", &cache, &[]);
    hub.control("/__fault?kind=misframed&count=1000&on=cdn");
    let log = failed_read_log(&m, 700_000, libc::EIO);
    assert!(
        log.lines()
            .any(|l| l.contains("ERROR") && l.contains("without a Content-Length (chunked)")),
        "{log}"
    );
    hub.control("/__reset");
    assert_tensors(&m, &repos.c1);
    m.unmount_ok();
}

/// A CDN answer whose body is cut short is asked for again, from the
/// first block it did not fill (the HTTP stores' client resumes a body
/// itself; the Hub's requests are the mount's own). A request that keeps
/// failing is logged without the signed URL's query, which would hand the
/// file to whoever reads the log.
#[test]
fn a_cdn_body_cut_short_is_asked_for_again_and_no_signature_reaches_the_log() {
    let (_s, mut m, repos, hub) = setup();
    let cache = m.scratch_path("cache");
    hf_mount(&mut m, &hub.endpoint(), "hf://org/single", &cache, &[]);
    hub.control("/__fault?kind=drop&count=2&on=cdn");
    assert_tensors(&m, &repos.c1);
    let log = m.log_text();
    assert_eq!(log.matches("; asking again").count(), 2, "{log}");
    assert!(!log.contains("ERROR"), "{log}");
    // A CDN that stops answering: ETIMEDOUT, and a log line naming the
    // URL without its query.
    let cache2 = m.scratch_path("cache2");
    m.unmount_ok();
    hf_mount(&mut m, &hub.endpoint(), "hf://org/single", &cache2, &[]);
    hub.control("/__fault?kind=stall&secs=10&count=1000&on=cdn");
    let log = failed_read_log(&m, 700_000, libc::ETIMEDOUT);
    assert!(log.contains("ERROR"), "{log}");
    assert!(log.contains("/__cdn/"), "the URL is named: {log}");
    assert!(!log.contains("sig="), "{log}");
    hub.control("/__reset");
    m.unmount_ok();
}

/// The bytes come from the CDN: once it answers, at the place a resolve
/// pointed to, under another ETag than it first gave there (its object
/// replaced), the file's reads fail with ESTALE and one log line, never a
/// mix of the two.
#[test]
fn a_file_whose_cdn_etag_changes_while_mounted_gives_estale_never_mixed_bytes() {
    let (_s, mut m, repos, hub) = setup();
    let cache = m.scratch_path("cache");
    hf_mount(&mut m, &hub.endpoint(), "hf://org/single", &cache, &[]);
    let (name, want) = &repos.c1[0];
    assert_eq!(name, "embed");
    let f = std::fs::File::open(m.path(name)).unwrap();
    let mut first = vec![0u8; 4096];
    f.read_exact_at(&mut first, 0).unwrap();
    assert_eq!(first, want[..4096]);
    hub.control("/__cdn_etag?value=%22other%22");
    // In a block no read has fetched yet, past the read-ahead of the
    // first read (8 blocks of 64 KiB).
    let log = failed_read_log(&m, 1_200_000, libc::ESTALE);
    drop(f);
    assert_eq!(
        log.matches("the CDN now gives ETag \"other\" where it gave")
            .count(),
        1,
        "{log}"
    );
    hub.control("/__reset");
    m.unmount_ok();
}

#[test]
fn a_branch_that_moves_while_mounted_leaves_the_mount_on_its_commit() {
    let _s = support::serial();
    let py = python();
    let mut m = scratch();
    let mut m2 = scratch();
    let repos = write_repos(&m.scratch_path("files"));
    let hub = Hub::start(&py, &repos.config, 0);
    let cache = m.scratch_path("cache");
    hf_mount(&mut m, &hub.endpoint(), "hf://org/single", &cache, &[]);
    let got = read_in_halves(&m, "embed", || {
        hub.control(&format!("/__move?repo=org/single&ref=main&to={C2}"))
    })
    .unwrap();
    assert!(got == repos.c1[0].1, "bytes of the new commit mixed in");
    assert_tensors(&m, &repos.c1);
    assert_eq!(source(&m)["commit"], C1);
    // A new mount of the branch gets the commit it points at now.
    hf_mount(&mut m2, &hub.endpoint(), "hf://org/single", &cache, &[]);
    assert_eq!(source(&m2)["commit"], C2);
    assert_tensors(&m2, &repos.c2);
    m2.unmount_ok();
    m.unmount_ok();
}

#[test]
fn an_offline_remount_serves_what_the_cache_holds_without_the_hub() {
    let (_s, mut m, repos, hub) = setup();
    let ep = hub.endpoint();
    let cache = m.scratch_path("cache");
    hf_mount(&mut m, &ep, "hf://org/single", &cache, &[]);
    assert_tensors(&m, &repos.c1);
    m.unmount_ok();
    // The Hub is gone: nothing answers at its address.
    drop(hub);
    let offline = [("HF_HUB_OFFLINE", "1")];
    hf_mount(&mut m, &ep, "hf://org/single", &cache, &offline);
    assert_tensors(&m, &repos.c1);
    assert_eq!(source(&m)["commit"], C1);
    assert_eq!(m.stat_u64("remote_requests"), 0);
    m.unmount_ok();
    // By the commit the index names, as well as by the branch.
    hf_mount(
        &mut m,
        &ep,
        &format!("hf://org/single@{C1}"),
        &cache,
        &offline,
    );
    assert_tensors(&m, &repos.c1);
    m.unmount_ok();
    let r = hf_run(&mut m, &ep, "hf://org/single@dev", &cache, &offline);
    assert_eq!(
        refused(&r),
        "ztensor-mount: hf://org/single@dev: offline (HF_HUB_OFFLINE is set), and neither a \
         mount with this cache directory nor huggingface_hub's cache resolved this revision \
         before"
    );
    // A record whose commit is no commit's name is not believed.
    for e in std::fs::read_dir(cache.join("ztensor-remote/hub"))
        .unwrap()
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("rev-") {
            let text = std::fs::read_to_string(e.path()).unwrap();
            std::fs::write(e.path(), text.replace(C1, "../../../../etc")).unwrap();
        }
    }
    let r = hf_run(&mut m, &ep, "hf://org/single", &cache, &offline);
    let line = refused(&r);
    assert!(
        line.contains("the record of this revision (") && line.contains("is damaged"),
        "{line}"
    );
}

/// Downloads `files` of `repo` with `huggingface_hub` itself, into the
/// HF_HOME that [`hf_run`] gives the mounts.
fn hf_download(m: &Mount, hub: &Hub, repo: &str, files: &[&str]) {
    let script = "import sys\nfrom huggingface_hub import hf_hub_download\n\
                  for f in sys.argv[3:]:\n    \
                  hf_hub_download(sys.argv[2], f, endpoint=sys.argv[1], token=False)\n";
    let mut cmd = Command::new(python());
    cmd.arg("-c")
        .arg(script)
        .arg(hub.endpoint())
        .arg(repo)
        .args(files)
        .env("HF_HUB_DISABLE_TELEMETRY", "1")
        .env("HF_HUB_DISABLE_XET", "1")
        .env("HF_HOME", m.scratch_path("hf_home"));
    for k in [
        "HF_TOKEN",
        "HF_HUB_CACHE",
        "HUGGINGFACE_HUB_CACHE",
        "HF_HUB_OFFLINE",
    ] {
        cmd.env_remove(k);
    }
    let r = support::run_with_timeout(&mut cmd, Duration::from_secs(120));
    assert!(r.ok(), "hf_hub_download: {}", r.stderr);
}

/// The paths the stand-in was asked for since its last reset, each with
/// the host it was asked of.
fn asked(hub: &Hub) -> Vec<(String, String)> {
    hub.stats()["log"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e[0].as_str().unwrap().to_string(),
                e[2].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn files_huggingface_hub_downloaded_are_read_from_its_cache_not_fetched_again() {
    let (_s, mut m, repos, hub) = setup();
    let ep = hub.endpoint();
    // One shard of two in huggingface_hub's cache, laid out by itself.
    hf_download(&m, &hub, "org/single", &["model.safetensors"]);
    hf_download(
        &m,
        &hub,
        "org/sharded",
        &[
            "model.safetensors.index.json",
            "model-00001-of-00002.safetensors",
        ],
    );
    hub.control("/__reset");
    let cache = m.scratch_path("cache");
    hf_mount(&mut m, &ep, "hf://org/single", &cache, &[]);
    assert_tensors(&m, &repos.c1);
    assert!(
        m.log_text().contains(&format!(
            "hf://org/single@{C1}/model.safetensors: read from huggingface_hub's cache"
        )),
        "{}",
        m.log_text()
    );
    assert_eq!(
        m.index()["file"],
        format!("hf://org/single@{C1}/model.safetensors")
    );
    // The revision asked of the Hub; nothing resolved, nothing from the CDN.
    assert_eq!(
        asked(&hub),
        vec![(
            "127.0.0.1".into(),
            "/api/models/org/single/revision/main".into()
        )]
    );
    assert_eq!(m.stat_u64("remote_requests"), 0);
    m.unmount_ok();

    // The cached shard is read there; the other is fetched.
    hub.control("/__reset");
    hf_mount(&mut m, &ep, "hf://org/sharded", &cache, &[]);
    assert_tensors(&m, &repos.c3);
    // Of the Hub, the revision and the one shard not cached; of the CDN,
    // that shard's blob (named by its hash) alone.
    let (hub_asked, cdn_asked): (Vec<_>, Vec<_>) = asked(&hub)
        .into_iter()
        .partition(|(host, _)| host == "127.0.0.1");
    let resolve = format!("/org/sharded/resolve/{C3}/model-00002-of-00002.safetensors");
    assert_eq!(
        hub_asked,
        vec![
            (
                "127.0.0.1".to_string(),
                "/api/models/org/sharded/revision/main".to_string()
            ),
            ("127.0.0.1".to_string(), resolve),
        ]
    );
    assert!(!cdn_asked.is_empty());
    assert!(
        cdn_asked.iter().all(|a| *a == cdn_asked[0]),
        "{cdn_asked:?}"
    );
    m.unmount_ok();

    // Offline, with a --cache-dir no mount used: the revision from
    // huggingface_hub's ref, the file from its snapshot.
    drop(hub);
    let fresh = m.scratch_path("fresh-cache");
    hf_mount(
        &mut m,
        &ep,
        "hf://org/single",
        &fresh,
        &[("HF_HUB_OFFLINE", "1")],
    );
    assert_tensors(&m, &repos.c1);
    assert_eq!(source(&m)["commit"], C1);
    m.unmount_ok();
}

#[test]
fn a_cached_file_whose_size_is_not_the_hubs_is_fetched_instead() {
    let (_s, mut m, repos, hub) = setup();
    hf_download(&m, &hub, "org/single", &["model.safetensors"]);
    let snap = m.scratch_path("hf_home").join(format!(
        "hub/models--org--single/snapshots/{C1}/model.safetensors"
    ));
    // Cut short through its link, as an interrupted copy would leave it.
    let blob = std::fs::canonicalize(&snap).unwrap();
    let len = std::fs::metadata(&blob).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&blob)
        .unwrap()
        .set_len(len - 1000)
        .unwrap();
    hub.control("/__reset");
    let cache = m.scratch_path("cache");
    hf_mount(&mut m, &hub.endpoint(), "hf://org/single", &cache, &[]);
    assert_tensors(&m, &repos.c1);
    assert!(
        m.log_text().contains(&format!(
            "holds {} bytes, the Hub lists {len}; fetched instead",
            len - 1000
        )),
        "{}",
        m.log_text()
    );
    assert!(hub.count("cdn_requests") > 0);
    m.unmount_ok();
}

/// The byte ranges the CDN was asked for, in order.
fn cdn_ranges(hub: &Hub) -> Vec<std::ops::Range<u64>> {
    hub.stats()["log"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e[0] == "localhost" && e[1] == "GET")
        .map(|e| {
            let r = e[3].as_str().expect("a ranged GET");
            let (a, b) = r.strip_prefix("bytes=").unwrap().split_once('-').unwrap();
            a.parse().unwrap()..b.parse::<u64>().unwrap() + 1
        })
        .collect()
}

fn overlaps(a: &std::ops::Range<u64>, b: &std::ops::Range<u64>) -> bool {
    a.start < b.end && b.start < a.end
}

#[test]
fn two_mounts_of_one_repo_with_one_cache_dir_fetch_each_byte_once() {
    let _s = support::serial();
    let py = python();
    let mut m1 = scratch();
    let mut m2 = scratch();
    let repos = write_repos(&m1.scratch_path("files"));
    let size = std::fs::metadata(m1.scratch_path("files").join("c1.safetensors"))
        .unwrap()
        .len();
    let hub = Hub::start(&py, &repos.config, 0);
    let cache = m1.scratch_path("cache");
    let ep = hub.endpoint();
    hf_mount(&mut m1, &ep, "hf://org/single", &cache, &[]);
    hf_mount(&mut m2, &ep, "hf://org/single", &cache, &[]);
    // Both read everything at once.
    std::thread::scope(|s| {
        for m in [&m1, &m2] {
            let want = &repos.c1;
            s.spawn(move || assert_tensors(m, want));
        }
    });
    let ranges = cdn_ranges(&hub);
    let mut sorted = ranges.clone();
    sorted.sort_by_key(|r| r.start);
    for w in sorted.windows(2) {
        assert!(
            !overlaps(&w[0], &w[1]),
            "fetched twice: {w:?} of {ranges:?}"
        );
    }
    let fetched = hub.count("cdn_bytes");
    assert_eq!(fetched, ranges.iter().map(|r| r.end - r.start).sum::<u64>());
    assert!(fetched <= size, "{fetched} bytes fetched of {size}");
    m1.unmount_ok();
    m2.unmount_ok();
    // A remount has it all: no byte fetched.
    hf_mount(&mut m1, &ep, "hf://org/single", &cache, &[]);
    assert_tensors(&m1, &repos.c1);
    assert_eq!(hub.count("cdn_bytes"), fetched);
    assert_eq!(m1.stat_u64("remote_requests"), 0);
    m1.unmount_ok();
}

#[test]
fn a_mount_killed_during_a_fetch_then_remounted_serves_the_right_bytes_refetching_only_what_was_incomplete()
 {
    let (_s, mut m, repos, hub) = setup();
    let cache = m.scratch_path("cache");
    let ep = hub.endpoint();
    // No read-ahead: every request is one the reads made, complete when
    // they return.
    let args = ["-o", "remote_read_ahead=0"];
    let r = hf_run_args(&mut m, &ep, "hf://org/single", &cache, &[], &args);
    assert!(r.ok(), "{}", r.stderr);
    let embed = &repos.c1[0].1;
    let f = std::fs::File::open(m.path("embed")).unwrap();
    let mut first = vec![0u8; embed.len() / 2];
    f.read_exact_at(&mut first, 0).unwrap();
    assert!(first == embed[..first.len()]);
    drop(f);
    let complete = cdn_ranges(&hub);
    // The next request stalls; the daemon is killed while it waits.
    hub.control("/__fault?kind=stall&secs=30&count=1&on=cdn");
    let path = m.path("embed");
    let at = embed.len() as u64 * 3 / 4;
    let reader = std::thread::spawn(move || {
        let f = std::fs::File::open(path).unwrap();
        let mut b = vec![0u8; 4096];
        f.read_exact_at(&mut b, at)
    });
    assert!(
        support::wait_until(Duration::from_secs(20), || cdn_ranges(&hub).len()
            > complete.len()),
        "the stalled request never came"
    );
    let stalled = cdn_ranges(&hub)[complete.len()].clone();
    let pid = m.pid.expect("the daemon's pid");
    support::signal(pid, libc::SIGKILL);
    assert!(reader.join().unwrap().is_err(), "a read of a killed mount");
    m.cleanup();
    // The remount: the right bytes; no complete block fetched again.
    let r = hf_run_args(&mut m, &ep, "hf://org/single", &cache, &[], &args);
    assert!(r.ok(), "{}", r.stderr);
    assert_tensors(&m, &repos.c1);
    let again = &cdn_ranges(&hub)[complete.len() + 1..];
    for r in again {
        for c in &complete {
            assert!(
                !overlaps(r, c),
                "{r:?} fetched again, complete before: {c:?}"
            );
        }
    }
    assert!(
        again.iter().any(|r| overlaps(r, &stalled)),
        "the incomplete {stalled:?} was not fetched again: {again:?}"
    );
    m.unmount_ok();
}

/// The cache files (`*.data`) under `cache`, by name.
fn cache_files(cache: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(cache.join("ztensor-remote"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".data"))
        .collect();
    v.sort();
    v
}

#[test]
fn the_disk_cache_size_trims_files_no_mount_holds_and_never_one_in_use() {
    let _s = support::serial();
    let py = python();
    let mut m1 = scratch();
    let mut m2 = scratch();
    let repos = write_repos(&m1.scratch_path("files"));
    let hub = Hub::start(&py, &repos.config, 0);
    let cache = m1.scratch_path("cache");
    let ep = hub.endpoint();
    let small = ["--disk-cache-size", "100K"];
    // org/single read whole and kept mounted; org/sharded mounted beside
    // it with a budget it overflows: the file in use stays.
    hf_mount(&mut m1, &ep, "hf://org/single", &cache, &[]);
    assert_tensors(&m1, &repos.c1);
    let single = cache_files(&cache);
    assert_eq!(single.len(), 1);
    let r = hf_run_args(&mut m2, &ep, "hf://org/sharded", &cache, &[], &small);
    assert!(r.ok(), "{}", r.stderr);
    assert_tensors(&m2, &repos.c3);
    assert!(
        cache_files(&cache).contains(&single[0]),
        "a file in use was trimmed"
    );
    assert_tensors(&m1, &repos.c1);
    m1.unmount_ok();
    m2.unmount_ok();
    // Now no mount holds it: the next mount with that budget trims it.
    let r = hf_run_args(&mut m2, &ep, "hf://org/sharded", &cache, &[], &small);
    assert!(r.ok(), "{}", r.stderr);
    assert!(
        !cache_files(&cache).contains(&single[0]),
        "{:?}",
        cache_files(&cache)
    );
    m2.unmount_ok();
    // A second mount of objects already mounted trims as a first does.
    hf_mount(&mut m1, &ep, "hf://org/single", &cache, &[]);
    assert_tensors(&m1, &repos.c1);
    m1.unmount_ok();
    assert!(cache_files(&cache).contains(&single[0]));
    hf_mount(&mut m1, &ep, "hf://org/sharded", &cache, &[]);
    let r = hf_run_args(&mut m2, &ep, "hf://org/sharded", &cache, &[], &small);
    assert!(r.ok(), "{}", r.stderr);
    assert!(
        !cache_files(&cache).contains(&single[0]),
        "a joining mount did not trim: {:?}",
        cache_files(&cache)
    );
    assert_tensors(&m2, &repos.c3);
    m1.unmount_ok();
    m2.unmount_ok();
}
