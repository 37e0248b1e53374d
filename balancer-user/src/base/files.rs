//! Files the daemon writes (its config, its state, BIRD's route files) and secrets it reads
//! (token and password files).
//!
//! A write goes through a new temporary file beside the target (a unique name opened with
//! `O_CREAT | O_EXCL | O_NOFOLLOW`, so no file or link planted there is followed), is synced,
//! takes the original's mode and owner, and is renamed over the target; the directory is then
//! synced. A crash leaves the old file or the new one, never a mix, and a 0640 config stays
//! 0640 whatever the daemon's umask.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The mode of a file written where none was.
const NEW_FILE_MODE: u32 = 0o644;

/// Writes `contents` to `path` atomically, keeping the mode and owner of the file it replaces.
pub fn write_atomically(path: &Path, contents: &[u8]) -> io::Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&dir)?;
    let original = fs::metadata(path).ok();
    let mode = original
        .as_ref()
        .map_or(NEW_FILE_MODE, |m| m.permissions().mode() & 0o7777);
    let (tmp, mut file) = create_temporary(&dir, path, mode)?;
    let written = (|| {
        file.write_all(contents)?;
        // The mode exactly (the open's was masked by the umask), then the owner.
        file.set_permissions(fs::Permissions::from_mode(mode))?;
        if let Some(m) = &original {
            let here = file.metadata()?;
            if (here.uid(), here.gid()) != (m.uid(), m.gid()) {
                std::os::unix::fs::fchown(&file, Some(m.uid()), Some(m.gid()))?;
            }
        }
        file.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written?;
    File::open(&dir)?.sync_all()
}

/// A new file in `dir` named after `target`, unique to this process and call.
fn create_temporary(dir: &Path, target: &Path, mode: u32) -> io::Result<(PathBuf, File)> {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "file".into());
    loop {
        let call = CALLS.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!(".{name}.{}.{call}.tmp", std::process::id()));
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)
        {
            Ok(file) => return Ok((tmp, file)),
            // Left by a process of the same id before: take the next name.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Reads a secret (a token or a password file), warning once per file when other users may
/// read it. The secret itself is never logged.
pub fn read_secret(path: &Path) -> io::Result<String> {
    let text = fs::read_to_string(path)?;
    if let Ok(meta) = fs::metadata(path)
        && meta.permissions().mode() & 0o004 != 0
    {
        static WARNED: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());
        let mut warned = WARNED.lock().unwrap_or_else(|p| p.into_inner());
        if !warned.iter().any(|p| p == path) {
            tracing::warn!(
                file = %path.display(),
                mode = format!("{:04o}", meta.permissions().mode() & 0o7777),
                "a secret file is readable by every user: chmod o-r (0600 or 0640)"
            );
            warned.push(path.to_path_buf());
        }
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("balancer-files-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn a_rewrite_keeps_the_mode_and_leaves_no_temporary() {
        let d = dir("mode");
        let config = d.join("balancer.toml");
        fs::write(&config, "old").unwrap();
        fs::set_permissions(&config, fs::Permissions::from_mode(0o640)).unwrap();
        write_atomically(&config, b"new").unwrap();
        assert_eq!(fs::read_to_string(&config).unwrap(), "new");
        assert_eq!(mode(&config), 0o640);
        // A new file: 0644 (less the umask).
        let state = d.join("sub/state.json");
        write_atomically(&state, b"{}").unwrap();
        assert_eq!(mode(&state) & !0o022, 0o644 & !0o022);
        let left: Vec<_> = fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n.to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn links_planted_beside_the_target_are_not_followed() {
        let d = dir("links");
        let victim = d.join("victim");
        fs::write(&victim, "untouched").unwrap();
        let config = d.join("balancer.toml");
        // The fixed temporary name of before, and every name this process could try next.
        std::os::unix::fs::symlink(&victim, d.join("balancer.tmp")).unwrap();
        for call in 0..64 {
            let name = format!(".balancer.toml.{}.{call}.tmp", std::process::id());
            let _ = std::os::unix::fs::symlink(&victim, d.join(name));
        }
        write_atomically(&config, b"new").unwrap();
        assert_eq!(fs::read_to_string(&victim).unwrap(), "untouched");
        assert_eq!(fs::read_to_string(&config).unwrap(), "new");
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn secrets_are_read_whatever_their_mode() {
        let d = dir("secret");
        let token = d.join("token");
        fs::write(&token, "abc\n").unwrap();
        fs::set_permissions(&token, fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(read_secret(&token).unwrap(), "abc\n");
        fs::set_permissions(&token, fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_secret(&token).unwrap(), "abc\n");
        fs::remove_dir_all(&d).unwrap();
    }
}
