//! AWS Signature Version 4, header form, for the admin's own S3 and IAM
//! calls. Small on purpose: the tenants' data goes through `object_store`,
//! which signs its own requests; this signs the few calls it has no API
//! for (buckets, identities).

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

pub const ALGORITHM: &str = "AWS4-HMAC-SHA256";
/// SHA-256 of nothing: the payload hash of a request without a body.
pub const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// Who signs, where and when.
#[derive(Debug, Clone, Copy)]
pub struct Scope<'a> {
    /// `YYYYMMDD'T'HHMMSS'Z'`, the value of `x-amz-date`.
    pub amz_date: &'a str,
    pub region: &'a str,
    /// `s3`, `iam`.
    pub service: &'a str,
}

impl Scope<'_> {
    fn date(&self) -> &str {
        &self.amz_date[..self.amz_date.len().min(8)]
    }

    fn credential_scope(&self) -> String {
        format!(
            "{}/{}/{}/aws4_request",
            self.date(),
            self.region,
            self.service
        )
    }
}

/// The parts of a request that are signed.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub method: &'a str,
    /// The path exactly as sent, already percent-encoded (see [`uri_encode`]).
    pub path: &'a str,
    /// Query parameters, not encoded; their order does not matter.
    pub query: &'a [(&'a str, &'a str)],
    /// Every header to sign, `host` and `x-amz-date` among them; names in
    /// any case.
    pub headers: &'a [(&'a str, &'a str)],
    /// Hex SHA-256 of the body (or `UNSIGNED-PAYLOAD`).
    pub payload_sha256: &'a str,
}

/// The `Authorization` header's value.
pub fn authorization(
    access_key_id: &str,
    secret_access_key: &str,
    scope: &Scope<'_>,
    request: &Request<'_>,
) -> String {
    let (signed_headers, canonical) = canonical_request(request);
    let signature = signature(secret_access_key, scope, &canonical);
    format!(
        "{ALGORITHM} Credential={access_key_id}/{}, SignedHeaders={signed_headers}, Signature={signature}",
        scope.credential_scope()
    )
}

/// The hex signature of a canonical request.
pub fn signature(secret_access_key: &str, scope: &Scope<'_>, canonical_request: &str) -> String {
    let string_to_sign = format!(
        "{ALGORITHM}\n{}\n{}\n{}",
        scope.amz_date,
        scope.credential_scope(),
        hex::encode(Sha256::digest(canonical_request.as_bytes()))
    );
    let mut key = hmac(
        format!("AWS4{secret_access_key}").as_bytes(),
        scope.date().as_bytes(),
    );
    for part in [scope.region, scope.service, "aws4_request"] {
        key = hmac(&key, part.as_bytes());
    }
    hex::encode(hmac(&key, string_to_sign.as_bytes()))
}

/// The signed headers' names (`a;b;c`) and the canonical request.
pub fn canonical_request(request: &Request<'_>) -> (String, String) {
    let mut headers: Vec<(String, String)> = request
        .headers
        .iter()
        .map(|(name, value)| (name.to_ascii_lowercase(), canonical_header_value(value)))
        .collect();
    headers.sort();
    // A header named twice is signed once, its values joined by commas.
    let mut merged: Vec<(String, String)> = Vec::with_capacity(headers.len());
    for (name, value) in headers {
        match merged.last_mut() {
            Some((last, values)) if *last == name => {
                values.push(',');
                values.push_str(&value);
            }
            _ => merged.push((name, value)),
        }
    }
    let signed_headers = merged
        .iter()
        .map(|(name, _)| name.as_str())
        .collect::<Vec<_>>()
        .join(";");
    let canonical_headers: String = merged
        .iter()
        .map(|(name, value)| format!("{name}:{value}\n"))
        .collect();
    let canonical = format!(
        "{}\n{}\n{}\n{}\n{}\n{}",
        request.method,
        request.path,
        canonical_query(request.query),
        canonical_headers,
        signed_headers,
        request.payload_sha256
    );
    (signed_headers, canonical)
}

/// Query parameters encoded and sorted as the signature wants them; also
/// what the request sends, so that both agree byte for byte.
pub fn canonical_query(query: &[(&str, &str)]) -> String {
    let mut pairs: Vec<(String, String)> = query
        .iter()
        .map(|(k, v)| (uri_encode(k, true), uri_encode(v, true)))
        .collect();
    pairs.sort();
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

/// Percent-encodes all but the unreserved characters (`A-Z a-z 0-9 - . _ ~`),
/// and `/` too unless it separates a path's segments.
pub fn uri_encode(text: &str, encode_slash: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(byte as char)
            }
            b'/' if !encode_slash => out.push('/'),
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

/// Trimmed, inner runs of spaces collapsed to one.
fn canonical_header_value(value: &str) -> String {
    value.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

/// Hex SHA-256 of a payload.
pub fn payload_sha256(body: &[u8]) -> String {
    hex::encode(Sha256::digest(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    // The AWS SigV4 test suite's credentials and clock.
    const SUITE_KEY: &str = "AKIDEXAMPLE";
    const SUITE_SECRET: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
    const SUITE_DATE: &str = "20150830T123600Z";
    // The S3 documentation's signing examples' credentials and clock.
    const S3_KEY: &str = "AKIAIOSFODNN7EXAMPLE";
    const S3_SECRET: &str = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
    const S3_DATE: &str = "20130524T000000Z";
    const S3_HOST: &str = "examplebucket.s3.amazonaws.com";

    fn suite_scope() -> Scope<'static> {
        Scope {
            amz_date: SUITE_DATE,
            region: "us-east-1",
            service: "service",
        }
    }

    fn s3_scope() -> Scope<'static> {
        Scope {
            amz_date: S3_DATE,
            region: "us-east-1",
            service: "s3",
        }
    }

    #[test]
    fn get_vanilla_from_the_aws_test_suite() {
        let headers = [
            ("Host", "example.amazonaws.com"),
            ("X-Amz-Date", SUITE_DATE),
        ];
        let request = Request {
            method: "GET",
            path: "/",
            query: &[],
            headers: &headers,
            payload_sha256: EMPTY_SHA256,
        };
        let (_, canonical) = canonical_request(&request);
        assert_eq!(
            canonical,
            "GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\n\
             host;x-amz-date\n\
             e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            authorization(SUITE_KEY, SUITE_SECRET, &suite_scope(), &request),
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, \
             SignedHeaders=host;x-amz-date, \
             Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
        );
    }

    #[test]
    fn get_vanilla_query_order_key_case_from_the_aws_test_suite() {
        let headers = [
            ("Host", "example.amazonaws.com"),
            ("X-Amz-Date", SUITE_DATE),
        ];
        let request = Request {
            method: "GET",
            path: "/",
            query: &[("Param2", "value2"), ("Param1", "value1")],
            headers: &headers,
            payload_sha256: EMPTY_SHA256,
        };
        let (_, canonical) = canonical_request(&request);
        assert_eq!(
            signature(SUITE_SECRET, &suite_scope(), &canonical),
            "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500"
        );
    }

    #[test]
    fn the_s3_documentations_get_object_example() {
        let headers = [
            ("Host", S3_HOST),
            ("Range", "bytes=0-9"),
            ("x-amz-content-sha256", EMPTY_SHA256),
            ("x-amz-date", S3_DATE),
        ];
        let request = Request {
            method: "GET",
            path: "/test.txt",
            query: &[],
            headers: &headers,
            payload_sha256: EMPTY_SHA256,
        };
        assert_eq!(
            authorization(S3_KEY, S3_SECRET, &s3_scope(), &request),
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, \
             SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, \
             Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
        );
    }

    #[test]
    fn the_s3_documentations_put_object_example_with_an_escaped_key() {
        let body = "Welcome to Amazon S3.";
        let body_hash = payload_sha256(body.as_bytes());
        assert_eq!(
            body_hash,
            "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072"
        );
        let path = uri_encode("/test$file.text", false);
        assert_eq!(path, "/test%24file.text");
        let headers = [
            ("Date", "Fri, 24 May 2013 00:00:00 GMT"),
            ("Host", S3_HOST),
            ("x-amz-content-sha256", body_hash.as_str()),
            ("x-amz-date", S3_DATE),
            ("x-amz-storage-class", "REDUCED_REDUNDANCY"),
        ];
        let request = Request {
            method: "PUT",
            path: &path,
            query: &[],
            headers: &headers,
            payload_sha256: &body_hash,
        };
        let (signed, canonical) = canonical_request(&request);
        assert_eq!(
            signed,
            "date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class"
        );
        assert_eq!(
            signature(S3_SECRET, &s3_scope(), &canonical),
            "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd"
        );
    }

    #[test]
    fn the_s3_documentations_list_objects_example_sorts_its_query() {
        let headers = [
            ("Host", S3_HOST),
            ("x-amz-content-sha256", EMPTY_SHA256),
            ("x-amz-date", S3_DATE),
        ];
        let request = Request {
            method: "GET",
            path: "/",
            query: &[("prefix", "J"), ("max-keys", "2")],
            headers: &headers,
            payload_sha256: EMPTY_SHA256,
        };
        let (_, canonical) = canonical_request(&request);
        assert_eq!(
            signature(S3_SECRET, &s3_scope(), &canonical),
            "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"
        );
        // Another secret, another signature: the vectors above can fail.
        assert_ne!(
            signature(SUITE_SECRET, &s3_scope(), &canonical),
            "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"
        );
    }

    #[test]
    fn encoding_keeps_only_the_unreserved_characters() {
        assert_eq!(uri_encode("a b/c~d", true), "a%20b%2Fc~d");
        assert_eq!(uri_encode("a b/c", false), "a%20b/c");
        assert_eq!(uri_encode("é", true), "%C3%A9");
        assert_eq!(canonical_query(&[("delete", "")]), "delete=");
    }
}
