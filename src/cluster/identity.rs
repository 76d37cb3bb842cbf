//! Who the manager is: the ServiceAccount its credential names, in-cluster or from a
//! kubeconfig. `check` reports it; the reconcilers never lend it to an Agent (TRUST.md §2).

use serde_json::Value;

/// `namespace/name` of the ServiceAccount whose token `config` carries (its JWT's `sub`,
/// `system:serviceaccount:<namespace>:<name>`); `None` for any other credential.
pub fn service_account(config: &kube::Config) -> Option<String> {
    // The token is a `SecretString`; its serialized form is the one place kube shows it.
    let auth = serde_json::to_value(&config.auth_info).ok()?;
    let token = match (auth["token"].as_str(), auth["tokenFile"].as_str()) {
        (Some(t), _) => t.to_owned(),
        (None, Some(file)) => std::fs::read_to_string(file).ok()?,
        (None, None) => return None,
    };
    service_account_of(token.trim())
}

fn service_account_of(jwt: &str) -> Option<String> {
    let payload = jwt.split('.').nth(1)?;
    let claims: Value = serde_json::from_slice(&base64url_decode(payload)?).ok()?;
    let sub = claims["sub"].as_str()?;
    let (ns, name) = sub
        .strip_prefix("system:serviceaccount:")?
        .split_once(':')?;
    Some(format!("{ns}/{name}"))
}

/// RFC 4648 §5 (a JWT's segments), padding optional.
fn base64url_decode(s: &str) -> Option<Vec<u8>> {
    use base64::Engine;
    let engine = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    engine.decode(s.trim_end_matches('=')).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_accounts_are_read_from_the_token() {
        // {"alg":"none"} . {"sub":"system:serviceaccount:autonomic-system:autonomic-manager"}
        let claims =
            r#"{"iss":"k","sub":"system:serviceaccount:autonomic-system:autonomic-manager"}"#;
        let b64 = |s: &str| {
            use base64::Engine;
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s)
        };
        let jwt = format!("{}.{}.sig", b64(r#"{"alg":"none"}"#), b64(claims));
        assert_eq!(
            service_account_of(&jwt).as_deref(),
            Some("autonomic-system/autonomic-manager")
        );
        let user = format!("x.{}.y", b64(r#"{"sub":"alice"}"#));
        assert_eq!(service_account_of(&user), None);
        assert_eq!(service_account_of("not a jwt"), None);
        assert_eq!(base64url_decode("Zm9vYmFy").unwrap(), b"foobar");
        assert_eq!(base64url_decode("Zm9vYg").unwrap(), b"foob");
        assert_eq!(base64url_decode("__79").unwrap(), [0xff, 0xfe, 0xfd]);
    }
}
