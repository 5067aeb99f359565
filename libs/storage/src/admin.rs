//! What the platform's admin identity does on the S3 service: tenants'
//! buckets and identities. Each call is idempotent (made again after a
//! failure, it finishes the job), except that every
//! [`Admin::ensure_tenant_identity`] makes a fresh key.
//!
//! Identities go through the AWS IAM API on the S3 endpoint, as SeaweedFS
//! serves it (with `-s3.iam.readOnly=false`); requests are signed by
//! [`crate::sigv4`], since `object_store` has no API for buckets or IAM.

use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use md5::{Digest as _, Md5};
use reqwest::Method;
use serde::Deserialize;

use crate::config::{Credentials, StoreConfig, DEFAULT_REGION};
use crate::error::{Error, Result};
use crate::sigv4;

/// One admin request, a page of a listing or a batch delete included.
pub const ADMIN_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
pub const ADMIN_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// An answer's body: a listing page of 1,000 keys is about 300 KiB.
pub const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;
/// The name of the one policy a tenant's identity has.
pub const TENANT_POLICY_NAME: &str = "lh-tenant-bucket";
const IAM_VERSION: &str = "2010-05-08";
/// Keys a listing page asks for, and the most a batch delete may name
/// (S3's own limits for both).
const LIST_PAGE_KEYS: usize = 1000;
/// Pages of one listing: a billion objects.
const MAX_LIST_PAGES: usize = 1_000_000;
/// Times a bucket is emptied and its deletion tried, for objects written
/// while it was being emptied.
const EMPTY_ROUNDS: usize = 5;
/// Rounds of list-then-delete for a user's keys or a bucket's unfinished
/// multipart uploads.
const MAX_CLEANUP_ROUNDS: usize = 1000;
/// Characters of a service's error message kept in an error.
const MAX_MESSAGE_CHARS: usize = 500;

/// Refuses a name that is not a valid S3 bucket name, and so anything
/// that could change a request's path.
pub(crate) fn check_bucket_name(bucket: &str) -> Result<()> {
    let bytes = bucket.as_bytes();
    let ok = (3..=63).contains(&bytes.len())
        && bytes
            .iter()
            .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.'))
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && !bucket.contains("..");
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!("{bucket:?} is not a bucket name")))
    }
}

/// IAM's user names: 1 to 64 of `A-Z a-z 0-9 + = , . @ _ -`.
fn check_user_name(user: &str) -> Result<()> {
    let ok = (1..=64).contains(&user.len())
        && user
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"+=,.@_-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!("{user:?} is not an IAM user name")))
    }
}

/// A tenant's policy on `bucket`: read, write, list and tag objects in its
/// bucket, and clean up its multipart uploads; nothing on any other
/// bucket, no bucket settings. Without `writes`, all of it but writing
/// (reading, listing and deleting, which frees room).
/// `s3:ListMultipartUploadParts` and `s3:ListBucketMultipartUploads` are
/// left out: SeaweedFS refuses a policy naming them, and lists uploads to
/// whoever may list the bucket.
fn policy_of(bucket: &str, writes: bool) -> String {
    let mut actions = vec![
        "s3:GetObject",
        "s3:DeleteObject",
        "s3:ListBucket",
        "s3:AbortMultipartUpload",
        "s3:GetObjectTagging",
        "s3:DeleteObjectTagging",
    ];
    if writes {
        actions.extend(["s3:PutObject", "s3:PutObjectTagging"]);
    }
    serde_json::json!({
        "Version": "2012-10-17",
        "Statement": [{
            "Effect": "Allow",
            "Action": actions,
            "Resource": [
                format!("arn:aws:s3:::{bucket}"),
                format!("arn:aws:s3:::{bucket}/*"),
            ],
        }],
    })
    .to_string()
}

/// A service's answer.
struct Answer {
    status: u16,
    body: Bytes,
}

impl Answer {
    fn ok(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The error code (`NoSuchBucket`, `EntityAlreadyExists`), or `""`.
    fn code(&self) -> String {
        parse_error(&self.body).0
    }

    fn refused(&self, op: &str) -> Error {
        let (code, message) = parse_error(&self.body);
        Error::Service {
            op: op.to_owned(),
            status: self.status,
            code: if code.is_empty() {
                "(no error code)".to_owned()
            } else {
                code
            },
            message,
        }
    }

    fn parse<T: for<'de> Deserialize<'de>>(&self, op: &str) -> Result<T> {
        let text = std::str::from_utf8(&self.body)
            .map_err(|_| Error::Invalid(format!("{op}: the answer is not UTF-8")))?;
        quick_xml::de::from_str(text)
            .map_err(|e| Error::Invalid(format!("{op}: unexpected answer: {e}")))
    }
}

/// S3's `<Error>` and IAM's `<ErrorResponse><Error>`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ErrorXml {
    code: Option<String>,
    message: Option<String>,
    error: Option<Box<ErrorXml>>,
}

fn parse_error(body: &[u8]) -> (String, String) {
    let parsed: ErrorXml = std::str::from_utf8(body)
        .ok()
        .and_then(|text| quick_xml::de::from_str(text).ok())
        .unwrap_or_default();
    let inner = match parsed.error {
        Some(inner) => *inner,
        None => parsed,
    };
    let message: String = inner
        .message
        .unwrap_or_default()
        .chars()
        .take(MAX_MESSAGE_CHARS)
        .collect();
    (inner.code.unwrap_or_default(), message)
}

fn is_code(error: &Error, wanted: &str) -> bool {
    matches!(error, Error::Service { code, .. } if code == wanted)
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct CreateAccessKeyResponse {
    create_access_key_result: CreateAccessKeyResult,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct CreateAccessKeyResult {
    access_key: AccessKeyXml,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct AccessKeyXml {
    access_key_id: String,
    secret_access_key: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ListAccessKeysResponse {
    list_access_keys_result: ListAccessKeysResult,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ListAccessKeysResult {
    #[serde(default)]
    access_key_metadata: Members,
}

#[derive(Debug, Default, Deserialize)]
struct Members {
    #[serde(default)]
    member: Vec<KeyMetadata>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct KeyMetadata {
    access_key_id: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ListBucketResult {
    #[serde(default)]
    is_truncated: bool,
    #[serde(default)]
    contents: Vec<Listed>,
    next_continuation_token: Option<String>,
    encoding_type: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Listed {
    key: String,
    #[serde(default)]
    size: u64,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ListMultipartUploadsResult {
    #[serde(default)]
    upload: Vec<Upload>,
    encoding_type: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Upload {
    key: String,
    upload_id: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct DeleteResult {
    #[serde(default, rename = "Error")]
    errors: Vec<DeleteError>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct DeleteError {
    #[serde(default)]
    key: String,
    #[serde(default)]
    code: String,
    #[serde(default)]
    message: String,
}

/// Undoes `encoding-type=url`: `%XX` escapes, and `+` for a space.
fn url_decode(text: &str) -> Result<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = text
                    .get(i + 1..i + 3)
                    .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| Error::Invalid(format!("bad escape in key {text:?}")))?;
                out.push(hex);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).map_err(|_| Error::Invalid(format!("key {text:?} is not UTF-8")))
}

fn decode_key(key: String, encoding: &Option<String>) -> Result<String> {
    match encoding.as_deref() {
        Some("url") => url_decode(&key),
        _ => Ok(key),
    }
}

/// A key XML 1.0 can carry in a batch delete's body.
fn xml_safe(key: &str) -> bool {
    key.chars()
        .all(|c| !c.is_control() || matches!(c, '\t' | '\n' | '\r'))
}

/// The platform's admin identity on an S3 service.
pub struct Admin {
    http: reqwest::Client,
    /// `scheme://host[:port]`, no trailing slash.
    base: String,
    /// The `Host` header, as signed.
    host: String,
    region: String,
    credentials: Credentials,
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admin")
            .field("endpoint", &self.base)
            .field("credentials", &self.credentials)
            .finish_non_exhaustive()
    }
}

struct Call<'a> {
    op: &'a str,
    service: &'a str,
    method: Method,
    /// Already percent-encoded.
    path: &'a str,
    query: &'a [(&'a str, &'a str)],
    headers: Vec<(&'static str, String)>,
    body: Bytes,
}

fn bucket_path(bucket: &str) -> String {
    format!("/{bucket}")
}

fn object_path(bucket: &str, key: &str) -> String {
    format!("/{bucket}/{}", sigv4::uri_encode(key, false))
}

impl Admin {
    /// An admin on the service `config` names. Makes no request.
    pub fn new(config: &StoreConfig, credentials: Credentials) -> Result<Admin> {
        let url = config.url()?;
        let host_name = url
            .host_str()
            .ok_or_else(|| Error::Config("the endpoint has no host".into()))?;
        let host = match url.port() {
            Some(port) => format!("{host_name}:{port}"),
            None => host_name.to_owned(),
        };
        let http = reqwest::Client::builder()
            .timeout(ADMIN_REQUEST_TIMEOUT)
            .connect_timeout(ADMIN_CONNECT_TIMEOUT)
            // A signed request goes where it was signed for, nowhere else.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| Error::Config(format!("the admin's HTTP client: {e}")))?;
        Ok(Admin {
            http,
            base: format!("{}://{host}", url.scheme()),
            host,
            region: config.region.clone(),
            credentials,
        })
    }

    async fn send(&self, call: Call<'_>) -> Result<Answer> {
        let amz_date = chrono::Utc::now().format("%Y%m%dT%H%M%SZ").to_string();
        let payload = sigv4::payload_sha256(&call.body);
        let mut headers: Vec<(&str, String)> = vec![
            ("host", self.host.clone()),
            ("x-amz-date", amz_date.clone()),
            ("x-amz-content-sha256", payload.clone()),
        ];
        headers.extend(call.headers.iter().cloned());
        let signed: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        let authorization = sigv4::authorization(
            &self.credentials.access_key_id,
            &self.credentials.secret_access_key,
            &sigv4::Scope {
                amz_date: &amz_date,
                region: &self.region,
                service: call.service,
            },
            &sigv4::Request {
                method: call.method.as_str(),
                path: call.path,
                query: call.query,
                headers: &signed,
                payload_sha256: &payload,
            },
        );
        let query = sigv4::canonical_query(call.query);
        let url = if query.is_empty() {
            format!("{}{}", self.base, call.path)
        } else {
            format!("{}{}?{query}", self.base, call.path)
        };
        let transport = |source| Error::Transport {
            op: call.op.to_owned(),
            source,
        };
        let mut request = self.http.request(call.method.clone(), &url);
        for (name, value) in &headers {
            request = request.header(*name, value);
        }
        let mut response = request
            .header("authorization", authorization)
            .body(call.body.clone())
            .send()
            .await
            .map_err(transport)?;
        let status = response.status().as_u16();
        let mut body = Vec::new();
        while let Some(piece) = response.chunk().await.map_err(transport)? {
            if body.len() + piece.len() > MAX_RESPONSE_BYTES {
                return Err(Error::Limit(format!(
                    "{}: an answer of more than {MAX_RESPONSE_BYTES} bytes",
                    call.op
                )));
            }
            body.extend_from_slice(&piece);
        }
        Ok(Answer {
            status,
            body: Bytes::from(body),
        })
    }

    async fn s3(
        &self,
        op: &str,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        headers: Vec<(&'static str, String)>,
        body: Bytes,
    ) -> Result<Answer> {
        self.send(Call {
            op,
            service: "s3",
            method,
            path,
            query,
            headers,
            body,
        })
        .await
    }

    /// An IAM action, form-encoded; the answer whatever its status.
    async fn iam(&self, op: &str, action: &str, params: &[(&str, &str)]) -> Result<Answer> {
        // Built and dropped before the request: the serializer holds a
        // callback that is not `Sync`, which would make this future not
        // `Send`.
        let body = {
            let mut form = form_urlencoded::Serializer::new(String::new());
            form.append_pair("Action", action);
            form.append_pair("Version", IAM_VERSION);
            for (name, value) in params {
                form.append_pair(name, value);
            }
            form.finish()
        };
        self.send(Call {
            op,
            service: "iam",
            method: Method::POST,
            path: "/",
            query: &[],
            headers: vec![(
                "content-type",
                "application/x-www-form-urlencoded; charset=utf-8".to_owned(),
            )],
            body: Bytes::from(body),
        })
        .await
    }

    /// Makes the bucket; one the admin has already is success.
    pub async fn ensure_bucket(&self, bucket: &str) -> Result<()> {
        check_bucket_name(bucket)?;
        let op = format!("creating bucket {bucket}");
        let body = if self.region == DEFAULT_REGION {
            Bytes::new()
        } else {
            Bytes::from(format!(
                "<CreateBucketConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">\
                 <LocationConstraint>{}</LocationConstraint></CreateBucketConfiguration>",
                quick_xml::escape::escape(self.region.as_str())
            ))
        };
        let answer = self
            .s3(&op, Method::PUT, &bucket_path(bucket), &[], vec![], body)
            .await?;
        if answer.ok() || (answer.status == 409 && answer.code() == "BucketAlreadyOwnedByYou") {
            Ok(())
        } else {
            Err(answer.refused(&op))
        }
    }

    /// Makes sure `user` exists with the policy that confines it to
    /// `bucket`, then makes it a fresh access key and returns it (the
    /// caller keeps it: the secret cannot be read back). The policy is in
    /// place before the key exists, so no key ever has the rights of a
    /// half-made identity; a failure leaves a user with no key or with a
    /// correct policy, and calling again finishes the job. Keys made
    /// before stay valid until [`Self::revoke_identity`].
    pub async fn ensure_tenant_identity(&self, user: &str, bucket: &str) -> Result<Credentials> {
        check_user_name(user)?;
        check_bucket_name(bucket)?;
        let op = format!("creating IAM user {user}");
        let answer = self.iam(&op, "CreateUser", &[("UserName", user)]).await?;
        if !answer.ok() && answer.code() != "EntityAlreadyExists" {
            return Err(answer.refused(&op));
        }
        self.set_tenant_writes(user, bucket, true).await?;
        let op = format!("creating an access key for IAM user {user}");
        let answer = self
            .iam(&op, "CreateAccessKey", &[("UserName", user)])
            .await?;
        if !answer.ok() {
            return Err(answer.refused(&op));
        }
        let made: CreateAccessKeyResponse = answer.parse(&op)?;
        let key = made.create_access_key_result.access_key;
        Ok(Credentials::new(key.access_key_id, key.secret_access_key))
    }

    /// Puts the policy of `user` on `bucket` again, with or without
    /// `writes`: a tenant over its storage quota keeps its data and may
    /// free room, but writes nothing until it is under again. Its keys stay.
    pub async fn set_tenant_writes(&self, user: &str, bucket: &str, writes: bool) -> Result<()> {
        check_user_name(user)?;
        check_bucket_name(bucket)?;
        let op = format!("putting the policy of IAM user {user}");
        let policy = policy_of(bucket, writes);
        let answer = self
            .iam(
                &op,
                "PutUserPolicy",
                &[
                    ("UserName", user),
                    ("PolicyName", TENANT_POLICY_NAME),
                    ("PolicyDocument", &policy),
                ],
            )
            .await?;
        if answer.ok() {
            Ok(())
        } else {
            Err(answer.refused(&op))
        }
    }

    /// Deletes every access key of `user`, its policy, and the user; a
    /// user that is not there is success. Its keys stop working at once.
    pub async fn revoke_identity(&self, user: &str) -> Result<()> {
        check_user_name(user)?;
        let mut rounds = 0;
        loop {
            let op = format!("listing the access keys of IAM user {user}");
            let answer = self
                .iam(&op, "ListAccessKeys", &[("UserName", user)])
                .await?;
            if answer.status == 404 && answer.code() == "NoSuchEntity" {
                return Ok(());
            }
            if !answer.ok() {
                return Err(answer.refused(&op));
            }
            let listed: ListAccessKeysResponse = answer.parse(&op)?;
            let keys = listed.list_access_keys_result.access_key_metadata.member;
            if keys.is_empty() {
                break;
            }
            rounds += 1;
            if rounds > MAX_CLEANUP_ROUNDS {
                return Err(Error::Limit(format!(
                    "{op}: still keys after {MAX_CLEANUP_ROUNDS} rounds of deleting them"
                )));
            }
            for key in keys {
                let op = format!("deleting access key {} of {user}", key.access_key_id);
                let answer = self
                    .iam(
                        &op,
                        "DeleteAccessKey",
                        &[("UserName", user), ("AccessKeyId", &key.access_key_id)],
                    )
                    .await?;
                if !answer.ok() && answer.code() != "NoSuchEntity" {
                    return Err(answer.refused(&op));
                }
            }
        }
        let op = format!("deleting the policy of IAM user {user}");
        let answer = self
            .iam(
                &op,
                "DeleteUserPolicy",
                &[("UserName", user), ("PolicyName", TENANT_POLICY_NAME)],
            )
            .await?;
        if !answer.ok() && answer.code() != "NoSuchEntity" {
            return Err(answer.refused(&op));
        }
        let op = format!("deleting IAM user {user}");
        let answer = self.iam(&op, "DeleteUser", &[("UserName", user)]).await?;
        if !answer.ok() && answer.code() != "NoSuchEntity" {
            return Err(answer.refused(&op));
        }
        Ok(())
    }

    /// One page of a listing: its keys and sizes, and the next page's token.
    async fn list_page(
        &self,
        bucket: &str,
        token: Option<&str>,
    ) -> Result<(Vec<(String, u64)>, Option<String>)> {
        let op = format!("listing bucket {bucket}");
        let max_keys = LIST_PAGE_KEYS.to_string();
        let mut query = vec![
            ("list-type", "2"),
            ("max-keys", max_keys.as_str()),
            // Keys are the tenant's to choose; some cannot travel in XML.
            ("encoding-type", "url"),
        ];
        if let Some(token) = token {
            query.push(("continuation-token", token));
        }
        let answer = self
            .s3(
                &op,
                Method::GET,
                &bucket_path(bucket),
                &query,
                vec![],
                Bytes::new(),
            )
            .await?;
        if !answer.ok() {
            return Err(answer.refused(&op));
        }
        let page: ListBucketResult = answer.parse(&op)?;
        let objects = page
            .contents
            .into_iter()
            .map(|o| Ok((decode_key(o.key, &page.encoding_type)?, o.size)))
            .collect::<Result<Vec<_>>>()?;
        let next = match (page.is_truncated, page.next_continuation_token) {
            (false, _) => None,
            (true, Some(next)) if Some(next.as_str()) != token => Some(next),
            (true, _) => {
                return Err(Error::Invalid(format!(
                    "{op}: a truncated page without a new continuation token"
                )))
            }
        };
        Ok((objects, next))
    }

    /// Every object's size in `bucket`, added up (a full listing).
    pub async fn bucket_bytes(&self, bucket: &str) -> Result<u64> {
        check_bucket_name(bucket)?;
        let mut total = 0u64;
        let mut token = None;
        for _ in 0..MAX_LIST_PAGES {
            let (objects, next) = self.list_page(bucket, token.as_deref()).await?;
            total += objects.iter().map(|(_, size)| size).sum::<u64>();
            match next {
                None => return Ok(total),
                next => token = next,
            }
        }
        Err(Error::Limit(format!(
            "bucket {bucket}: more than {MAX_LIST_PAGES} pages of objects"
        )))
    }

    /// Deletes keys of `bucket`, 1,000 a request where XML can name them,
    /// one by one otherwise; how many.
    async fn delete_keys(&self, bucket: &str, keys: &[String]) -> Result<u64> {
        let (batchable, single): (Vec<&String>, Vec<&String>) =
            keys.iter().partition(|k| xml_safe(k));
        for key in single {
            let op = format!("deleting {key:?} from bucket {bucket}");
            let answer = self
                .s3(
                    &op,
                    Method::DELETE,
                    &object_path(bucket, key),
                    &[],
                    vec![],
                    Bytes::new(),
                )
                .await?;
            if !answer.ok() && answer.status != 404 {
                return Err(answer.refused(&op));
            }
        }
        for batch in batchable.chunks(LIST_PAGE_KEYS) {
            let op = format!("deleting {} objects from bucket {bucket}", batch.len());
            let mut xml = String::from("<Delete><Quiet>true</Quiet>");
            for key in batch {
                xml.push_str("<Object><Key>");
                xml.push_str(&quick_xml::escape::escape(key.as_str()));
                xml.push_str("</Key></Object>");
            }
            xml.push_str("</Delete>");
            let md5 = base64::engine::general_purpose::STANDARD.encode(Md5::digest(xml.as_bytes()));
            let answer = self
                .s3(
                    &op,
                    Method::POST,
                    &bucket_path(bucket),
                    &[("delete", "")],
                    vec![
                        ("content-md5", md5),
                        ("content-type", "application/xml".to_owned()),
                    ],
                    Bytes::from(xml),
                )
                .await?;
            if !answer.ok() {
                return Err(answer.refused(&op));
            }
            // A 200 may still refuse every key, one by one.
            let result: DeleteResult = answer.parse(&op)?;
            if let Some(first) = result.errors.first() {
                return Err(Error::Service {
                    op,
                    status: answer.status,
                    code: first.code.clone(),
                    message: format!(
                        "{} keys refused, the first {:?}: {}",
                        result.errors.len(),
                        first.key,
                        first
                            .message
                            .chars()
                            .take(MAX_MESSAGE_CHARS)
                            .collect::<String>()
                    ),
                });
            }
        }
        Ok(keys.len() as u64)
    }

    /// Aborts every unfinished multipart upload in `bucket`.
    async fn abort_uploads(&self, bucket: &str) -> Result<()> {
        let op = format!("listing the multipart uploads of bucket {bucket}");
        let max_uploads = LIST_PAGE_KEYS.to_string();
        for _ in 0..MAX_CLEANUP_ROUNDS {
            let answer = self
                .s3(
                    &op,
                    Method::GET,
                    &bucket_path(bucket),
                    &[
                        ("uploads", ""),
                        ("max-uploads", &max_uploads),
                        ("encoding-type", "url"),
                    ],
                    vec![],
                    Bytes::new(),
                )
                .await?;
            if !answer.ok() {
                return Err(answer.refused(&op));
            }
            let listed: ListMultipartUploadsResult = answer.parse(&op)?;
            if listed.upload.is_empty() {
                return Ok(());
            }
            for upload in listed.upload {
                let key = decode_key(upload.key, &listed.encoding_type)?;
                let op = format!("aborting the upload of {key:?} in bucket {bucket}");
                let answer = self
                    .s3(
                        &op,
                        Method::DELETE,
                        &object_path(bucket, &key),
                        &[("uploadId", &upload.upload_id)],
                        vec![],
                        Bytes::new(),
                    )
                    .await?;
                if !answer.ok() && answer.code() != "NoSuchUpload" {
                    return Err(answer.refused(&op));
                }
            }
        }
        Err(Error::Limit(format!(
            "{op}: uploads still there after {MAX_CLEANUP_ROUNDS} rounds"
        )))
    }

    /// Deletes every object of `bucket`, its unfinished multipart uploads,
    /// then the bucket; how many objects were deleted. A bucket that is
    /// not there is success. Revoke the tenant's identity first, or it may
    /// keep writing; a bucket with versioning on is not emptied (the
    /// platform never turns it on, and the tenant's policy cannot).
    pub async fn empty_and_delete_bucket(&self, bucket: &str) -> Result<u64> {
        check_bucket_name(bucket)?;
        let mut deleted = 0u64;
        let op = format!("deleting bucket {bucket}");
        for _ in 0..EMPTY_ROUNDS {
            let mut token = None;
            for page in 0.. {
                if page >= MAX_LIST_PAGES {
                    return Err(Error::Limit(format!(
                        "bucket {bucket}: more than {MAX_LIST_PAGES} pages of objects"
                    )));
                }
                let (objects, next) = match self.list_page(bucket, token.as_deref()).await {
                    Ok(page) => page,
                    Err(e) if is_code(&e, "NoSuchBucket") => return Ok(deleted),
                    Err(e) => return Err(e),
                };
                let keys: Vec<String> = objects.into_iter().map(|(key, _)| key).collect();
                deleted += self.delete_keys(bucket, &keys).await?;
                match next {
                    None => break,
                    next => token = next,
                }
            }
            self.abort_uploads(bucket).await?;
            let answer = self
                .s3(
                    &op,
                    Method::DELETE,
                    &bucket_path(bucket),
                    &[],
                    vec![],
                    Bytes::new(),
                )
                .await?;
            match (answer.status, answer.code().as_str()) {
                (200..=299, _) | (404, "NoSuchBucket") => return Ok(deleted),
                (409, "BucketNotEmpty") => continue,
                _ => return Err(answer.refused(&op)),
            }
        }
        Err(Error::Limit(format!(
            "{op}: still not empty after {EMPTY_ROUNDS} rounds of emptying it"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_could_bend_a_request_are_refused() {
        for ok in ["lh-t-abc", "abc", "a.b-c", "0123456789"] {
            assert!(check_bucket_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "ab", "Upper", "a/b", "a?b", "a b", "-ab", "ab-", "a..b", "a%2Fb", "",
        ] {
            assert!(check_bucket_name(bad).is_err(), "{bad}");
        }
        assert!(check_bucket_name(&"a".repeat(64)).is_err());
        for ok in ["tenant-1", "t_1.x@y+z=w,v"] {
            assert!(check_user_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "a/b", "a b", "a&Action=DeleteUser", "é"] {
            assert!(check_user_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_policy_names_the_bucket_and_its_objects_only() {
        let policy: serde_json::Value = serde_json::from_str(&policy_of("lh-t-a", true)).unwrap();
        let statements = policy["Statement"].as_array().unwrap();
        assert_eq!(statements.len(), 1);
        assert_eq!(statements[0]["Effect"], "Allow");
        assert_eq!(
            statements[0]["Resource"],
            serde_json::json!(["arn:aws:s3:::lh-t-a", "arn:aws:s3:::lh-t-a/*"])
        );
        let actions: Vec<&str> = statements[0]["Action"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert!(actions
            .iter()
            .all(|a| a.starts_with("s3:") && !a.contains('*')));
        assert!(actions.contains(&"s3:ListBucket"));
        assert!(!actions
            .iter()
            .any(|a| a.contains("Bucket") && *a != "s3:ListBucket"));
    }

    #[test]
    fn errors_of_s3_and_iam_are_read() {
        let s3 = br#"<?xml version="1.0" encoding="UTF-8"?>
<Error><Code>NoSuchBucket</Code><Message>The specified bucket does not exist</Message><Resource>/x</Resource></Error>"#;
        assert_eq!(
            parse_error(s3),
            (
                "NoSuchBucket".to_owned(),
                "The specified bucket does not exist".to_owned()
            )
        );
        let iam = br#"<ErrorResponse xmlns="https://iam.amazonaws.com/doc/2010-05-08/"><Error><Code>EntityAlreadyExists</Code><Message>user a already exists</Message><Type>Sender</Type></Error><RequestId>1</RequestId></ErrorResponse>"#;
        assert_eq!(parse_error(iam).0, "EntityAlreadyExists");
        assert_eq!(parse_error(b"").0, "");
        let answer = Answer {
            status: 403,
            body: Bytes::from_static(b"not xml"),
        };
        let shown = answer.refused("op").to_string();
        assert!(shown.contains("403"), "{shown}");
    }

    #[test]
    fn answers_are_parsed() {
        let keys = br#"<ListAccessKeysResponse><ListAccessKeysResult><AccessKeyMetadata><member><AccessKeyId>AK1</AccessKeyId><Status>Active</Status></member><member><AccessKeyId>AK2</AccessKeyId></member></AccessKeyMetadata><IsTruncated>false</IsTruncated></ListAccessKeysResult></ListAccessKeysResponse>"#;
        let answer = Answer {
            status: 200,
            body: Bytes::from_static(keys),
        };
        let listed: ListAccessKeysResponse = answer.parse("op").unwrap();
        let ids: Vec<_> = listed
            .list_access_keys_result
            .access_key_metadata
            .member
            .iter()
            .map(|k| k.access_key_id.as_str())
            .collect();
        assert_eq!(ids, ["AK1", "AK2"]);
        let none = br#"<ListAccessKeysResponse><ListAccessKeysResult><AccessKeyMetadata></AccessKeyMetadata><IsTruncated>false</IsTruncated></ListAccessKeysResult></ListAccessKeysResponse>"#;
        let answer = Answer {
            status: 200,
            body: Bytes::from_static(none),
        };
        let listed: ListAccessKeysResponse = answer.parse("op").unwrap();
        assert!(listed
            .list_access_keys_result
            .access_key_metadata
            .member
            .is_empty());

        let page = br#"<ListBucketResult><Name>b</Name><IsTruncated>true</IsTruncated><Contents><Key>a%2Bb+c</Key><Size>3</Size></Contents><Contents><Key>d</Key><Size>4</Size></Contents><NextContinuationToken>d</NextContinuationToken><EncodingType>url</EncodingType></ListBucketResult>"#;
        let answer = Answer {
            status: 200,
            body: Bytes::from_static(page),
        };
        let page: ListBucketResult = answer.parse("op").unwrap();
        assert!(page.is_truncated);
        assert_eq!(page.contents.len(), 2);
        assert_eq!(
            decode_key(page.contents[0].key.clone(), &page.encoding_type).unwrap(),
            "a+b c"
        );
        assert_eq!(page.next_continuation_token.as_deref(), Some("d"));
    }

    #[test]
    fn url_decoding() {
        assert_eq!(url_decode("a%2Fb%01+c").unwrap(), "a/b\u{1} c");
        assert!(url_decode("a%2").is_err());
        assert!(url_decode("%FF").is_err());
        assert!(xml_safe("a\tb"));
        assert!(!xml_safe("a\u{1}b"));
    }
}
