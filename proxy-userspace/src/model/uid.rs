//! An object's `uid` as the model keeps it: every endpoint's `targetRef`
//! carries one (a quarter of a million in a large cluster), and the API
//! server's form, a lowercase hyphenated UUID, is 36 bytes of text (a
//! 48-byte allocation) for 16 bytes of value. Such a uid is kept as its
//! 16 bytes; any other text, as given. Either way it reads back exactly
//! as it came in.
//!
//! Written here rather than taken from the `uuid` crate: the model needs
//! only the one canonical form and an exact round trip (that crate also
//! accepts upper case, braces and URNs, which would come back changed),
//! and nothing else in the tree uses that crate.

use std::fmt;

#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Uid {
    /// A lowercase hyphenated UUID (8-4-4-4-12 hex digits).
    Uuid([u8; 16]),
    Other(Box<str>),
}

/// The bytes a hyphen comes before in the canonical form (8-4-4-4-12
/// digits: bytes 4, 6, 8 and 10).
const GROUP_STARTS: [usize; 4] = [4, 6, 8, 10];

/// Where the hyphens are in the canonical form.
const HYPHENS_AT: [usize; 4] = [8, 13, 18, 23];

/// Where each byte's two digits start in the canonical form.
const DIGITS_AT: [usize; 16] = [0, 2, 4, 6, 9, 11, 14, 16, 19, 21, 24, 26, 28, 30, 32, 34];

/// A lowercase hex digit's value, 0xff for any other byte.
const NIBBLE: [u8; 256] = {
    let mut t = [0xff; 256];
    let mut c = 0;
    while c < 10 {
        t[b'0' as usize + c] = c as u8;
        c += 1;
    }
    let mut c = 0;
    while c < 6 {
        t[b'a' as usize + c] = 10 + c as u8;
        c += 1;
    }
    t
};

impl Uid {
    pub fn new(text: &str) -> Uid {
        match canonical_uuid(text.as_bytes()) {
            Some(bytes) => Uid::Uuid(bytes),
            None => Uid::Other(text.into()),
        }
    }
}

fn canonical_uuid(text: &[u8]) -> Option<[u8; 16]> {
    let text: &[u8; 36] = text.try_into().ok()?;
    if HYPHENS_AT.iter().any(|&at| text[at] != b'-') {
        return None;
    }
    let mut out = [0u8; 16];
    let mut bad = 0;
    for (byte, at) in out.iter_mut().zip(DIGITS_AT) {
        let (hi, lo) = (
            NIBBLE[usize::from(text[at])],
            NIBBLE[usize::from(text[at + 1])],
        );
        bad |= hi | lo;
        *byte = hi << 4 | lo;
    }
    // A digit's value is below 16; 0xff marks a byte that is none.
    (bad < 16).then_some(out)
}

impl fmt::Display for Uid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Uid::Uuid(b) => {
                for (i, byte) in b.iter().enumerate() {
                    if GROUP_STARTS.contains(&i) {
                        f.write_str("-")?;
                    }
                    write!(f, "{byte:02x}")?;
                }
                Ok(())
            }
            Uid::Other(s) => f.write_str(s),
        }
    }
}

impl fmt::Debug for Uid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.to_string())
    }
}

impl PartialEq<&str> for Uid {
    fn eq(&self, other: &&str) -> bool {
        match self {
            Uid::Uuid(b) => canonical_uuid(other.as_bytes()).as_ref() == Some(b),
            Uid::Other(s) => &**s == *other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_uid_reads_back_as_it_came_in() {
        let cases = [
            ("3f2b8c1e-9d4a-4e6b-8a7c-0123456789ab", true),
            ("00000000-0000-0000-0000-000000000000", true),
            ("ffffffff-ffff-ffff-ffff-ffffffffffff", true),
            // Not the API server's form: kept as text.
            ("3F2B8C1E-9D4A-4E6B-8A7C-0123456789AB", false),
            ("3f2b8c1e9d4a4e6b8a7c0123456789ab", false),
            ("3f2b8c1e-9d4a-4e6b-8a7c-0123456789a", false),
            ("3f2b8c1e-9d4a-4e6b-8a7c-0123456789abc", false),
            ("3f2b8c1e-9d4a-4e6b-8a7c0-123456789ab", false),
            ("3f2b8c1e-9d4a-4e6b-8a7c-0123456789a-", false),
            ("{3f2b8c1e-9d4a-4e6b-8a7c-0123456789}", false),
            ("3f2b8c1e-9d4a-4e6b-8a7c-0123456789ag", false),
            ("3f2b8c1e-9d4a-4e6b-8a7c-01234567-9ab", false),
            ("g3f2b8c1-9d4a-4e6b-8a7c-0123456789ab", false),
            ("pod-uid-from-a-test", false),
            ("", false),
            ("é", false),
        ];
        for (text, compact) in cases {
            let uid = Uid::new(text);
            assert_eq!(matches!(uid, Uid::Uuid(_)), compact, "{text:?}");
            assert_eq!(uid.to_string(), text);
            assert_eq!(uid, text);
        }
        assert_ne!(Uid::new("3f2b8c1e-9d4a-4e6b-8a7c-0123456789ab"), "x");
    }
}
