//! How a bucket or HTTP server is reached: `object_store`'s client for
//! it, configured from the URL, the options and the environment.

use std::sync::Arc;
use std::time::Duration;

use object_store::{BackoffConfig, Certificate, ClientOptions, ObjectStore, RetryConfig};

use crate::source::error::{FetchError, FetchKind};

use super::{FIRST_BACKOFF, MAX_BACKOFF, Options, key_of, one_line};
use crate::source::http::{self, Redirects};

/// How to reach one bucket (or HTTP server); the store itself is made per
/// process, as its connections belong to the runtime.
pub(super) struct Client {
    pub(super) url: url::Url,
    pub(super) opts: Options,
    pub(super) store: crate::source::shared::PerProcess<Arc<dyn ObjectStore>>,
    /// For a Hugging Face Hub file: the repo and commit its store reads.
    pub(super) hub: Option<Arc<crate::source::hub::Repo>>,
    /// Where the server redirects the object, asked once after a failure
    /// ([`Client::redirect_of`]).
    pub(super) redirect: tokio::sync::OnceCell<Option<String>>,
    /// The server the store's builder was given, where it is not the
    /// store's own (`--endpoint`, `AWS_ENDPOINT_URL`, an emulator's):
    /// objects of one name and ETag on two servers are two objects.
    pub(super) endpoint: std::sync::OnceLock<Option<String>>,
}

/// The settings a store's builder takes from the environment's variables
/// whose names start with `prefix` (but those in `skip`), as
/// `object_store`'s `from_env` reads them, but an empty one left out (it
/// counts as unset) and one holding a control character refused (no HTTP
/// header can carry it; the signer would panic on it).
pub(super) fn env_config<K: std::str::FromStr>(
    prefix: &str,
    skip: &[&str],
) -> std::result::Result<Vec<(K, String)>, String> {
    let mut out = Vec::new();
    for (k, v) in std::env::vars_os() {
        let (Some(k), Some(v)) = (k.to_str(), v.to_str()) else {
            continue;
        };
        if !k.starts_with(prefix) || v.is_empty() || skip.contains(&k) {
            continue;
        }
        if v.chars().any(|c| c.is_control() && c != '\t') {
            return Err(format!("{k} holds a control character"));
        }
        if let Ok(key) = k.to_ascii_lowercase().parse::<K>() {
            out.push((key, v.to_string()));
        }
    }
    Ok(out)
}

/// Whether any of the environment variables `names` is set to something.
pub(super) fn any_set(names: &[&str]) -> bool {
    names
        .iter()
        .any(|k| std::env::var_os(k).is_some_and(|v| !v.is_empty()))
}

impl Client {
    /// Where the server of a plain HTTP(S) object redirects a GET of it,
    /// when it does: object_store's client follows redirects, and its
    /// errors name only the URL asked, so a failure at the target would
    /// read as the first server's. Asked once (redirects not followed),
    /// after a failure; the Hub's and signed URLs' own client names the
    /// URL it failed at itself.
    pub(super) async fn redirect_of(&self) -> Option<String> {
        let plain = matches!(self.url.scheme(), "http" | "https")
            && self.hub.is_none()
            && !crate::source::signed_url::is_signed(&self.url);
        if !plain {
            return None;
        }
        self.redirect
            .get_or_init(|| crate::source::http::redirect_target(&self.opts, &self.url))
            .await
            .clone()
    }

    /// `why`, a failure of a request for the object, naming where the
    /// server redirects it when it does.
    pub(super) async fn naming_redirect(&self, why: FetchError) -> FetchError {
        if why.kind == FetchKind::Changed {
            return why;
        }
        match self.redirect_of().await {
            Some(to) => FetchError::new(
                why.kind,
                format!("{} (the server redirects it to {to})", why.message()),
            ),
            None => why,
        }
    }

    pub(super) fn store(&self) -> std::result::Result<Arc<dyn ObjectStore>, String> {
        self.store.get(|| match &self.hub {
            Some(repo) => repo.store(),
            None => self.build(),
        })
    }

    pub(super) fn build(&self) -> std::result::Result<Arc<dyn ObjectStore>, String> {
        let (client, retry) = (client_options(&self.opts)?, retry_config(&self.opts));
        let scheme = self.url.scheme().to_ascii_lowercase();
        Ok(match scheme.as_str() {
            "s3" | "s3a" => self.s3(client, retry)?,
            "gs" => self.gcs(client, retry)?,
            "http" | "https" if crate::source::signed_url::is_signed(&self.url) => Arc::new(
                crate::source::http::ReadOnly(crate::source::signed_url::SignedUrl::new(
                    self.url.clone(),
                    key_of(&self.url)?,
                    &self.opts,
                )?),
            ),
            "http" | "https" => {
                let base = &self.url[..url::Position::BeforePath];
                Arc::new(
                    object_store::http::HttpBuilder::new()
                        .with_url(base)
                        .with_client_options(client)
                        .with_http_connector(Connector(self.opts.clone(), Redirects::Any))
                        .with_retry(retry)
                        .build()
                        .map_err(one_line)?,
                )
            }
            _ => self.azure(client, retry)?,
        })
    }

    fn s3(&self, client: ClientOptions, retry: RetryConfig) -> StoreResult {
        use object_store::aws::AmazonS3ConfigKey::{Endpoint, S3Endpoint};
        let b = s3_builder(self.opts.endpoint.as_deref())?
            .with_url(self.url.as_str())
            .with_client_options(client)
            .with_http_connector(Connector(self.opts.clone(), Redirects::SameHost))
            .with_retry(retry);
        // The client asks AWS_ENDPOINT_URL_S3's server before the
        // generic one.
        let server = b.get_config_value(&S3Endpoint);
        self.served_by(server.or_else(|| b.get_config_value(&Endpoint)));
        Ok(Arc::new(b.build().map_err(one_line)?))
    }

    fn gcs(&self, client: ClientOptions, retry: RetryConfig) -> StoreResult {
        use object_store::gcp::GoogleConfigKey::BaseUrl;
        let mut b = env_config("GOOGLE_", &[])?
            .into_iter()
            .fold(
                object_store::gcp::GoogleCloudStorageBuilder::new(),
                |b, (k, v)| b.with_config(k, v),
            )
            .with_url(self.url.as_str())
            .with_client_options(client)
            .with_http_connector(Connector(self.opts.clone(), Redirects::SameHost))
            .with_retry(retry);
        // A GCS-compatible server (an emulator): its base URL.
        if let Some(e) = &self.opts.endpoint {
            b = b.with_base_url(e.trim_end_matches('/'));
        }
        if !any_set(&[
            "GOOGLE_SERVICE_ACCOUNT",
            "GOOGLE_SERVICE_ACCOUNT_PATH",
            "GOOGLE_SERVICE_ACCOUNT_KEY",
            "GOOGLE_APPLICATION_CREDENTIALS",
        ]) {
            b = b.with_skip_signature(true);
        }
        self.served_by(b.get_config_value(&BaseUrl));
        Ok(Arc::new(b.build().map_err(one_line)?))
    }

    fn azure(&self, client: ClientOptions, retry: RetryConfig) -> StoreResult {
        use object_store::azure::AzureConfigKey::{Endpoint, UseEmulator};
        let mut b = env_config("AZURE_", &[])?
            .into_iter()
            .fold(
                object_store::azure::MicrosoftAzureBuilder::new(),
                |b, (k, v)| b.with_config(k, v),
            )
            .with_url(self.url.as_str())
            .with_client_options(client)
            .with_http_connector(Connector(self.opts.clone(), Redirects::SameHost))
            .with_retry(retry);
        if let Some(e) = &self.opts.endpoint {
            b = b.with_endpoint(e.clone()).with_allow_http(true);
        }
        if !any_set(&[
            "AZURE_STORAGE_ACCOUNT_KEY",
            "AZURE_STORAGE_ACCESS_KEY",
            "AZURE_STORAGE_MASTER_KEY",
            "AZURE_STORAGE_SAS_KEY",
            "AZURE_STORAGE_SAS_TOKEN",
            "AZURE_STORAGE_TOKEN",
            "AZURE_STORAGE_CLIENT_SECRET",
            "AZURE_CLIENT_SECRET",
            "AZURE_STORAGE_USE_EMULATOR",
        ]) {
            b = b.with_skip_signature(true);
        }
        let emulator = b.get_config_value(&UseEmulator).filter(|v| {
            ["1", "true", "yes", "on"].contains(&v.trim().to_ascii_lowercase().as_str())
        });
        self.served_by(
            b.get_config_value(&Endpoint)
                .or(emulator.map(|_| "emulator".into())),
        );
        Ok(Arc::new(b.build().map_err(one_line)?))
    }

    /// Notes the server the store's builder was given (see
    /// [`Client::endpoint`]).
    pub(super) fn served_by(&self, server: Option<String>) {
        let _ = self.endpoint.set(server.filter(|s| !s.is_empty()));
    }

    /// The server that holds the object where it is not the one its name
    /// says (a Hub mirror, `--endpoint`), for the cache to tell objects of
    /// one name and ETag on two servers apart.
    pub(super) fn endpoint(&self) -> Option<String> {
        match &self.hub {
            Some(repo) => repo.mirror(),
            None => self.endpoint.get().cloned().flatten(),
        }
    }
}

/// The variables that give an S3 client its keys.
pub(super) const AWS_KEYS: [&str; 4] = [
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_TOKEN",
];

/// An S3 client's settings: the environment's `AWS_*` variables (as
/// `object_store`'s `from_env` reads them, but empty ones left out), else
/// the AWS CLI's files' (`aws_profile`), `--endpoint` before either. Keys
/// come whole from one place: the environment's when it names them, else
/// the profile's (no token of the one with keys of the other). With keys
/// from neither, the bucket is read anonymously (never from the
/// instance-metadata service, so that a mount off the cloud does not wait
/// on one). A control character in a value is refused here, as no HTTP
/// header can carry it.
pub(super) fn s3_builder(
    endpoint: Option<&str>,
) -> std::result::Result<object_store::aws::AmazonS3Builder, String> {
    use object_store::aws::AmazonS3Builder;
    let env_keys = any_set(&[
        "AWS_ACCESS_KEY_ID",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    ]);
    let files = crate::source::aws_profile::load(&|k| std::env::var(k).ok(), !env_keys)?;
    let skip: &[&str] = if env_keys { &[] } else { &AWS_KEYS };
    let mut b = env_config("AWS_", skip)?
        .into_iter()
        .fold(AmazonS3Builder::new(), |b, (k, v)| b.with_config(k, v));
    match files.keys {
        _ if env_keys => {}
        Some(k) => {
            b = b.with_access_key_id(k.id).with_secret_access_key(k.secret);
            if let Some(t) = k.token {
                b = b.with_token(t);
            }
        }
        None => b = b.with_skip_signature(true),
    }
    if let Some(r) = files.region
        && !any_set(&["AWS_REGION", "AWS_DEFAULT_REGION"])
    {
        b = b.with_region(r);
    }
    let env_endpoint = any_set(&["AWS_ENDPOINT", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"]);
    let endpoint = endpoint
        .map(str::to_string)
        .or(files.endpoint.filter(|_| !env_endpoint));
    if let Some(e) = endpoint {
        // Also as the S3-only endpoint, which the client takes before the
        // generic one: `--endpoint` comes before AWS_ENDPOINT_URL_S3 too.
        let s3_only = object_store::aws::AmazonS3ConfigKey::S3Endpoint;
        b = b
            .with_config(s3_only, e.clone())
            .with_endpoint(e)
            .with_allow_http(true);
    }
    Ok(b)
}

/// object_store's HTTP client, made as the mount's own clients are (no
/// Referer), following the redirects given: within the host only for the
/// stores that sign their requests (s3, gs, az; see
/// [`Redirects::SameHost`]).
#[derive(Debug)]
struct Connector(Options, Redirects);

impl object_store::client::HttpConnector for Connector {
    fn connect(&self, o: &ClientOptions) -> object_store::Result<object_store::client::HttpClient> {
        let mut b = http::builder(&self.0, self.1).map_err(generic)?;
        // The options of an instance's metadata endpoint (credentials)
        // ask for a connect timeout of their own.
        if let Some(t) = o
            .get_config_value(&object_store::ClientConfigKey::ConnectTimeout)
            .and_then(|t| humantime::parse_duration(&t).ok())
        {
            b = b.connect_timeout(t);
        }
        let client = b.build().map_err(|e| generic(one_line(e)))?;
        Ok(object_store::client::HttpClient::new(client))
    }
}

fn generic(why: String) -> object_store::Error {
    object_store::Error::Generic {
        store: "HTTP client",
        source: why.into(),
    }
}

/// What a store's builder returns here.
type StoreResult = std::result::Result<Arc<dyn ObjectStore>, String>;

/// The HTTP client's options: the timeouts, and the certificates of
/// `--ca-file` trusted besides the system's store (which, like curl's and
/// Python's, is SSL_CERT_FILE / SSL_CERT_DIR when either is set).
fn client_options(o: &Options) -> std::result::Result<ClientOptions, String> {
    let mut client = ClientOptions::new()
        .with_timeout(o.timeout)
        .with_connect_timeout(o.timeout.min(Duration::from_secs(10)))
        .with_allow_http(true);
    if let Some(path) = &o.ca_file {
        let pem = std::fs::read(path).map_err(|e| format!("--ca-file {}: {e}", path.display()))?;
        let certs = Certificate::from_pem_bundle(&pem).map_err(|e| {
            format!(
                "--ca-file {}: not PEM certificates: {}",
                path.display(),
                one_line(e)
            )
        })?;
        if certs.is_empty() {
            return Err(format!(
                "--ca-file {}: holds no PEM certificate",
                path.display()
            ));
        }
        for c in certs {
            client = client.with_root_certificate(c);
        }
    }
    Ok(client)
}

/// Retries of a failed request, with backoff, within five minutes.
fn retry_config(o: &Options) -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: FIRST_BACKOFF,
            max_backoff: MAX_BACKOFF,
            base: 2.0,
        },
        max_retries: o.retries,
        retry_timeout: (o.timeout * (o.retries as u32 + 1)).min(Duration::from_secs(300)),
    }
}
