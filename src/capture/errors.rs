//! What a refused replay says: every error names the archive and, where one
//! entry is at fault, that entry.

use super::limits::MAX_HEADER_BYTES;
use super::links::LinkFault;
use super::{TOP, TOPS};
use std::io;
use std::path::PathBuf;

/// Why an entry was refused; the archive and entry are named by [`ReplayError`].
#[derive(Debug, thiserror::Error)]
pub enum Fault {
    /// An absolute name, or one with `..` or `.` components.
    #[error("not a plain relative path")]
    NotRelative,
    /// A name outside the top folders a capture holds.
    #[error("outside the folders a capture holds ({}/)", TOPS.join("/, "))]
    OutsideTop,
    /// A top folder itself as a file or link (`sysfs -> /sys`).
    #[error("a top name must be a folder")]
    TopNotFolder,
    /// A hard link: it could tie a replayed name to a file elsewhere.
    #[error("a hard link (to {target:?}), which a capture never holds")]
    HardLink {
        /// The name it links to.
        target: String,
    },
    /// A device node, FIFO or any other kind a capture never holds.
    #[error("{kind}, which a capture never holds (only folders, regular files and symlinks)")]
    Kind {
        /// The kind, in words.
        kind: String,
    },
    /// The same name twice (a folder named again is no harm and passes).
    #[error("appears twice")]
    Duplicate,
    /// An entry whose folder is a link or file in the archive: writing it
    /// would follow the link.
    #[error("lies under {parent:?}, which is not a folder")]
    UnderNonFolder {
        /// The archive's entry in the way.
        parent: String,
    },
    /// A symlink with an empty target.
    #[error("a symlink with an empty target")]
    EmptyTarget,
    /// A symlink that leads outside the unpack folder.
    #[error("a symlink that leaves the unpack folder: {0}")]
    Link(LinkFault),
}

/// Why a capture could not be replayed; each names the archive and, where
/// one is at fault, the entry.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The archive could not be opened.
    #[error("opening {}", archive.display())]
    Open {
        /// The archive.
        archive: PathBuf,
        /// The failure.
        source: io::Error,
    },
    /// Not gzip, not tar, or damaged.
    #[error("{} is not a tar.gz capture", archive.display())]
    NotACapture {
        /// The archive.
        archive: PathBuf,
        /// What the reader met.
        source: io::Error,
    },
    /// The archive stops before its end: the tar end-of-archive marker or
    /// the end of the gzip stream is missing, as in a copy cut short.
    #[error("{} is truncated: it ends before its tar end-of-archive marker or its gzip stream's end; capture the node again", archive.display())]
    Truncated {
        /// The archive.
        archive: PathBuf,
    },
    /// An entry refused for what it is.
    #[error("{}: entry {entry:?} refused: {fault}", archive.display())]
    Refused {
        /// The archive.
        archive: PathBuf,
        /// The entry's name as stored.
        entry: String,
        /// Why.
        fault: Fault,
    },
    /// More entries than `--replay-max-entries`.
    #[error("{}: more than {limit} entries (at {entry:?}); --replay-max-entries raises the limit", archive.display())]
    TooManyEntries {
        /// The archive.
        archive: PathBuf,
        /// The first entry past the limit.
        entry: String,
        /// The limit.
        limit: u64,
    },
    /// More bytes than `--replay-max-bytes`.
    #[error("{}: entry {entry:?} ({size} bytes) takes the unpacked size past {limit} bytes; --replay-max-bytes raises the limit", archive.display())]
    TooLarge {
        /// The archive.
        archive: PathBuf,
        /// The entry that went past the limit.
        entry: String,
        /// Its size.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// Header data (long names, pax records) over [`MAX_HEADER_BYTES`].
    #[error("{}: the header after entry {after:?} is over {MAX_HEADER_BYTES} bytes", archive.display())]
    HeaderTooLarge {
        /// The archive.
        archive: PathBuf,
        /// The last entry read before it ("" at the start).
        after: String,
    },
    /// The archive holds no top folder.
    #[error("{}: no {TOP}/ folder: not a nodefabric capture", archive.display())]
    NoTree {
        /// The archive.
        archive: PathBuf,
    },
    /// The temp folder could not be made.
    #[error("creating a replay folder in {}", dir.display())]
    TempFolder {
        /// The temp folder it was to go in.
        dir: PathBuf,
        /// The failure.
        source: io::Error,
    },
    /// Writing an entry failed.
    #[error("{}: entry {entry:?}: writing {}", archive.display(), path.display())]
    Write {
        /// The archive.
        archive: PathBuf,
        /// The entry.
        entry: String,
        /// Where it was being written.
        path: PathBuf,
        /// The failure.
        source: io::Error,
    },
}

/// Why a capture could not be packed; names the archive entry being written.
#[derive(Debug, thiserror::Error)]
pub enum PackError {
    /// Appending a symlink entry failed.
    #[error("archiving link {path}")]
    Link {
        /// The link's path under the tree.
        path: String,
        /// The failure.
        source: io::Error,
    },
    /// Appending a file or folder entry failed.
    #[error("archiving {path}")]
    Entry {
        /// The entry's path (under the tree, or `vendor/…`).
        path: String,
        /// The failure.
        source: io::Error,
    },
    /// Closing the tar stream or the gzip encoder failed.
    #[error("finishing the archive")]
    Finish(#[source] io::Error),
}

/// A replayed capture's `vendor/` file that cannot be used; the command line
/// puts the archive in front, so the reason is part of the text.
#[derive(Debug, thiserror::Error)]
pub enum VendorError {
    /// The file is there but could not be read.
    #[error("vendor/{file}: {reason}")]
    Read {
        /// The file's name in `vendor/`.
        file: &'static str,
        /// What the read said.
        reason: io::Error,
    },
    /// Something other than a regular file under that name.
    #[error("vendor/{0}: not a regular file")]
    NotAFile(&'static str),
    /// `vendor/fabric.json` is not the answers' shape.
    #[error("{0}")]
    Fabric(crate::fabric::answers::AnswersError),
    /// `vendor/rails.json` is not the answers' shape.
    #[error("{0}")]
    Rails(crate::rails::answers::AnswersError),
}
