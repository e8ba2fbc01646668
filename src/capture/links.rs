//! Where a symlink leads, worked out the way the kernel walks it, so that a
//! capture can be checked to keep every link inside its own folder.
//!
//! A lexical clean-up of `dir/target` is not enough: `..` after a link climbs
//! from where that link points, not from where it sits, so `up/../x` escapes
//! when `up` points at the top. The walk below expands every link it meets,
//! which keeps the path it holds free of links and makes each `..` exact.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The most links one walk follows, the kernel's own limit (MAXSYMLINKS).
pub const MAX_HOPS: usize = 40;

/// Why a link does not stay inside the folder it was checked against.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkFault {
    /// The link, or one it leads through, names an absolute path.
    #[error("its target {target:?} is absolute")]
    Absolute {
        /// The absolute target met on the way.
        target: String,
    },
    /// A `..` on the way climbs above the folder.
    #[error("`..` in {target:?} climbs above the top folder")]
    ClimbsOut {
        /// The target text whose `..` climbed out.
        target: String,
    },
    /// The chain is longer than [`MAX_HOPS`] (a loop, or built to tire the check).
    #[error("following it takes more than {MAX_HOPS} links")]
    TooManyHops,
}

/// Walks the link at `link` (relative to the folder) whose target text is
/// `target`, asking `read_link` for the target of every path met on the way
/// (`None` where that path is not a link). A component that does not exist
/// is walked as a folder: whatever might appear there later is checked too.
pub fn check(
    link: &Path,
    target: &Path,
    read_link: impl Fn(&Path) -> Option<PathBuf>,
) -> Result<(), LinkFault> {
    // The folder holding the link: every component of `link` but the last.
    let mut at: Vec<OsString> = link
        .components()
        .map(|c| c.as_os_str().to_os_string())
        .collect();
    at.pop();
    // Components still to walk, the next one last, each with the index of
    // the target text it came from (for the error).
    let mut pending: Vec<(OsString, usize)> = Vec::new();
    let mut texts: Vec<String> = Vec::new();
    let mut hops = 0;
    expand(target, &mut pending, &mut texts)?;
    while let Some((name, from)) = pending.pop() {
        if name == "." {
            continue;
        }
        if name == ".." {
            if at.pop().is_none() {
                return Err(LinkFault::ClimbsOut {
                    target: texts[from].clone(),
                });
            }
            continue;
        }
        let next: PathBuf = at.iter().chain(std::iter::once(&name)).collect();
        match read_link(&next) {
            Some(t) => {
                hops += 1;
                if hops > MAX_HOPS {
                    return Err(LinkFault::TooManyHops);
                }
                expand(&t, &mut pending, &mut texts)?;
            }
            None => at.push(name),
        }
    }
    Ok(())
}

/// Queues a target's components to be walked next; an absolute one ends the walk.
fn expand(
    target: &Path,
    pending: &mut Vec<(OsString, usize)>,
    texts: &mut Vec<String>,
) -> Result<(), LinkFault> {
    let text = target.to_string_lossy().into_owned();
    if target.has_root() {
        return Err(LinkFault::Absolute { target: text });
    }
    texts.push(text);
    let from = texts.len() - 1;
    pending.extend(
        target
            .components()
            .rev()
            .map(|c| (c.as_os_str().to_os_string(), from)),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn walk(links: &[(&str, &str)], link: &str) -> Result<(), LinkFault> {
        let map: BTreeMap<PathBuf, PathBuf> = links
            .iter()
            .map(|(l, t)| (PathBuf::from(l), PathBuf::from(t)))
            .collect();
        check(Path::new(link), &map[Path::new(link)], |p| {
            map.get(p).cloned()
        })
    }

    #[test]
    fn a_sysfs_style_link_stays_inside() {
        assert_eq!(
            walk(
                &[(
                    "sysfs/class/net/eth0",
                    "../../devices/pci0000:00/0000:00:01.0/net/eth0"
                )],
                "sysfs/class/net/eth0"
            ),
            Ok(())
        );
    }

    #[test]
    fn dot_dot_past_the_top_climbs_out() {
        assert!(matches!(
            walk(&[("sysfs/a", "../../etc")], "sysfs/a"),
            Err(LinkFault::ClimbsOut { .. })
        ));
    }

    #[test]
    fn dot_dot_after_a_link_climbs_from_its_target_not_its_place() {
        // Lexically `d/e/up/../x` is `d/e/x`; really `up` is the top, so `..` leaves it.
        let links = [("sysfs/d/e/up", "../../.."), ("sysfs/d/e/l", "up/../x")];
        assert_eq!(walk(&links, "sysfs/d/e/up"), Ok(()));
        assert_eq!(
            walk(&links, "sysfs/d/e/l"),
            Err(LinkFault::ClimbsOut {
                target: "up/../x".into()
            })
        );
    }

    #[test]
    fn an_absolute_target_anywhere_in_the_chain_is_refused() {
        let links = [("sysfs/a", "b/x"), ("sysfs/b", "/sys")];
        assert_eq!(
            walk(&links, "sysfs/a"),
            Err(LinkFault::Absolute {
                target: "/sys".into()
            })
        );
    }

    #[test]
    fn a_link_loop_is_refused_not_walked_forever() {
        let links = [("sysfs/a", "b"), ("sysfs/b", "a")];
        assert_eq!(walk(&links, "sysfs/a"), Err(LinkFault::TooManyHops));
    }

    #[test]
    fn a_missing_component_is_walked_as_a_folder() {
        assert_eq!(walk(&[("sysfs/a", "gone/../b")], "sysfs/a"), Ok(()));
        assert!(walk(&[("sysfs/a", "gone/../../..")], "sysfs/a").is_err());
    }
}
