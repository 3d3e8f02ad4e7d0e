//! Freeing the space of deleted files a little at a time.
//!
//! Removing a large file frees all its blocks at once, and on a disk that discards freed
//! blocks (the `discard` mount option) that is one long burst of device work: unlinking a
//! 2 GiB journal file was seen to take 300 ms here, and the journal's fdatasyncs queued
//! behind it for as long, stalling every add. [`remove`] unlinks the name at once (the open
//! handle keeps the blocks allocated, so this is quick), and a background thread then
//! shrinks the file [`STEP`] at a time, resting between steps [`REST`] times as long as each
//! step took, so this takes at most a fifth of the device's time, and a journal write
//! waits behind at most one small step. The space is free once
//! the last step is done; a crash before that leaves an orphaned inode that the file
//! system reclaims.

use std::fs::{self, File};
use std::path::Path;
use std::sync::OnceLock;
use std::time::Instant;

/// Bytes freed per step.
pub const STEP: u64 = 4 << 20;
/// Rest after each step, as a multiple of the time the step took.
const REST: u32 = 4;

static REAPER: OnceLock<crossbeam_channel::Sender<File>> = OnceLock::new();

fn reaper() -> &'static crossbeam_channel::Sender<File> {
    REAPER.get_or_init(|| {
        let (tx, rx) = crossbeam_channel::unbounded::<File>();
        let spawned = std::thread::Builder::new()
            .name("bookie-reaper".into())
            .spawn(move || {
                for file in rx {
                    shrink(&file);
                }
            });
        if let Err(e) = spawned {
            log::warn!("cannot start the reaper thread ({e}); deleted files are freed at once");
        }
        tx
    })
}

/// Shrink `file` to nothing, one [`STEP`] at a time. Errors end it early: the blocks left
/// are freed when the handle is dropped.
fn shrink(file: &File) {
    let Ok(mut len) = file.metadata().map(|m| m.len()) else {
        return;
    };
    while len > 0 {
        len = len.saturating_sub(STEP);
        let started = Instant::now();
        if let Err(e) = file.set_len(len) {
            log::warn!("shrinking a deleted file: {e}");
            return;
        }
        std::thread::sleep(started.elapsed() * REST);
    }
}

/// Remove `path`: its name now, its blocks in the background (see the module docs). A
/// missing file is an error of kind `NotFound`, as with [`fs::remove_file`].
pub fn remove(path: &Path) -> std::io::Result<()> {
    let file = File::options().write(true).open(path);
    fs::remove_file(path)?;
    match file {
        // The reaper thread ends only with the process, so a failed send cannot happen;
        // if it did, the handle is dropped here and the blocks freed at once.
        Ok(file) if file.metadata().is_ok_and(|m| m.len() > STEP) => {
            let _ = reaper().send(file);
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_name_goes_at_once_and_the_blocks_step_by_step() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("big.log");
        let file = File::create(&path).expect("create");
        file.set_len(3 * STEP + 5).expect("size");
        remove(&path).expect("remove");
        assert!(!path.exists());
        // The test's own handle sees the same inode shrink to nothing.
        let deadline = Instant::now() + Duration::from_secs(10);
        while file.metadata().expect("meta").len() > 0 {
            assert!(Instant::now() < deadline, "the deleted file was never shrunk");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn a_missing_file_is_not_found() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = remove(&dir.path().join("absent")).expect_err("missing");
        assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
    }
}
