//! An `s3://` source's keys, region and endpoint from the AWS CLI's own
//! files, for a user whose environment names none: `~/.aws/credentials`
//! and `~/.aws/config` (or `AWS_SHARED_CREDENTIALS_FILE`,
//! `AWS_CONFIG_FILE`), profile `AWS_PROFILE` (or `AWS_DEFAULT_PROFILE`,
//! else `default`). `object_store` reads the environment only, and the AWS
//! SDK's loader would bring a second HTTP stack and an SDK to read two INI
//! files; this reads them, and of them only the settings in [`Settings`].
//! A profile that gets its keys another way (a role, SSO, a credential
//! process, a web identity) is refused in one line that says how to export
//! keys instead: reading its bucket anonymously would only fail later, with
//! less to go on.

use std::path::{Path, PathBuf};

/// What a profile says, each setting from the credentials file if it has
/// it, else from the config file.
#[derive(Debug, Default, PartialEq)]
pub struct Settings {
    /// `aws_access_key_id`, `aws_secret_access_key`, `aws_session_token`.
    pub keys: Option<Keys>,
    /// `region`.
    pub region: Option<String>,
    /// `endpoint_url`: an S3-compatible server.
    pub endpoint: Option<String>,
}

#[derive(Debug, PartialEq)]
pub struct Keys {
    pub id: String,
    pub secret: String,
    pub token: Option<String>,
}

/// The largest file read: the AWS CLI's are a few hundred bytes a
/// profile.
const MAX_FILE: u64 = 1 << 20;

/// Settings that get keys some way this reader does not follow.
const ELSEWHERE: [&str; 7] = [
    "credential_process",
    "role_arn",
    "sso_session",
    "sso_start_url",
    "web_identity_token_file",
    "credential_source",
    "login_session",
];

/// Settings by which the AWS CLI gets keys before it looks at a profile's
/// static keys at all (botocore's chain: assume-role, SSO, then static
/// keys in the credentials file, `credential_process`, static keys in the
/// config file). Static keys beside them are the role's source, not the
/// identity the CLI would use.
const BEFORE_KEYS: [&str; 3] = ["role_arn", "sso_session", "sso_start_url"];

/// Which profile: the one `AWS_PROFILE` (or `AWS_DEFAULT_PROFILE`) names,
/// with that variable's name, else `default`.
struct Named {
    profile: String,
    by: Option<&'static str>,
}

/// The profile the environment names (`env` looks a variable up), from the
/// files it names. `need_keys`: the environment names no keys of its own,
/// so the profile's are wanted. No files, or no `default` profile in them,
/// is no settings. Where keys are wanted, a profile named but in neither
/// file, a file that cannot be read or parsed, and a named profile whose
/// keys come from elsewhere are errors in one line; otherwise (the
/// environment has the keys, or the profile is only the default) such a
/// file or profile is passed over with a log line, so that what worked
/// without the files still does.
pub fn load(env: &dyn Fn(&str) -> Option<String>, need_keys: bool) -> Result<Settings, String> {
    match read(env, need_keys) {
        Err(why) if !need_keys => {
            log::warn!("{why}; not used, the environment names the keys");
            Ok(Settings::default())
        }
        r => r,
    }
}

fn read(env: &dyn Fn(&str) -> Option<String>, need_keys: bool) -> Result<Settings, String> {
    let var = |k: &str| env(k).filter(|v| !v.is_empty());
    let named = ["AWS_PROFILE", "AWS_DEFAULT_PROFILE"]
        .into_iter()
        .find_map(|k| {
            var(k).map(|profile| Named {
                profile,
                by: Some(k),
            })
        })
        .unwrap_or(Named {
            profile: "default".into(),
            by: None,
        });
    let profile = &named.profile;
    let home = var("HOME").map(PathBuf::from);
    let file = |var_name: &str, name: &str| {
        var(var_name)
            .map(PathBuf::from)
            .or_else(|| home.as_ref().map(|h| h.join(".aws").join(name)))
    };
    let credentials = file("AWS_SHARED_CREDENTIALS_FILE", "credentials");
    let config = file("AWS_CONFIG_FILE", "config");
    // The config file names a profile `[profile NAME]`, except `default`,
    // which may be either.
    let config_names = [format!("profile {profile}"), profile.clone()];
    let config_names = if profile == "default" {
        &config_names[..]
    } else {
        &config_names[..1]
    };
    let from_credentials = section(credentials.as_deref(), std::slice::from_ref(profile))?;
    let from_config = section(config.as_deref(), config_names)?;
    if from_credentials.is_none() && from_config.is_none() {
        return match named.by {
            Some(by) => Err(format!(
                "{by}={profile}: no such profile in {} or {}",
                shown(credentials.as_deref()),
                shown(config.as_deref())
            )),
            None => Ok(Settings::default()),
        };
    }
    let get = |key: &str| {
        let find = |s: &Option<(PathBuf, Vec<(String, String)>)>| {
            s.as_ref().and_then(|(path, kv)| {
                kv.iter()
                    .rfind(|(k, _)| k == key)
                    .map(|(_, v)| (path.clone(), v.clone()))
            })
        };
        find(&from_credentials).or_else(|| find(&from_config))
    };
    let found = settings(profile, &get, credentials.as_deref());
    let keys = match found.keys {
        Ok(k) => k.filter(|_| need_keys),
        Err(why) if need_keys && named.by.is_some() => return Err(why),
        Err(why) => {
            if need_keys {
                log::warn!("{why}; the bucket is read anonymously");
            }
            None
        }
    };
    Ok(Settings {
        keys,
        region: found.region,
        endpoint: found.endpoint,
    })
}

/// What one profile says: its keys (or why they cannot be had), region
/// and endpoint.
struct Found {
    keys: Result<Option<Keys>, String>,
    region: Option<String>,
    endpoint: Option<String>,
}

/// The settings of one profile, `get` giving a key's value and the file it
/// came from; `credentials`, the credentials file. Its keys are those the
/// AWS CLI would use, or why they cannot be had here (see [`BEFORE_KEYS`]).
fn settings(
    profile: &str,
    get: &dyn Fn(&str) -> Option<(PathBuf, String)>,
    credentials: Option<&Path>,
) -> Found {
    let value = |k: &str| get(k).map(|(_, v)| v).filter(|v| !v.is_empty());
    let first = |names: &[&'static str]| names.iter().find_map(|k| get(k).map(|(p, _)| (p, *k)));
    let elsewhere = |(path, setting): (PathBuf, &str)| {
        Err(format!(
            "{}: profile {profile} gets its keys through {setting}, which ztensor-mount does \
             not follow; export them first: eval \
             \"$(aws configure export-credentials --profile {profile} --format env)\"",
            path.display()
        ))
    };
    let keys = match (get("aws_access_key_id"), value("aws_secret_access_key")) {
        _ if let Some(found) = first(&BEFORE_KEYS) => elsewhere(found),
        (Some((path, _)), _)
            if Some(path.as_path()) != credentials
                && let Some(found) = first(&["credential_process"]) =>
        {
            elsewhere(found)
        }
        (Some((_, id)), Some(secret)) if !id.is_empty() => Ok(Some(Keys {
            id,
            secret,
            token: value("aws_session_token"),
        })),
        (Some((path, _)), _) => Err(format!(
            "{}: profile {profile} needs both aws_access_key_id and aws_secret_access_key",
            path.display()
        )),
        (None, _) => first(&ELSEWHERE).map_or(Ok(None), elsewhere),
    };
    Found {
        keys,
        region: value("region"),
        endpoint: value("endpoint_url"),
    }
}

fn shown(path: Option<&Path>) -> String {
    path.map_or_else(|| "(no HOME)".into(), |p| p.display().to_string())
}

/// The settings of the first of `names` found in the file at `path`, with
/// that path; `None` where there is no such file or section.
#[allow(clippy::type_complexity)]
fn section(
    path: Option<&Path>,
    names: &[String],
) -> Result<Option<(PathBuf, Vec<(String, String)>)>, String> {
    let Some(path) = path else { return Ok(None) };
    let text = match super::read_small(path, MAX_FILE) {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let sections = parse(&text).map_err(|why| format!("{}: {why}", path.display()))?;
    Ok(names.iter().find_map(|n| {
        sections
            .iter()
            .rev()
            .find(|(name, _)| name == n)
            .map(|(_, kv)| (path.to_path_buf(), kv.clone()))
    }))
}

type Sections = Vec<(String, Vec<(String, String)>)>;

/// The sections of an AWS CLI INI file, each with its settings in order,
/// read as the CLI reads it (Python's `RawConfigParser`): keys are
/// lower-cased, `=` or `:` ends a key, a section header may be followed by
/// a comment, and a line indented past the key before it continues that
/// key's value (a nested setting such as `s3 =`'s, skipped here).
/// Anything else that is neither a `[section]` nor a setting, a section or
/// a key given twice, and a control character (no HTTP header can carry
/// one) are errors naming their line, as the CLI refuses such files too.
fn parse(text: &str) -> Result<Sections, String> {
    let mut out: Sections = Vec::new();
    // How far the key of the value being read is indented.
    let mut key_indent: Option<usize> = None;
    // A byte-order mark, as an editor on Windows may write it.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        let indent = raw.len() - raw.trim_start().len();
        if key_indent.is_some_and(|k| indent > k) {
            continue;
        }
        let n = i + 1;
        if line.chars().any(|c| c.is_control() && c != '\t') {
            return Err(format!("line {n}: a control character"));
        }
        if let Some(rest) = line.strip_prefix('[') {
            let name = rest
                .rsplit_once(']')
                .map(|(name, _)| name)
                .ok_or_else(|| format!("line {n}: a section header without its ]"))?;
            // `[profile  work]` is `[profile work]`, as the CLI splits it.
            let name: Vec<&str> = name.split_whitespace().collect();
            let name = name.join(" ");
            if out.iter().any(|(s, _)| *s == name) {
                return Err(format!("line {n}: section [{name}] again"));
            }
            out.push((name, Vec::new()));
            key_indent = None;
            continue;
        }
        let (k, v) = line
            .split_once(['=', ':'])
            .ok_or_else(|| format!("line {n}: neither [section] nor key = value"))?;
        let (_, kv) = out
            .last_mut()
            .ok_or_else(|| format!("line {n}: a setting before any [section]"))?;
        let k = k.trim().to_ascii_lowercase();
        if kv.iter().any(|(have, _)| *have == k) {
            return Err(format!("line {n}: {k} again in its section"));
        }
        kv.push((k, v.trim().to_string()));
        key_indent = Some(indent);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct Home(tempfile::TempDir);

    impl Home {
        fn new(credentials: &str, config: &str) -> Home {
            let d = tempfile::tempdir().unwrap();
            std::fs::create_dir(d.path().join(".aws")).unwrap();
            for (name, text) in [("credentials", credentials), ("config", config)] {
                if !text.is_empty() {
                    std::fs::write(d.path().join(".aws").join(name), text).unwrap();
                }
            }
            Home(d)
        }

        fn load(&self, vars: &[(&str, &str)]) -> Result<Settings, String> {
            let mut env: HashMap<String, String> = vars
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            env.insert("HOME".into(), self.0.path().display().to_string());
            let need_keys = !env.contains_key("ENV_HAS_KEYS");
            load(&|k| env.get(k).cloned(), need_keys)
        }
    }

    fn keys(id: &str, secret: &str, token: Option<&str>) -> Option<Keys> {
        Some(Keys {
            id: id.into(),
            secret: secret.into(),
            token: token.map(Into::into),
        })
    }

    #[test]
    fn the_default_profile_gives_keys_from_credentials_and_region_from_config() {
        let h = Home::new(
            "# made by aws configure\n[default]\naws_access_key_id = AKIA1\n\
             aws_secret_access_key=s1\n\n[work]\naws_access_key_id = AKIA2\n\
             aws_secret_access_key = s2\naws_session_token = t2\n",
            "[default]\nregion = eu-west-2\ns3 =\n  max_concurrent_requests = 20\n\
             [profile work]\nregion = us-west-1\nendpoint_url = http://127.0.0.1:9000\n",
        );
        let d = h.load(&[]).unwrap();
        assert_eq!(d.keys, keys("AKIA1", "s1", None));
        assert_eq!(d.region.as_deref(), Some("eu-west-2"));
        assert_eq!(d.endpoint, None);
        let w = h.load(&[("AWS_PROFILE", "work")]).unwrap();
        assert_eq!(w.keys, keys("AKIA2", "s2", Some("t2")));
        assert_eq!(w.region.as_deref(), Some("us-west-1"));
        assert_eq!(w.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
        let w2 = h.load(&[("AWS_DEFAULT_PROFILE", "work")]).unwrap();
        assert_eq!(w2, w);
    }

    #[test]
    fn a_byte_order_mark_crlf_and_spaces_in_headers_are_read() {
        let h = Home::new(
            "\u{feff}[ default ]\r\naws_access_key_id\t= K\r\naws_secret_access_key = S\r\n",
            "[profile   w]\r\nregion = r\r\n",
        );
        assert_eq!(h.load(&[]).unwrap().keys, keys("K", "S", None));
        let w = h.load(&[("AWS_PROFILE", "w")]).unwrap();
        assert_eq!((w.keys, w.region.as_deref()), (None, Some("r")));
    }

    #[test]
    fn keys_in_any_case_colons_indented_settings_and_header_comments_are_read_as_the_cli_does() {
        let h = Home::new(
            "[default] ; mine\n  AWS_Access_Key_ID: K\n  aws_secret_access_key = S\n\
             \t    continued = not a key\n",
            "[default]\ns3 =\n  region = nested, not the profile's\nregion = r\n",
        );
        let d = h.load(&[]).unwrap();
        assert_eq!(d.keys, keys("K", "S", None));
        assert_eq!(d.region.as_deref(), Some("r"));
    }

    #[test]
    fn the_credentials_file_wins_and_keys_may_sit_in_the_config_file() {
        let h = Home::new(
            "[p]\nregion = from-credentials\n",
            "[profile p]\naws_access_key_id = AKIA3\naws_secret_access_key = s3\n\
             region = from-config\n",
        );
        let p = h.load(&[("AWS_PROFILE", "p")]).unwrap();
        assert_eq!(p.keys, keys("AKIA3", "s3", None));
        assert_eq!(p.region.as_deref(), Some("from-credentials"));
    }

    #[test]
    fn no_files_or_no_default_profile_is_no_settings() {
        assert_eq!(Home::new("", "").load(&[]).unwrap(), Settings::default());
        let h = Home::new("[other]\naws_access_key_id = A\n", "");
        assert_eq!(h.load(&[]).unwrap(), Settings::default());
    }

    #[test]
    fn the_variables_name_other_files() {
        let h = Home::new("", "");
        let alt = h.0.path().join("alt");
        std::fs::write(
            &alt,
            "[default]\naws_access_key_id=K\naws_secret_access_key=S\n",
        )
        .unwrap();
        let alt = alt.display().to_string();
        let s = h
            .load(&[("AWS_SHARED_CREDENTIALS_FILE", alt.as_str())])
            .unwrap();
        assert_eq!(s.keys, keys("K", "S", None));
    }

    #[test]
    fn a_named_profile_that_is_nowhere_is_refused_naming_both_files() {
        let h = Home::new("[default]\n", "[default]\n");
        let e = h.load(&[("AWS_PROFILE", "nope")]).unwrap_err();
        assert!(
            e.starts_with("AWS_PROFILE=nope: no such profile in "),
            "{e}"
        );
        assert!(
            e.contains(".aws/credentials") && e.contains(".aws/config"),
            "{e}"
        );
    }

    #[test]
    fn keys_from_elsewhere_half_keys_and_bad_lines_are_refused_in_one_line() {
        let h = Home::new(
            "[half]\naws_access_key_id = A\n",
            "[profile sso]\nsso_session = corp\nregion = x\n\
             [profile proc]\ncredential_process = /bin/get-keys\n",
        );
        let e = h.load(&[("AWS_PROFILE", "sso")]).unwrap_err();
        assert!(
            e.contains(".aws/config: profile sso gets its keys through sso_session"),
            "{e}"
        );
        assert!(
            e.contains("aws configure export-credentials --profile sso"),
            "{e}"
        );
        let e = h.load(&[("AWS_PROFILE", "proc")]).unwrap_err();
        assert!(e.contains("through credential_process"), "{e}");
        // Static keys beside a role or SSO are not what the CLI would use;
        // nor are keys in the config file beside a credential_process.
        let both = Home::new(
            "[role]\naws_access_key_id = A\naws_secret_access_key = S\n\
             [procd]\naws_access_key_id = A\naws_secret_access_key = S\n",
            "[profile role]\nrole_arn = arn:aws:iam::1:role/r\n\
             [profile ssokeys]\nsso_start_url = https://x\naws_access_key_id = A\n\
             aws_secret_access_key = S\n\
             [profile procc]\ncredential_process = /bin/k\naws_access_key_id = A\n\
             aws_secret_access_key = S\n\
             [profile procd]\ncredential_process = /bin/k\n",
        );
        for (profile, setting) in [
            ("role", "role_arn"),
            ("ssokeys", "sso_start_url"),
            ("procc", "credential_process"),
        ] {
            let e = both.load(&[("AWS_PROFILE", profile)]).unwrap_err();
            let want = format!(".aws/config: profile {profile} gets its keys through {setting}");
            assert!(e.contains(&want), "{e}");
        }
        let s = both.load(&[("AWS_PROFILE", "procd")]).unwrap();
        assert_eq!(s.keys, keys("A", "S", None));
        let e = h.load(&[("AWS_PROFILE", "half")]).unwrap_err();
        assert!(
            e.contains(".aws/credentials: profile half needs both aws_access_key_id and aws_secret_access_key"),
            "{e}"
        );
        for (text, why) in [
            ("[default\n", "line 1: a section header without its ]"),
            ("[a]\nregion = x\u{0}\n", "line 2: a control character"),
            ("[a]\n[b]\n[a]\n", "line 3: section [a] again"),
            (
                "[a]\nregion = x\nregion = y\n",
                "line 3: region again in its section",
            ),
            ("[a]\njunk\n", "line 2: neither [section] nor key = value"),
            ("k = v\n", "line 1: a setting before any [section]"),
        ] {
            let e = Home::new(text, "").load(&[]).unwrap_err();
            assert!(e.ends_with(&format!("credentials: {why}")), "{e}");
            assert_eq!(e.lines().count(), 1);
        }
    }

    #[test]
    fn a_device_a_fifo_or_a_huge_file_is_refused_without_reading_it_all() {
        let h = Home::new("", "");
        let creds = h.0.path().join(".aws/credentials");
        std::os::unix::fs::symlink("/dev/zero", &creds).unwrap();
        let e = h.load(&[]).unwrap_err();
        assert!(e.ends_with(".aws/credentials: not a regular file"), "{e}");
        std::fs::remove_file(&creds).unwrap();
        let fifo = std::ffi::CString::new(creds.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path; mkfifo touches nothing else.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let e = h.load(&[]).unwrap_err();
        assert!(e.ends_with(".aws/credentials: not a regular file"), "{e}");
        std::fs::remove_file(&creds).unwrap();
        std::fs::File::create(&creds)
            .unwrap()
            .set_len(MAX_FILE + 1)
            .unwrap();
        let e = h.load(&[]).unwrap_err();
        assert!(e.contains("larger than"), "{e}");
    }

    #[test]
    fn with_keys_in_the_environment_a_profile_it_cannot_use_is_passed_over() {
        let h = Home::new(
            "[half]\naws_access_key_id = A\n",
            "[default]\nsso_session = corp\nregion = r\n[profile sso]\nsso_session = corp\n",
        );
        let env_keys = ("ENV_HAS_KEYS", "1");
        // The default profile's region is still read; its keys are not wanted.
        let d = h.load(&[env_keys]).unwrap();
        assert_eq!((d.keys, d.region.as_deref()), (None, Some("r")));
        for p in ["sso", "half"] {
            assert_eq!(h.load(&[env_keys, ("AWS_PROFILE", p)]).unwrap().keys, None);
        }
        // Not even a file it cannot parse refuses the mount then.
        let bad = Home::new("junk\n", "");
        assert_eq!(bad.load(&[env_keys]).unwrap(), Settings::default());
        // Without keys in the environment: the default profile's SSO is
        // passed over (a public bucket, read anonymously); a named one's
        // is refused.
        assert_eq!(h.load(&[]).unwrap().keys, None);
        assert!(h.load(&[("AWS_PROFILE", "sso")]).is_err());
        let e = h.load(&[("AWS_DEFAULT_PROFILE", "nope")]).unwrap_err();
        assert!(
            e.starts_with("AWS_DEFAULT_PROFILE=nope: no such profile"),
            "{e}"
        );
    }

    #[test]
    fn an_unreadable_file_is_refused_naming_it() {
        let h = Home::new("", "");
        // A directory where the file should be: reading it fails, and not
        // with NotFound.
        std::fs::create_dir(h.0.path().join(".aws/credentials")).unwrap();
        let e = h.load(&[]).unwrap_err();
        assert!(e.contains(".aws/credentials: "), "{e}");
    }
}
