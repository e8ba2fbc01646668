//! Names the kernel gives as bytes, as text and back.
//!
//! A netdev may be named any bytes but `/` and NUL, UTF-8 or not, while the
//! record, the CDI spec and the paths the sysfs reader builds are text. A
//! name's text is the name itself where it is UTF-8, with each byte that is
//! not part of valid UTF-8 written `\xNN` (two lowercase hex digits) and a
//! backslash written `\\`, so that a name that already reads `\xff` is not
//! taken for the byte. Only `\` sequences are added: `/`, `.` and every
//! other character keep their place, so a path escapes name by name and
//! its text is still a path of the same names.

use std::borrow::Cow;
use std::ffi::{OsStr, OsString};
use std::fmt::Write as _;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

/// The text of `bytes` (see the module's doc); UTF-8 without a backslash,
/// every name a kernel normally gives, is itself, uncopied.
pub fn escape(bytes: &[u8]) -> Cow<'_, str> {
    if let Ok(text) = std::str::from_utf8(bytes) {
        if !text.contains('\\') {
            return Cow::Borrowed(text);
        }
    }
    let mut out = String::with_capacity(bytes.len() + 8);
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str(r"\\"),
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            write!(out, r"\x{b:02x}").expect("writing to a String");
        }
    }
    Cow::Owned(out)
}

/// The bytes whose text [`escape`] gave as `text`; `None` for text it never
/// gives (a lone `\`, `\x` without two lowercase hex digits, or an escaped
/// byte that is part of valid UTF-8 and so would have been itself), so that
/// each name has exactly one text.
pub fn unescape(text: &str) -> Option<Cow<'_, [u8]>> {
    if !text.contains('\\') {
        return Some(Cow::Borrowed(text.as_bytes()));
    }
    let mut out = Vec::with_capacity(text.len());
    let mut rest = text.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        rest = match (b, tail) {
            (b'\\', [b'\\', tail @ ..]) => {
                out.push(b'\\');
                tail
            }
            (b'\\', [b'x', hi, lo, tail @ ..]) => {
                out.push(hex(*hi)? << 4 | hex(*lo)?);
                tail
            }
            (b'\\', _) => return None,
            (b, tail) => {
                out.push(b);
                tail
            }
        };
    }
    // A byte escaped that need not be (`\x41`, or `\xc3\xa9` for `é`) is
    // not a text `escape` gives: the round trip says so in one comparison.
    (escape(&out) == text).then_some(Cow::Owned(out))
}

/// The text of a path on disk, name by name (see [`escape`]).
pub fn path_text(path: &Path) -> Cow<'_, str> {
    escape(path.as_os_str().as_bytes())
}

/// The path on disk whose text is `text` (see [`unescape`]): the text
/// itself unless it holds an escape; `None` for text no path gives.
pub fn text_path(text: &str) -> Option<Cow<'_, Path>> {
    Some(match unescape(text)? {
        Cow::Borrowed(b) => Cow::Borrowed(Path::new(OsStr::from_bytes(b))),
        Cow::Owned(b) => Cow::Owned(PathBuf::from(OsString::from_vec(b))),
    })
}

/// The value of one lowercase hex digit.
fn hex(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn utf8_is_itself_and_other_bytes_and_backslashes_are_escaped() {
        assert!(matches!(escape(b"enp19s0np0"), Cow::Borrowed("enp19s0np0")));
        assert_eq!(escape(b"eth\xff0"), r"eth\xff0");
        assert_eq!(escape(br"eth\xff0"), r"eth\\xff0");
        assert_eq!(escape("é\u{1F600}".as_bytes()), "é\u{1F600}");
        // A character cut short: each of its bytes, then what follows.
        assert_eq!(escape(b"a\xe2\x82b"), r"a\xe2\x82b");
        for bad in [r"\", r"a\b", r"\x4", r"\xFF", r"\x41", r"\xc3\xa9", r"\xg0"] {
            assert_eq!(unescape(bad), None, "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn every_name_comes_back_from_its_text(
            bytes in prop::collection::vec(
                prop_oneof![Just(b'\\'), Just(b'x'), Just(b'f'), Just(0xff_u8), any::<u8>()],
                0..24,
            )
        ) {
            let text = escape(&bytes);
            let back = unescape(&text);
            prop_assert_eq!(back.as_deref(), Some(&bytes[..]));
            // A path stays a path: its `/` are the name's own, no more.
            prop_assert_eq!(
                text.matches('/').count(),
                bytes.iter().filter(|b| **b == b'/').count()
            );
        }

        #[test]
        fn every_text_taken_back_is_the_one_its_name_gives(text in r"[\\xaf0-9é/]{0,16}") {
            if let Some(bytes) = unescape(&text) {
                prop_assert_eq!(escape(&bytes), text.as_str());
            }
        }
    }
}
