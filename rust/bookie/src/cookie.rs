//! Which directories make up one bookie: the cookie, as BookKeeper calls it.
//!
//! A bookie whose journal and ledgers live in different directories (`journalDirectory`,
//! `ledgerDirectories`) must never start on a mismatched set: replaying one bookie's journal
//! into another's ledgers, or starting without a ledger directory that holds acknowledged
//! entries, would return wrong data or lose it. So the first start writes a `COOKIE` file
//! into every directory, naming a random instance id and how many directories the bookie
//! has; every later start reads them back and refuses, with the reason, a directory that
//! has no cookie while others do, one of another instance, or a count that changed. Paths
//! are not compared: a disk mounted elsewhere is still the same bookie's.

use std::collections::hash_map::RandomState;
use std::fs;
use std::hash::{BuildHasher, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::BookieError;
use crate::journal::sync_dir;

pub const COOKIE_FILE: &str = "COOKIE";
const HEADER: &str = "magnetar-bookie-cookie 1";

/// What a cookie says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cookie {
    pub instance: String,
    pub directories: usize,
}

impl Cookie {
    fn encode(&self) -> String {
        format!("{HEADER}\ninstance {}\ndirectories {}\n", self.instance, self.directories)
    }

    fn decode(text: &str) -> Option<Cookie> {
        let mut lines = text.lines();
        if lines.next()? != HEADER {
            return None;
        }
        let instance = lines.next()?.strip_prefix("instance ")?.to_string();
        let directories = lines.next()?.strip_prefix("directories ")?.parse().ok()?;
        Some(Cookie { instance, directories })
    }
}

/// The cookie in `dir`, if it has one.
pub fn read(dir: &Path) -> Result<Option<Cookie>, BookieError> {
    let path = dir.join(COOKIE_FILE);
    match fs::read_to_string(&path) {
        Ok(text) => Cookie::decode(&text)
            .map(Some)
            .ok_or_else(|| BookieError::Config(format!("{} is not a bookie cookie", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(BookieError::io("read cookie", &path, e)),
    }
}

fn write(dir: &Path, cookie: &Cookie) -> Result<(), BookieError> {
    let tmp = dir.join(format!("{COOKIE_FILE}.tmp"));
    let path = dir.join(COOKIE_FILE);
    let mut f = fs::File::create(&tmp).map_err(|e| BookieError::io("create cookie", &tmp, e))?;
    f.write_all(cookie.encode().as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| BookieError::io("write cookie", &tmp, e))?;
    fs::rename(&tmp, &path).map_err(|e| BookieError::io("rename cookie", &path, e))?;
    sync_dir(dir)
}

fn new_instance() -> String {
    let mut h = RandomState::new().build_hasher();
    h.write_u128(SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    h.write_u32(std::process::id());
    format!("{:016x}", h.finish())
}

/// Check that `dirs` (every directory of one bookie, each once) carry the cookie of one
/// instance with that many directories; on a first start (none has a cookie), give them
/// one. Returns the instance id.
pub fn check_or_create(dirs: &[PathBuf]) -> Result<String, BookieError> {
    let found = dirs
        .iter()
        .map(|d| read(d).map(|c| (d, c)))
        .collect::<Result<Vec<_>, _>>()?;
    let Some((first_dir, first)) = found.iter().find_map(|(d, c)| c.as_ref().map(|c| (*d, c))) else {
        let cookie = Cookie { instance: new_instance(), directories: dirs.len() };
        for d in dirs {
            write(d, &cookie)?;
        }
        return Ok(cookie.instance);
    };
    let mismatch = |what: String| {
        BookieError::Config(format!(
            "cookie mismatch: {what}. The bookie's directories (journalDirectory, \
             ledgerDirectories) are not the set it was created with; restore that set"
        ))
    };
    for (dir, cookie) in &found {
        match cookie {
            None => {
                return Err(mismatch(format!(
                    "{} has no cookie, while {} belongs to bookie instance {}",
                    dir.display(),
                    first_dir.display(),
                    first.instance
                )))
            }
            Some(c) if c.instance != first.instance => {
                return Err(mismatch(format!(
                    "{} belongs to bookie instance {}, {} to instance {}",
                    dir.display(),
                    c.instance,
                    first_dir.display(),
                    first.instance
                )))
            }
            Some(_) => {}
        }
    }
    if first.directories != dirs.len() {
        return Err(mismatch(format!(
            "bookie instance {} was created with {} directories, {} are configured",
            first.instance,
            first.directories,
            dirs.len()
        )));
    }
    Ok(first.instance.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dirs(root: &Path, names: &[&str]) -> Vec<PathBuf> {
        names
            .iter()
            .map(|n| {
                let d = root.join(n);
                fs::create_dir_all(&d).expect("mkdir");
                d
            })
            .collect()
    }

    #[test]
    fn a_first_start_writes_one_cookie_that_later_starts_accept() {
        let t = tempfile::tempdir().expect("tmp");
        let set = dirs(t.path(), &["j", "l1", "l2"]);
        let id = check_or_create(&set).expect("first start");
        for d in &set {
            assert_eq!(read(d).expect("read"), Some(Cookie { instance: id.clone(), directories: 3 }));
        }
        assert_eq!(check_or_create(&set).expect("restart"), id);
        // Reordered (or remounted) directories are the same bookie.
        let reordered = vec![set[0].clone(), set[2].clone(), set[1].clone()];
        assert_eq!(check_or_create(&reordered).expect("reordered"), id);
    }

    #[test]
    fn a_changed_set_of_directories_is_refused_with_the_reason() {
        let t = tempfile::tempdir().expect("tmp");
        let set = dirs(t.path(), &["j", "l1", "l2"]);
        check_or_create(&set).expect("first start");

        let fresh = dirs(t.path(), &["l3"]).remove(0);
        let added = vec![set[0].clone(), set[1].clone(), fresh.clone()];
        let err = check_or_create(&added).expect_err("a fresh directory in place of l2").to_string();
        assert!(err.contains("cookie mismatch") && err.contains("l3 has no cookie"), "{err}");
        assert_eq!(read(&fresh).expect("read"), None, "nothing written on a refusal");

        let dropped = vec![set[0].clone(), set[1].clone()];
        let err = check_or_create(&dropped).expect_err("l2 left out").to_string();
        assert!(err.contains("created with 3 directories, 2 are configured"), "{err}");

        let other = dirs(t.path(), &["other-j"]);
        check_or_create(&other).expect("another bookie");
        let swapped = vec![other[0].clone(), set[1].clone(), set[2].clone()];
        let err = check_or_create(&swapped).expect_err("another bookie's journal").to_string();
        assert!(err.contains("belongs to bookie instance"), "{err}");
    }

    #[test]
    fn a_damaged_cookie_is_an_error_not_a_fresh_start() {
        let t = tempfile::tempdir().expect("tmp");
        let set = dirs(t.path(), &["j"]);
        fs::write(set[0].join(COOKIE_FILE), b"garbage").expect("write");
        let err = check_or_create(&set).expect_err("damaged").to_string();
        assert!(err.contains("is not a bookie cookie"), "{err}");
    }
}
