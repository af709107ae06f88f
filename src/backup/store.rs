//! The bucket a backup goes to: an S3-compatible store through `object_store` (request signing,
//! retries and multipart uploads are that crate's), every key under the destination's prefix.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::{ClientOptions, ObjectStore, PutPayload, RetryConfig, WriteMultipart};

use crate::api::S3Destination;

/// Default key of the access key id in the credentials Secret.
pub const ACCESS_KEY_ID: &str = S3Destination::ACCESS_KEY_ID;
/// Default key of the secret access key in the credentials Secret.
pub const SECRET_ACCESS_KEY: &str = S3Destination::SECRET_ACCESS_KEY;

/// What went wrong with the bucket, said so that a user knows what to fix.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "the bucket {bucket} does not exist at {endpoint}: create it, or fix the destination's bucket"
    )]
    NoBucket { endpoint: String, bucket: String },
    #[error("{endpoint} refused the credentials of {who} ({detail}): {fix}")]
    Credentials {
        endpoint: String,
        /// `Secret <name>`, or the role and its ServiceAccount.
        who: String,
        detail: String,
        fix: &'static str,
    },
    #[error("cannot reach {endpoint} ({detail}): check the destination's endpoint and the network")]
    Unreachable { endpoint: String, detail: String },
    #[error("{endpoint}, bucket {bucket}: {detail}")]
    Other {
        endpoint: String,
        bucket: String,
        detail: String,
    },
    #[error("invalid destination: {0}")]
    Invalid(String),
    /// No temporary credentials (decision 43).
    #[error("{0}")]
    Sts(crate::backup::sts::StsError),
}

/// How patient calls are: a pass checks a bucket within seconds; the backup agent waits longer.
#[derive(Clone, Copy, Debug)]
pub enum Patience {
    /// One retry, 5 s per request.
    Quick,
    /// Several retries, a minute per request (large parts).
    Patient,
}

/// How requests to a bucket are signed.
#[derive(Clone, Debug)]
pub enum Credentials {
    /// A Secret's static keys.
    Keys {
        access_key_id: String,
        secret_access_key: String,
    },
    /// A role's temporary credentials, renewed as they near their end (decision 43).
    WebIdentity(Arc<crate::backup::sts::WebIdentityCredentials>),
}

/// One destination, with its credentials.
#[derive(Clone)]
pub struct Bucket {
    store: Arc<dyn ObjectStore>,
    endpoint: String,
    bucket: String,
    /// Whose credentials these are, as the user named them.
    who: String,
    web_identity: bool,
    prefix: String,
    /// The credentials, hidden in every error (an S3 server's answer may quote them).
    redactor: crate::util::redact::Redactor,
}

impl Bucket {
    /// Opens the destination; `prefix` is used when the destination sets none.
    pub fn open(
        d: &S3Destination,
        access_key_id: &str,
        secret_access_key: &str,
        default_prefix: &str,
        patience: Patience,
    ) -> Result<Bucket, Error> {
        let credentials = Credentials::Keys {
            access_key_id: access_key_id.to_string(),
            secret_access_key: secret_access_key.to_string(),
        };
        Bucket::open_with(d, &credentials, default_prefix, patience)
    }

    /// [`Bucket::open`] with either kind of credentials.
    pub fn open_with(
        d: &S3Destination,
        credentials: &Credentials,
        default_prefix: &str,
        patience: Patience,
    ) -> Result<Bucket, Error> {
        let (timeout, retries, retry_timeout) = match patience {
            Patience::Quick => (Duration::from_secs(5), 1, Duration::from_secs(8)),
            Patience::Patient => (Duration::from_secs(60), 5, Duration::from_secs(120)),
        };
        let mut redactor = crate::util::redact::Redactor::new();
        let who = match (credentials, &d.web_identity) {
            (Credentials::WebIdentity(_), Some(w)) => format!(
                "role {} (ServiceAccount {})",
                w.role_arn, w.service_account_name
            ),
            _ => format!("Secret {}", d.secret_name),
        };
        let mut builder = AmazonS3Builder::new()
            .with_endpoint(d.endpoint.trim_end_matches('/'))
            .with_bucket_name(&d.bucket)
            .with_region(d.region());
        match credentials {
            Credentials::Keys {
                access_key_id,
                secret_access_key,
            } => {
                redactor.add(access_key_id);
                redactor.add(secret_access_key);
                builder = builder
                    .with_access_key_id(access_key_id)
                    .with_secret_access_key(secret_access_key);
            }
            Credentials::WebIdentity(provider) => {
                builder = builder.with_credentials(provider.clone());
            }
        }
        let store = builder
            .with_virtual_hosted_style_request(false)
            .with_client_options(
                // options replace the builder's own: plain HTTP is allowed here
                ClientOptions::new()
                    .with_allow_http(d.endpoint.starts_with("http://"))
                    .with_timeout(timeout)
                    .with_connect_timeout(Duration::from_secs(5)),
            )
            .with_retry(RetryConfig {
                max_retries: retries,
                retry_timeout,
                ..RetryConfig::default()
            })
            .build()
            .map_err(|e| Error::Invalid(redactor.scrub(&e.to_string())))?;
        let prefix = d
            .prefix
            .clone()
            .unwrap_or_else(|| default_prefix.to_string())
            .trim_matches('/')
            .to_string();
        Ok(Bucket {
            store: Arc::new(store),
            endpoint: d.endpoint.clone(),
            bucket: d.bucket.clone(),
            who,
            web_identity: matches!(credentials, Credentials::WebIdentity(_)),
            prefix,
            redactor,
        })
    }

    fn path(&self, key: &str) -> Path {
        if self.prefix.is_empty() {
            Path::from(key)
        } else {
            Path::from(format!("{}/{key}", self.prefix))
        }
    }

    /// The bucket's prefix as keys start with it: `<prefix>/`, or empty.
    pub fn key_prefix(&self) -> String {
        if self.prefix.is_empty() {
            String::new()
        } else {
            format!("{}/", self.prefix)
        }
    }

    /// `<endpoint>/<bucket>/<prefix>/<key>`: the URL a server's `S3(…)` function takes.
    pub fn http_url(&self, key: &str) -> String {
        format!(
            "{}/{}/{}",
            self.endpoint.trim_end_matches('/'),
            self.bucket,
            self.path(key)
        )
    }

    /// `s3://bucket/prefix/key`.
    pub fn url(&self, key: &str) -> String {
        format!("s3://{}/{}", self.bucket, self.path(key))
    }

    fn error(&self, e: object_store::Error) -> Error {
        let detail = crate::backup::sts::scrub(&self.redactor.scrub(&e.to_string()));
        let has = |s: &str| detail.contains(s);
        // the exchange with STS failed: its own error says what to fix
        if let object_store::Error::Generic { source, .. } = &e
            && let Some(sts) = source.downcast_ref::<crate::backup::sts::StsError>()
        {
            return Error::Sts(sts.clone());
        }
        match &e {
            _ if has("NoSuchBucket") => Error::NoBucket {
                endpoint: self.endpoint.clone(),
                bucket: self.bucket.clone(),
            },
            object_store::Error::Unauthenticated { .. }
            | object_store::Error::PermissionDenied { .. } => self.credentials(detail),
            _ if has("InvalidAccessKeyId")
                || has("SignatureDoesNotMatch")
                || has("AccessDenied")
                || has("403 Forbidden") =>
            {
                self.credentials(detail)
            }
            _ if has("error sending request")
                || has("Connection refused")
                || has("connect")
                || has("timed out")
                || has("dns error") =>
            {
                Error::Unreachable {
                    endpoint: self.endpoint.clone(),
                    detail: first_line(&detail),
                }
            }
            _ => Error::Other {
                endpoint: self.endpoint.clone(),
                bucket: self.bucket.clone(),
                detail: first_line(&detail),
            },
        }
    }

    fn credentials(&self, detail: String) -> Error {
        Error::Credentials {
            endpoint: self.endpoint.clone(),
            who: self.who.clone(),
            detail: first_line(&detail),
            fix: if self.web_identity {
                "check that the role's policy allows the bucket"
            } else {
                "fix the access key and secret key there"
            },
        }
    }

    /// Lists one key under the prefix: the bucket exists and the credentials work.
    pub async fn check(&self) -> Result<(), Error> {
        let mut list = self.store.list(Some(&self.path("")));
        list.try_next().await.map_err(|e| self.error(e))?;
        Ok(())
    }

    pub async fn put(&self, key: &str, data: Vec<u8>) -> Result<(), Error> {
        self.store
            .put(&self.path(key), PutPayload::from(data))
            .await
            .map_err(|e| self.error(e))?;
        Ok(())
    }

    /// Uploads a file, in 8 MiB pieces for large ones; returns its size.
    pub async fn put_file(&self, key: &str, file: &std::path::Path) -> Result<u64, Error> {
        let io = |e: std::io::Error| Error::Other {
            endpoint: self.endpoint.clone(),
            bucket: self.bucket.clone(),
            detail: format!("reading {}: {e}", file.display()),
        };
        let size = tokio::fs::metadata(file).await.map_err(io)?.len();
        if size <= 8 << 20 {
            let data = tokio::fs::read(file).await.map_err(io)?;
            self.put(key, data).await?;
            return Ok(size);
        }
        let upload = self
            .store
            .put_multipart(&self.path(key))
            .await
            .map_err(|e| self.error(e))?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, 8 << 20);
        let mut f = tokio::fs::File::open(file).await.map_err(io)?;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            use tokio::io::AsyncReadExt;
            let n = f.read(&mut buf).await.map_err(io)?;
            if n == 0 {
                break;
            }
            writer
                .wait_for_capacity(4)
                .await
                .map_err(|e| self.error(e))?;
            writer.write(&buf[..n]);
        }
        writer.finish().await.map_err(|e| self.error(e))?;
        Ok(size)
    }

    /// The object at `key`, or `None` when there is none; an object over `max` bytes is
    /// refused before it is read (a bucket is not trusted to hold what it should).
    pub async fn get(&self, key: &str, max: u64) -> Result<Option<Bytes>, Error> {
        let r = match self.store.get(&self.path(key)).await {
            Ok(r) => r,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(self.error(e)),
        };
        if r.meta.size > max {
            return Err(self.too_large(key, r.meta.size, max));
        }
        let mut out = Vec::with_capacity(r.meta.size as usize);
        let mut stream = r.into_stream();
        while let Some(chunk) = stream.try_next().await.map_err(|e| self.error(e))? {
            if (out.len() + chunk.len()) as u64 > max {
                return Err(self.too_large(key, (out.len() + chunk.len()) as u64, max));
            }
            out.extend_from_slice(&chunk);
        }
        Ok(Some(Bytes::from(out)))
    }

    fn too_large(&self, key: &str, size: u64, max: u64) -> Error {
        Error::Other {
            endpoint: self.endpoint.clone(),
            bucket: self.bucket.clone(),
            detail: format!(
                "{} holds {size} bytes or more, more than the {max} expected",
                self.url(key)
            ),
        }
    }

    /// Downloads `key` into `file`, which must come to exactly `size` bytes: a larger object is
    /// refused as soon as it passes `size`, and nothing beyond it is written.
    pub async fn get_file(
        &self,
        key: &str,
        file: &std::path::Path,
        size: u64,
    ) -> Result<u64, Error> {
        use tokio::io::AsyncWriteExt;
        let io = |e: std::io::Error| Error::Other {
            endpoint: self.endpoint.clone(),
            bucket: self.bucket.clone(),
            detail: format!("writing {}: {e}", file.display()),
        };
        let r = match self.store.get(&self.path(key)).await {
            Ok(r) => r,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(Error::Other {
                    endpoint: self.endpoint.clone(),
                    bucket: self.bucket.clone(),
                    detail: format!("{} is missing", self.url(key)),
                });
            }
            Err(e) => return Err(self.error(e)),
        };
        if r.meta.size != size {
            return Err(self.wrong_size(key, r.meta.size, size));
        }
        let mut out = tokio::fs::File::create(file).await.map_err(io)?;
        let mut written = 0u64;
        let mut stream = r.into_stream();
        while let Some(chunk) = stream.try_next().await.map_err(|e| self.error(e))? {
            written += chunk.len() as u64;
            if written > size {
                return Err(self.wrong_size(key, written, size));
            }
            out.write_all(&chunk).await.map_err(io)?;
        }
        out.flush().await.map_err(io)?;
        if written != size {
            return Err(self.wrong_size(key, written, size));
        }
        Ok(written)
    }

    fn wrong_size(&self, key: &str, found: u64, expected: u64) -> Error {
        Error::Other {
            endpoint: self.endpoint.clone(),
            bucket: self.bucket.clone(),
            detail: format!(
                "{} holds {found} bytes, its manifest says {expected}",
                self.url(key)
            ),
        }
    }

    /// Keys (relative to the prefix) under `dir` with their sizes.
    pub async fn list_sizes(&self, dir: &str) -> Result<BTreeMap<String, u64>, Error> {
        let base = format!("{}/", self.path(""));
        let objects: Vec<_> = self
            .store
            .list(Some(&self.path(dir)))
            .try_collect()
            .await
            .map_err(|e| self.error(e))?;
        Ok(objects
            .into_iter()
            .map(|o| {
                let full = o.location.to_string();
                let key = full.strip_prefix(&base).unwrap_or(&full).to_string();
                (key, o.size)
            })
            .collect())
    }

    /// Keys (relative to the prefix) under `dir`.
    pub async fn list(&self, dir: &str) -> Result<Vec<String>, Error> {
        let base = self.path("");
        let objects: Vec<_> = self
            .store
            .list(Some(&self.path(dir)))
            .try_collect()
            .await
            .map_err(|e| self.error(e))?;
        Ok(objects
            .into_iter()
            .map(|o| {
                let full = o.location.to_string();
                let base = base.to_string();
                full.strip_prefix(&format!("{base}/"))
                    .unwrap_or(&full)
                    .to_string()
            })
            .collect())
    }

    /// Keys (relative to the prefix) under `dir`, page by page as the bucket lists them: none
    /// is kept here, however many the bucket lists.
    pub fn list_stream<'a>(
        &'a self,
        dir: &str,
    ) -> impl futures::Stream<Item = Result<String, Error>> + Unpin + 'a {
        let base = format!("{}/", self.path(""));
        self.store.list(Some(&self.path(dir))).map(move |o| {
            o.map(|o| {
                let full = o.location.to_string();
                full.strip_prefix(&base).unwrap_or(&full).to_string()
            })
            .map_err(|e| self.error(e))
        })
    }

    /// The object at `key` as it arrives, chunk by chunk, or `None` when there is none: an
    /// object that says it holds more than `max` bytes is refused before it is read, and one
    /// that goes on past `max` fails there.
    pub async fn get_stream<'a>(
        &'a self,
        key: &'a str,
        max: u64,
    ) -> Result<Option<impl futures::Stream<Item = Result<Bytes, Error>> + Unpin + 'a>, Error> {
        let r = match self.store.get(&self.path(key)).await {
            Ok(r) => r,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(self.error(e)),
        };
        if r.meta.size > max {
            return Err(self.too_large(key, r.meta.size, max));
        }
        let mut read = 0u64;
        Ok(Some(r.into_stream().map(move |chunk| {
            let chunk = chunk.map_err(|e| self.error(e))?;
            read += chunk.len() as u64;
            if read > max {
                return Err(self.too_large(key, read, max));
            }
            Ok(chunk)
        })))
    }

    /// An error about this bucket in words of its own.
    pub fn other(&self, detail: String) -> Error {
        Error::Other {
            endpoint: self.endpoint.clone(),
            bucket: self.bucket.clone(),
            detail,
        }
    }

    pub async fn delete(&self, key: &str) -> Result<(), Error> {
        match self.store.delete(&self.path(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.error(e)),
        }
    }
}

fn first_line(s: &str) -> String {
    let line = s.lines().next().unwrap_or_default();
    line.chars().take(300).collect()
}
