use reqwest::StatusCode;
use reqwest::header::HeaderMap;

use super::endpoint::refusal_kind;
use super::info::{RepoInfo, choose, parse_info};
use super::spec::{Spec, api_kind, parse};
use super::*;
use crate::source::FetchKind;

#[test]
fn an_empty_revision_is_refused_however_it_is_given() {
    assert!(
        parse("hf://o/r@", None)
            .unwrap_err()
            .contains("the revision after @ is empty")
    );
    assert!(
        parse("hf://o/r", Some(""))
            .unwrap_err()
            .contains("--revision is empty")
    );
    assert_eq!(parse("hf://o/r", Some("v1")).unwrap().revision, "v1");
    assert_eq!(parse("hf://o/r", None).unwrap().revision, "main");
}

#[test]
fn a_refusal_at_read_time_is_gone_denied_or_failed() {
    let kind = |status: u16, code: Option<&str>| {
        let mut h = HeaderMap::new();
        if let Some(c) = code {
            h.insert("x-error-code", c.parse().unwrap());
        }
        refusal_kind(StatusCode::from_u16(status).unwrap(), &h)
    };
    // The commit was resolved at mount: what the Hub no longer knows
    // is gone since.
    assert_eq!(kind(401, Some("RepoNotFound")), FetchKind::Changed);
    assert_eq!(kind(404, Some("RevisionNotFound")), FetchKind::Changed);
    assert_eq!(kind(404, Some("EntryNotFound")), FetchKind::Changed);
    assert_eq!(kind(404, None), FetchKind::Changed);
    assert_eq!(kind(401, Some("GatedRepo")), FetchKind::Denied);
    assert_eq!(kind(403, Some("GatedRepo")), FetchKind::Denied);
    assert_eq!(kind(401, None), FetchKind::Denied);
    assert_eq!(kind(403, None), FetchKind::Denied);
    assert_eq!(kind(500, None), FetchKind::Failed);
}

#[test]
fn urls_parse_into_repo_revision_and_path() {
    let p = |a: &str| parse(a, None);
    assert_eq!(
        p("hf://org/repo").unwrap(),
        Spec {
            repo: "org/repo".into(),
            revision: "main".into(),
            path: None
        }
    );
    let s = p("hf://o-1/r.x@v1.0/sub/m.safetensors").unwrap();
    assert_eq!(s.repo, "o-1/r.x");
    assert_eq!(s.revision, "v1.0");
    assert_eq!(s.path.as_deref(), Some("sub/m.safetensors"));
    assert_eq!(parse("hf://o/r", Some("dev")).unwrap().revision, "dev");
    assert!(parse("hf://o/r@a", Some("b")).is_err());
    assert_eq!(parse("hf://o/r@a", Some("a")).unwrap().revision, "a");
    let pr = p("hf://o/r@refs%2Fpr%2F3/m.safetensors").unwrap();
    assert_eq!(pr.revision, "refs/pr/3");
    assert_eq!(pr.path.as_deref(), Some("m.safetensors"));
    let pr = parse("hf://o/r@refs%2Fpr%2F3", Some("refs/pr/3")).unwrap();
    assert_eq!(pr.revision, "refs/pr/3");
    let d = p("hf://datasets/o/d@v2/t.safetensors").unwrap();
    assert_eq!(
        (d.repo.as_str(), d.revision.as_str()),
        ("datasets/o/d", "v2")
    );
    assert_eq!(api_kind(&d.repo), ("datasets", "o/d"));
    assert_eq!(api_kind("o/r"), ("models", "o/r"));
    assert_eq!(p("hf://spaces/o/s").unwrap().repo, "spaces/o/s");
    for bad in [
        "hf://",
        "hf://datasets/o",
        "hf://o",
        "hf://o/",
        "hf://o/r@",
        "hf://o/r/../x",
        "hf://o/r//x",
        "hf://o/r/m\n.safetensors",
        "hf://o/r@..",
        "hf://o/r@%2e%2e",
        "hf://o/r@.",
        "hf://o/r@refs%2F..%2Fx",
        "hf://o/r@a%00b",
        "hf://o/r/\x1b[31mm.safetensors",
    ] {
        assert!(p(bad).is_err(), "{bad}");
    }
    assert!(is_hub("HF://o/r"));
    assert!(!is_hub("hf:/o/r"));
}

fn info(files: &[&str]) -> RepoInfo {
    RepoInfo {
        commit: "abc1234".into(),
        files: files.iter().map(|f| (f.to_string(), None)).collect(),
    }
}

#[test]
fn names_the_hub_lists_that_are_not_a_files_path_once_are_left_out() {
    let v = serde_json::json!({"sha": "abc1234", "siblings": [
        {"rfilename": "model.safetensors", "size": 8},
        {"rfilename": "model\n.safetensors"},
        {"rfilename": "a/../../secret/model.safetensors"},
        {"rfilename": "\u{1b}]0;title\u{7}x.gguf"},
        {"rfilename": "sub//x.gguf"},
        {"rfilename": "model.safetensors", "size": 9},
        {"rfilename": "sub/x.gguf"},
    ]});
    let body = serde_json::to_vec(&v).unwrap();
    let files = parse_info(super::answer::parse(&body, 1 << 20).unwrap())
        .unwrap()
        .files;
    assert_eq!(
        files,
        [
            ("model.safetensors".to_string(), Some(8)),
            ("sub/x.gguf".to_string(), None)
        ]
    );
}

#[test]
fn a_repo_of_many_files_lists_the_first_of_its_others_and_counts_the_rest() {
    let names: Vec<String> = (0..OTHER_FILES_LISTED + 5)
        .map(|i| format!("f{i}"))
        .collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let many = info(&names);
    let (listed, unlisted) = other_files(&many, "f3");
    assert_eq!((listed.len(), unlisted), (OTHER_FILES_LISTED, 4));
    assert!(!listed.contains(&"f3"));
    let two = info(&["a", "b"]);
    assert_eq!(other_files(&two, "a"), (vec!["b"], 0));
}

#[test]
fn the_weights_are_the_index_else_the_one_file() {
    let spec = parse("hf://o/r", None).unwrap();
    let c = |f: &[&str]| choose(&spec, &info(f));
    assert_eq!(
        c(&[
            "config.json",
            "model.safetensors.index.json",
            "a.safetensors",
            "b.safetensors"
        ])
        .unwrap(),
        "model.safetensors.index.json"
    );
    assert_eq!(
        c(&["config.json", "model.safetensors"]).unwrap(),
        "model.safetensors"
    );
    assert_eq!(c(&["README.md", "m.Q4.gguf"]).unwrap(), "m.Q4.gguf");
    assert_eq!(
        c(&["m.Q4.gguf", "m.Q8.gguf"]).unwrap_err(),
        "the repo has several weights files; name one: hf://o/r@main/m.Q4.gguf \
             hf://o/r@main/m.Q8.gguf"
    );
    assert!(c(&["README.md"]).unwrap_err().contains("no weights file"));
    // The repo's top first: a folder's set is another model's part.
    assert_eq!(
        c(&[
            "model.safetensors",
            "text_encoder_2/model.safetensors.index.json",
            "text_encoder_2/model-00001-of-00002.safetensors",
        ])
        .unwrap(),
        "model.safetensors"
    );
    assert_eq!(
        c(&["onnx/model.onnx", "model.safetensors"]).unwrap(),
        "model.safetensors"
    );
    // Only folders: their one set.
    assert_eq!(
        c(&["README.md", "unet/diffusion_pytorch_model.safetensors"]).unwrap(),
        "unet/diffusion_pytorch_model.safetensors"
    );
    // Several at the top: those, then each folder's, by name.
    assert_eq!(
        c(&[
            "flux1-dev.safetensors",
            "ae.safetensors",
            "transformer/diffusion_pytorch_model.safetensors.index.json",
            "text_encoder_2/model.safetensors.index.json",
        ])
        .unwrap_err(),
        "the repo has several weights files; name one: \
             hf://o/r@main/flux1-dev.safetensors hf://o/r@main/ae.safetensors \
             hf://o/r@main/text_encoder_2/model.safetensors.index.json \
             hf://o/r@main/transformer/diffusion_pytorch_model.safetensors.index.json"
    );
}

#[test]
fn a_sha_that_is_no_commits_name_is_named_as_such() {
    for (body, want) in [
        (
            &br#"{"sha": "../../tmp/x"}"#[..],
            r#"the Hub's answer gives as its commit ("sha") "../../tmp/x", which is not a commit's name (hex)"#,
        ),
        (
            br#"{"sha": 7}"#,
            r#"the Hub's answer names no commit ("sha")"#,
        ),
    ] {
        let answer = super::answer::parse(body, 1 << 20).unwrap();
        assert_eq!(parse_info(answer).unwrap_err(), want);
    }
}
