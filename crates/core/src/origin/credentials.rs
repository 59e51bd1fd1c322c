//! The AWS shared credentials file (`~/.aws/credentials`): INI sections, `key = value`
//! lines, `#`/`;` comments. Only the two keys an S3 origin needs are read.

/// An access key and its secret.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyPair {
    pub access_key_id: String,
    pub secret_access_key: String,
}

impl std::fmt::Debug for KeyPair {
    // The secret never reaches a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyPair")
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

/// Why a credentials file gave no key pair.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CredentialsError {
    #[error("no [{0}] section in the credentials file")]
    NoProfile(String),
    #[error("[{profile}] has no {key}")]
    MissingKey { profile: String, key: &'static str },
    #[error("line {0} of the credentials file is neither a [section] nor key = value")]
    BadLine(usize),
}

/// The key pair of `profile` in the text of a credentials file.
pub fn parse_credentials(text: &str, profile: &str) -> Result<KeyPair, CredentialsError> {
    let mut section: Option<&str> = None;
    let mut seen = false;
    let (mut id, mut secret) = (None, None);
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            let name = name.trim();
            // The config file's spelling, `[profile NAME]`, is accepted too.
            let name = name.strip_prefix("profile ").map_or(name, str::trim);
            section = Some(name);
            seen |= name == profile;
            continue;
        }
        let (k, v) = line
            .split_once('=')
            .ok_or(CredentialsError::BadLine(n + 1))?;
        if section != Some(profile) {
            continue;
        }
        match k.trim() {
            "aws_access_key_id" => id = Some(v.trim().to_string()),
            "aws_secret_access_key" => secret = Some(v.trim().to_string()),
            _ => {}
        }
    }
    if !seen {
        return Err(CredentialsError::NoProfile(profile.to_string()));
    }
    let missing = |key| CredentialsError::MissingKey {
        profile: profile.to_string(),
        key,
    };
    Ok(KeyPair {
        access_key_id: id.ok_or_else(|| missing("aws_access_key_id"))?,
        secret_access_key: secret.ok_or_else(|| missing("aws_secret_access_key"))?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_profile_asked_is_read_and_others_ignored() {
        let text = "# comment\n[default]\naws_access_key_id = A\naws_secret_access_key=S\n\n\
                    [profile other]\naws_access_key_id = B\n";
        let k = parse_credentials(text, "default").unwrap();
        assert_eq!(
            (k.access_key_id.as_str(), k.secret_access_key.as_str()),
            ("A", "S")
        );
        assert!(!format!("{k:?}").contains('S') || !format!("{k:?}").contains("\"S\""));
        assert_eq!(
            parse_credentials(text, "other"),
            Err(CredentialsError::MissingKey {
                profile: "other".into(),
                key: "aws_secret_access_key"
            })
        );
        assert_eq!(
            parse_credentials(text, "x"),
            Err(CredentialsError::NoProfile("x".into()))
        );
        assert_eq!(
            parse_credentials("[default]\nnonsense\n", "default"),
            Err(CredentialsError::BadLine(2))
        );
    }
}
