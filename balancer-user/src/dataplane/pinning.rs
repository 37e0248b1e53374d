//! The daemon's pinned state under bpffs: the maps, the program and its XDP links (one on the
//! clients' interface, one on the NAT backends' when `[nat] interface` is set). Pinned, they
//! outlive the daemon, so forwarding and the connection table survive a restart (or a
//! SIGKILL); a restarted daemon adopts them instead of loading afresh. The bookkeeping that
//! goes with them (which VIP and backend has which id) is a JSON state file beside them
//! (bpffs holds only BPF objects).

use std::io;
use std::path::{Path, PathBuf};

use balancer_common::maps::PINNED_MAPS;

/// Names of the pinned links on the NAT backends' interface begin so.
const NAT_LINK_PREFIX: &str = "link-nat-";

/// `statfs` magic of the BPF filesystem.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// Where one daemon's objects are pinned.
#[derive(Clone, Debug)]
pub struct Pins {
    dir: PathBuf,
}

impl Pins {
    pub fn new(dir: impl Into<PathBuf>) -> Pins {
        Pins { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn map(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    pub fn program(&self) -> PathBuf {
        self.dir.join("prog")
    }

    pub fn link(&self) -> PathBuf {
        self.dir.join("link")
    }

    /// The link on the NAT backends' interface `interface` (`[nat] interface`); bpffs takes
    /// no dots in names, so a VLAN's `eth0.100` is pinned as `link-nat-eth0_100`.
    pub fn nat_link(&self, interface: &str) -> PathBuf {
        self.dir
            .join(format!("{NAT_LINK_PREFIX}{}", interface.replace('.', "_")))
    }

    /// The NAT backends' links pinned here (one, unless the config named another interface
    /// since).
    pub fn nat_links(&self) -> io::Result<Vec<PathBuf>> {
        let mut links = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            if entry
                .file_name()
                .to_string_lossy()
                .starts_with(NAT_LINK_PREFIX)
            {
                links.push(entry.path());
            }
        }
        links.sort();
        Ok(links)
    }

    /// Whether an earlier daemon left a pinned, attached program here.
    pub fn has_link(&self) -> bool {
        self.link().exists()
    }

    /// Checks that the directory can be on bpffs and creates it.
    pub fn prepare(&self) -> io::Result<()> {
        std::fs::create_dir_all(&self.dir).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "{e}: pin directories live on a BPF filesystem (mount -t bpf bpf /sys/fs/bpf); \
                     note that `ip netns exec` remounts /sys, hiding /sys/fs/bpf"
                ),
            )
        })?;
        if !is_bpffs(&self.dir)? {
            return Err(io::Error::other(format!(
                "{} is not on a BPF filesystem (mount -t bpf bpf /sys/fs/bpf)",
                self.dir.display()
            )));
        }
        Ok(())
    }

    /// Unpins everything: the link (which detaches the program once nothing else holds it),
    /// the program and the maps (freed once unused), then the directory.
    pub fn remove(&self) -> io::Result<()> {
        let mut names: Vec<PathBuf> = vec![self.link()];
        match self.nat_links() {
            Ok(links) => names.extend(links),
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            Err(_) => {}
        }
        names.push(self.program());
        names.extend(PINNED_MAPS.iter().map(|m| self.map(m)));
        for path in names {
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        match std::fs::remove_dir(&self.dir) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

/// Whether `path` lies on a BPF filesystem.
pub fn is_bpffs(path: &Path) -> io::Result<bool> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    // SAFETY: statfs on a valid C string into a zeroed struct.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut stat) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(stat.f_type as i64 == BPF_FS_MAGIC)
}
