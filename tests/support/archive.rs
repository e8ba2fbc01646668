//! Builds hostile tar.gz archives byte by byte for replay tests.
//!
//! The `tar` crate's own `append_*` calls refuse `..` and absolute names, which
//! is exactly what these tests need to write, so names and link targets are
//! copied into the header fields directly and the checksum is set by hand.
#![allow(dead_code)]

use flate2::{write::GzEncoder, Compression};
use std::io::{self, Read};
use tar::{EntryType, Header};

/// An archive under construction.
pub struct Hostile {
    tar: tar::Builder<GzEncoder<Vec<u8>>>,
}

impl Default for Hostile {
    fn default() -> Self {
        Self::new()
    }
}

/// A header of `kind` named `name`, pointing at `link` for links; both are
/// copied verbatim (at most 100 bytes each, the classic fields).
fn header(kind: EntryType, name: &str, link: &str, size: u64) -> Header {
    assert!(
        name.len() <= 100 && link.len() <= 100,
        "names over 100 bytes need a long-name entry"
    );
    let mut h = Header::new_gnu();
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(0o644);
    h.set_mtime(0);
    h.set_uid(0);
    h.set_gid(0);
    let gnu = h.as_gnu_mut().unwrap();
    gnu.name[..name.len()].copy_from_slice(name.as_bytes());
    gnu.linkname[..link.len()].copy_from_slice(link.as_bytes());
    h.set_cksum();
    h
}

impl Hostile {
    /// An empty archive.
    pub fn new() -> Hostile {
        Hostile {
            tar: tar::Builder::new(GzEncoder::new(Vec::new(), Compression::best())),
        }
    }

    /// Appends an entry of any kind with `size` bytes of `data`.
    pub fn entry(
        mut self,
        kind: EntryType,
        name: &str,
        link: &str,
        size: u64,
        data: impl Read,
    ) -> Self {
        self.tar
            .append(&header(kind, name, link, size), data)
            .unwrap();
        self
    }

    /// A folder.
    pub fn dir(self, name: &str) -> Self {
        self.entry(EntryType::Directory, name, "", 0, io::empty())
    }

    /// A regular file holding `text`.
    pub fn file(self, name: &str, text: &str) -> Self {
        self.entry(
            EntryType::Regular,
            name,
            "",
            text.len() as u64,
            text.as_bytes(),
        )
    }

    /// A regular file of `size` zero bytes: compresses about a thousandfold.
    pub fn zeros(self, name: &str, size: u64) -> Self {
        self.entry(EntryType::Regular, name, "", size, io::repeat(0).take(size))
    }

    /// A symlink to `target`.
    pub fn symlink(self, name: &str, target: &str) -> Self {
        self.entry(EntryType::Symlink, name, target, 0, io::empty())
    }

    /// A hard link to `target`.
    pub fn hardlink(self, name: &str, target: &str) -> Self {
        self.entry(EntryType::Link, name, target, 0, io::empty())
    }

    /// A GNU long-name record of `size` bytes, the kind a tar reader holds
    /// in memory whole before the entry it names.
    pub fn long_name(self, size: u64) -> Self {
        self.entry(
            EntryType::GNULongName,
            "././@LongLink",
            "",
            size,
            io::repeat(b'a').take(size),
        )
    }

    /// The finished .tar.gz bytes.
    pub fn finish(self) -> Vec<u8> {
        self.tar.into_inner().unwrap().finish().unwrap()
    }
}
