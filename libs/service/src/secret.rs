//! A configured value that must never be printed: a token, a password, a
//! database URL that may carry one.
//!
//! Configuration is logged and shown in panics through `Debug`; a
//! [`Secret`] prints as `Secret("…redacted…")` there, has no `Display`, and
//! gives its value only to a caller that asks for it by name
//! ([`Secret::expose`]), so a leak is a line a reviewer can see.

/// A secret string; see the module.
#[derive(Clone)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value itself, for the one place that must use it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(\"…redacted…\")")
    }
}

/// What a flag or an environment variable gives.
impl From<String> for Secret {
    fn from(value: String) -> Self {
        Self(value)
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Self(value.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_is_never_printed_and_is_read_only_when_exposed() {
        let secret = Secret::from("postgres://lh:hunter2@db/lh".to_string());
        assert_eq!(format!("{secret:?}"), "Secret(\"…redacted…\")");
        assert_eq!(
            format!("{:?}", Some(secret.clone())),
            "Some(Secret(\"…redacted…\"))"
        );
        assert_eq!(secret.expose(), "postgres://lh:hunter2@db/lh");
    }

    #[test]
    fn a_flag_parses_into_a_secret() {
        #[derive(clap::Parser, Debug)]
        struct Flags {
            #[arg(long)]
            token: Option<Secret>,
        }
        let flags = <Flags as clap::Parser>::parse_from(["x", "--token", "s3cret"]);
        assert_eq!(flags.token.as_ref().map(Secret::expose), Some("s3cret"));
        assert!(!format!("{flags:?}").contains("s3cret"));
    }
}
