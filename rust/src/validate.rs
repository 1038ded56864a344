//! Validation of caller values: ids, hashes, codes, names and numbers.
//!
//! Pure functions on plain Rust values. Each failure is a fixed message so
//! that nothing the caller sent is ever echoed back (SPEC §2.4).

use crate::errors::{Error, Result};

/// Longest tenant or worker name accepted.
pub const NAME_MAX_LEN: usize = 128;

/// Canonicalises a task id the way the drop-in peer accepts it: upper case,
/// braces, a `urn:uuid:` prefix and hyphens anywhere are tolerated; the
/// result is always lowercase 8-4-4-4-12.
pub fn canonical_uuid(raw: &str) -> Result<String> {
    const BAD: Error = Error::Invalid("task id must be a valid UUID");
    // The spelling every id the ledger hands out already has: no copies
    // through the lenient path below (it made five per call with an id).
    if is_canonical_uuid(raw) {
        return Ok(raw.to_owned());
    }
    if raw.len() > 256 {
        return Err(BAD);
    }
    let stripped = raw.replace("urn:", "").replace("uuid:", "");
    let hex: String = stripped
        .trim_matches(|c| c == '{' || c == '}')
        .chars()
        .filter(|c| *c != '-')
        .collect();
    if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(BAD);
    }
    let lower = hex.to_ascii_lowercase();
    Ok(format!(
        "{}-{}-{}-{}-{}",
        &lower[0..8],
        &lower[8..12],
        &lower[12..16],
        &lower[16..20],
        &lower[20..32]
    ))
}

/// True when `id` is already a canonical lowercase hyphenated UUID.
#[must_use]
pub fn is_canonical_uuid(id: &str) -> bool {
    let bytes = id.as_bytes();
    bytes.len() == 36
        && bytes.iter().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => *b == b'-',
            _ => b.is_ascii_digit() || (b'a'..=b'f').contains(b),
        })
}

/// A payload fingerprint: exactly 64 lowercase hex characters.
pub fn payload_hash(raw: &str) -> Result<()> {
    if is_sha256_hex(raw) {
        Ok(())
    } else {
        Err(Error::Invalid(
            "payload_hash must be a lowercase SHA-256 hex digest",
        ))
    }
}

/// True for 64 lowercase hex characters.
#[must_use]
pub fn is_sha256_hex(raw: &str) -> bool {
    raw.len() == 64
        && raw
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A reason code of the wrong shape, in the peer's words.
pub const BAD_CODE_FORMAT: &str = "code must be 1-64 lowercase machine-readable characters";

/// The shape every reason code must have before the registry is consulted.
pub fn code_format(raw: &str) -> Result<()> {
    let bytes = raw.as_bytes();
    let ok = !bytes.is_empty()
        && bytes.len() <= 64
        && (bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit())
        && bytes[1..].iter().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
        });
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(BAD_CODE_FORMAT))
    }
}

/// A tenant or worker name: 1-128 characters of `[A-Za-z0-9._:@-]`.
pub fn name(raw: &str) -> Result<()> {
    let ok = !raw.is_empty()
        && raw.len() <= NAME_MAX_LEN
        && raw
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'@' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(
            "tenant and worker names must be 1-128 characters of [A-Za-z0-9._:@-]",
        ))
    }
}

/// Why a number of seconds is refused, after the argument's name: one rule,
/// in the peer's words.
pub const NOT_SECONDS: &str = "must be a finite nonnegative number";

/// A finite, non-negative number of seconds; a refusal names the argument.
pub fn non_negative_seconds(value: f64, name: &'static str) -> Result<f64> {
    if value.is_finite() && value >= 0.0 {
        Ok(value)
    } else {
        Err(Error::InvalidArgument(name, NOT_SECONDS))
    }
}

/// A non-negative integer amount or limit.
pub fn non_negative_int(value: i64) -> Result<i64> {
    if value < 0 {
        Err(Error::Invalid("amount must not be negative"))
    } else {
        Ok(value)
    }
}

/// A clock reading: any finite number of Unix seconds.
pub fn timestamp(value: f64) -> Result<f64> {
    if value.is_finite() {
        // `-0.0` is the instant `0.0`; SQLite stores it unsigned, so an
        // event hashed over the signed zero would not match its own row.
        Ok(value + 0.0)
    } else {
        Err(Error::Invalid("clock returned a non-finite timestamp"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CANON: &str = "0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9";

    #[test]
    fn uuid_forms_the_peer_accepts_are_canonicalised() -> Result<()> {
        for raw in [
            CANON,
            "0A1B2C3D-4E5F-6071-8293-A4B5C6D7E8F9",
            "{0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9}",
            "urn:uuid:0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9",
            "0a1b2c3d4e5f60718293a4b5c6d7e8f9",
            "0a-1b2c3d4e5f60718293a4b5c6d7e8f9",
        ] {
            assert_eq!(canonical_uuid(raw)?, CANON, "{raw}");
        }
        Ok(())
    }

    #[test]
    fn uuid_garbage_is_refused() {
        for raw in [
            "",
            "x",
            "0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8fg",
            &"a".repeat(33),
            &"0".repeat(300),
        ] {
            assert!(canonical_uuid(raw).is_err(), "{raw}");
        }
    }

    #[test]
    fn canonical_check_is_strict() {
        assert!(is_canonical_uuid(CANON));
        assert!(!is_canonical_uuid(&CANON.to_uppercase()));
        assert!(!is_canonical_uuid(&CANON.replace('-', "")));
    }

    #[test]
    fn names_follow_the_charset() {
        for ok in ["a", "worker-1", "acme.prod:eu@2_x", &"z".repeat(128)] {
            assert!(name(ok).is_ok(), "{ok}");
        }
        for bad in ["", " ", "a b", "é", "a/b", &"z".repeat(129), "a\0"] {
            assert!(name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn codes_follow_the_format() {
        assert!(code_format("worker_completed").is_ok());
        assert!(code_format("9a.b-c").is_ok());
        for bad in ["", "_x", "A", "a b", &"a".repeat(65)] {
            assert!(code_format(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn numbers_are_bounded() {
        assert!(non_negative_seconds(0.0, "t").is_ok());
        assert!(non_negative_seconds(-0.1, "t").is_err());
        assert!(non_negative_seconds(f64::NAN, "t").is_err());
        assert!(non_negative_seconds(f64::INFINITY, "t").is_err());
        assert!(non_negative_int(i64::MAX).is_ok());
        assert!(non_negative_int(-1).is_err());
        assert!(timestamp(-5.0).is_ok());
        assert!(timestamp(f64::NAN).is_err());
    }

    #[test]
    fn hashes_are_lowercase_hex() {
        assert!(payload_hash(&"a".repeat(64)).is_ok());
        assert!(payload_hash(&"A".repeat(64)).is_err());
        assert!(payload_hash(&"a".repeat(63)).is_err());
    }
}
