//! The few `bpf(2)` commands aya 0.14 does not offer: for maps of maps, creating a
//! memory-mapped inner array and writing or deleting an outer entry by file descriptor; batched
//! updates, deletes and per-CPU array lookups.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use balancer_common::maps::Home;

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_GET_FD_BY_ID: libc::c_long = 14;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;
/// The kernel's internal "operation not supported" (not in libc).
const ENOTSUPP: i32 = 524;
const BPF_MAP_DELETE_BATCH: libc::c_long = 27;
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
const BPF_MAP_TYPE_ARRAY: u32 = 2;

/// `union bpf_attr` is 128+ bytes in current kernels; unused fields must be zero.
#[repr(C, align(8))]
struct Attr([u8; 128]);

impl Attr {
    fn zeroed() -> Self {
        Attr([0; 128])
    }
    fn put_u32(&mut self, offset: usize, v: u32) {
        self.0[offset..offset + 4].copy_from_slice(&v.to_ne_bytes());
    }
    fn put_u64(&mut self, offset: usize, v: u64) {
        self.0[offset..offset + 8].copy_from_slice(&v.to_ne_bytes());
    }
}

fn bpf(cmd: libc::c_long, attr: &mut Attr) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a valid, zero-initialised `bpf_attr` of the size passed.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut Attr,
            std::mem::size_of::<Attr>() as libc::c_uint,
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Creates a `BPF_MAP_TYPE_ARRAY` with `value_size`-byte values, `flags` and a name (at most
/// 15 bytes).
pub fn create_array(
    value_size: u32,
    max_entries: u32,
    flags: u32,
    name: &str,
) -> io::Result<OwnedFd> {
    let mut attr = Attr::zeroed();
    attr.put_u32(0, BPF_MAP_TYPE_ARRAY);
    attr.put_u32(4, 4); // key_size
    attr.put_u32(8, value_size);
    attr.put_u32(12, max_entries);
    attr.put_u32(16, flags);
    let name = name.as_bytes();
    let len = name.len().min(15);
    attr.0[28..28 + len].copy_from_slice(&name[..len]); // map_name[16]
    let fd = bpf(BPF_MAP_CREATE, &mut attr)?;
    // SAFETY: the kernel returned a new file descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Writes `value` at `key` in a map whose keys and values are `u32`.
pub fn update_u32(map: BorrowedFd<'_>, key: u32, value: u32) -> io::Result<()> {
    let mut attr = Attr::zeroed();
    attr.put_u32(0, map.as_raw_fd() as u32);
    attr.put_u64(8, &key as *const u32 as u64);
    attr.put_u64(16, &value as *const u32 as u64);
    attr.put_u64(24, 0); // BPF_ANY
    bpf(BPF_MAP_UPDATE_ELEM, &mut attr).map(drop)
}

/// Deletes `key` from a map with `u32` keys; a missing key is not an error.
pub fn delete_u32(map: BorrowedFd<'_>, key: u32) -> io::Result<()> {
    let mut attr = Attr::zeroed();
    attr.put_u32(0, map.as_raw_fd() as u32);
    attr.put_u64(8, &key as *const u32 as u64);
    match bpf(BPF_MAP_DELETE_ELEM, &mut attr) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        other => other.map(drop),
    }
}

/// Writes `values[i]` at `keys[i]` in a map with `u32` keys and values, in one
/// `BPF_MAP_UPDATE_BATCH` (one kernel wait for a map of maps); per element where the map type
/// has no batch operations.
pub fn update_u32_batch(map: BorrowedFd<'_>, keys: &[u32], values: &[u32]) -> io::Result<()> {
    assert_eq!(keys.len(), values.len());
    if keys.is_empty() {
        return Ok(());
    }
    let mut attr = Attr::zeroed();
    attr.put_u64(16, keys.as_ptr() as u64);
    attr.put_u64(24, values.as_ptr() as u64);
    attr.put_u32(32, keys.len() as u32);
    attr.put_u32(36, map.as_raw_fd() as u32);
    match bpf(BPF_MAP_UPDATE_BATCH, &mut attr) {
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EINVAL | libc::EOPNOTSUPP | ENOTSUPP)
            ) =>
        {
            for (k, v) in keys.iter().zip(values) {
                update_u32(map, *k, *v)?;
            }
            Ok(())
        }
        other => other.map(drop),
    }
}

/// Deletes `keys` from a map with `u32` keys in one `BPF_MAP_DELETE_BATCH` (per element where
/// unsupported); missing keys are not an error.
pub fn delete_u32_batch(map: BorrowedFd<'_>, keys: &[u32]) -> io::Result<()> {
    if keys.is_empty() {
        return Ok(());
    }
    let mut attr = Attr::zeroed();
    attr.put_u64(16, keys.as_ptr() as u64);
    attr.put_u32(32, keys.len() as u32);
    attr.put_u32(36, map.as_raw_fd() as u32);
    match bpf(BPF_MAP_DELETE_BATCH, &mut attr) {
        Ok(_) => Ok(()),
        // A batch stops at the first missing key; finish one by one.
        Err(_) => {
            for k in keys {
                delete_u32(map, *k)?;
            }
            Ok(())
        }
    }
}

/// Reads the first `count` entries of a per-CPU array in one `BPF_MAP_LOOKUP_BATCH`: for each
/// key in order, `cpus` copies of its value, each `value_size` bytes rounded up to 8 (the
/// kernel's layout). `Ok(None)` where the kernel has no batch lookups for the map.
pub fn lookup_percpu_batch(
    map: BorrowedFd<'_>,
    count: u32,
    value_size: usize,
    cpus: usize,
) -> io::Result<Option<Vec<u8>>> {
    let stride = value_size.next_multiple_of(8);
    let mut keys = vec![0u32; count as usize];
    let mut values = vec![0u8; count as usize * cpus * stride];
    let mut out_batch = 0u32;
    let mut attr = Attr::zeroed();
    attr.put_u64(0, 0); // in_batch: NULL, from the first key
    attr.put_u64(8, &mut out_batch as *mut u32 as u64);
    attr.put_u64(16, keys.as_mut_ptr() as u64);
    attr.put_u64(24, values.as_mut_ptr() as u64);
    attr.put_u32(32, count);
    attr.put_u32(36, map.as_raw_fd() as u32);
    let read = match bpf(BPF_MAP_LOOKUP_BATCH, &mut attr) {
        Ok(_) => count,
        // The end of the map reached: `count` says how many were read.
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
            u32::from_ne_bytes(attr.0[32..36].try_into().expect("4 bytes"))
        }
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EINVAL | libc::EOPNOTSUPP | ENOTSUPP)
            ) =>
        {
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    // An array's batch starts at key 0 and goes in order; anything else is not this layout.
    if read != count || keys.iter().enumerate().any(|(i, k)| *k as usize != i) {
        return Ok(None);
    }
    Ok(Some(values))
}

/// Fills a memory-mappable array from `values` through a shared mapping made for this fill.
pub fn fill_mmapable<T: Copy>(map: BorrowedFd<'_>, values: &[T]) -> io::Result<()> {
    WritableArray::map(map, values.len())?.fill(values);
    Ok(())
}

/// A shared mapping of `count` values of `T` of a BPF_F_MMAPABLE array: whole pages, values
/// `size_of::<T>()` rounded up to 8 bytes apart, as the kernel lays array elements out;
/// unmapped when dropped. What `&self` allows is the wrappers' to decide ([`MappedArray`]
/// reads, [`WritableArray`] writes through `&mut self`).
struct SharedMapping<T: Copy> {
    base: *mut u8,
    /// Bytes mapped (whole pages).
    mapped_bytes: usize,
    count: usize,
    _values: std::marker::PhantomData<T>,
}

// SAFETY: the mapping is owned by this value and outlives the descriptor; nothing is reachable
// through it but the pointer to value `i` (`slot`), used by the wrappers as said above.
unsafe impl<T: Copy> Send for SharedMapping<T> {}
// SAFETY: as above.
unsafe impl<T: Copy> Sync for SharedMapping<T> {}

impl<T: Copy> SharedMapping<T> {
    const STRIDE: usize = std::mem::size_of::<T>().next_multiple_of(8);

    /// Maps `count` values of `map` with protection `prot`.
    fn map(map: BorrowedFd<'_>, count: usize, prot: i32) -> io::Result<SharedMapping<T>> {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let len = (count * Self::STRIDE).div_ceil(page).max(1) * page;
        // SAFETY: a new mapping of `len` bytes of the map's values, which the kernel checks
        // against the map's size; nothing else is touched.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                map.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(SharedMapping {
            base: ptr.cast::<u8>(),
            mapped_bytes: len,
            count,
            _values: std::marker::PhantomData,
        })
    }

    /// Where value `i` lies (panics past the mapped values).
    fn slot(&self, i: usize) -> *mut T {
        assert!(i < self.count, "index {i} of {}", self.count);
        // SAFETY: within the mapping (checked above).
        unsafe { self.slot_unchecked(i) }
    }

    /// Where value `i` lies, for a caller that checked `i < count` itself (once for many).
    ///
    /// # Safety
    /// `i` must be below the mapping's `count`.
    unsafe fn slot_unchecked(&self, i: usize) -> *mut T {
        // SAFETY: `i < count` (the caller's promise): within the mapping.
        unsafe { self.base.add(i * Self::STRIDE).cast::<T>() }
    }
}

impl<T: Copy> Drop for SharedMapping<T> {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once.
        unsafe { libc::munmap(self.base.cast(), self.mapped_bytes) };
    }
}

/// Session persistence's [`Home`] per backend id, mapped: the clients homed, which the data
/// plane adds to atomically, read and aged in place with atomic operations; the capacities,
/// written whole.
pub struct SharedHomes(SharedMapping<Home>);

impl SharedHomes {
    /// Maps `count` entries of the BPF_F_MMAPABLE array `map` (the mapping outlives the
    /// descriptor).
    pub fn map(map: BorrowedFd<'_>, count: usize) -> io::Result<SharedHomes> {
        SharedMapping::map(map, count, libc::PROT_READ | libc::PROT_WRITE).map(SharedHomes)
    }

    pub fn len(&self) -> usize {
        self.0.count
    }

    fn homed_counter(&self, i: usize) -> &std::sync::atomic::AtomicU64 {
        // SAFETY: entry `i` of the mapping (`slot` checks the index); `homed` is its first
        // field, 8-byte aligned (entries 16 bytes apart from a page boundary), changed by the
        // kernel with atomic adds only.
        unsafe { std::sync::atomic::AtomicU64::from_ptr(&raw mut (*self.0.slot(i)).homed) }
    }

    fn capacity_slot(&self, i: usize) -> &std::sync::atomic::AtomicU32 {
        // SAFETY: as above; `capacity` is 4-byte aligned.
        unsafe { std::sync::atomic::AtomicU32::from_ptr(&raw mut (*self.0.slot(i)).capacity) }
    }

    /// Entry `i`'s clients homed.
    pub fn homed(&self, i: usize) -> u64 {
        self.homed_counter(i)
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Replaces entry `i`'s clients homed with `f` of them, atomically against the data
    /// plane's adds.
    pub fn update_homed(&self, i: usize, f: impl Fn(u64) -> u64) {
        // (Unchanged, nothing is written: most entries of VIPs without persistence stay 0.)
        let _ = self.homed_counter(i).fetch_update(
            std::sync::atomic::Ordering::Relaxed,
            std::sync::atomic::Ordering::Relaxed,
            |v| Some(f(v)).filter(|n| *n != v),
        );
    }

    /// Entry `i`'s capacity.
    pub fn capacity(&self, i: usize) -> u32 {
        self.capacity_slot(i)
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn set_capacity(&self, i: usize, capacity: u32) {
        self.capacity_slot(i)
            .store(capacity, std::sync::atomic::Ordering::Relaxed);
    }

    /// Zeroes entry `i` (an id going to a new backend).
    pub fn clear(&self, i: usize) {
        self.homed_counter(i)
            .store(0, std::sync::atomic::Ordering::Relaxed);
        self.set_capacity(i, 0);
    }
}

/// A shared writable mapping of a memory-mappable array, kept for repeated fills (a table
/// refilled in place costs no mapping, no page faults and no new map).
pub struct WritableArray<T: Copy>(SharedMapping<T>);

impl<T: Copy> WritableArray<T> {
    /// Maps `count` values of the BPF_F_MMAPABLE array `map` for writing (the mapping
    /// outlives the descriptor).
    pub fn map(map: BorrowedFd<'_>, count: usize) -> io::Result<WritableArray<T>> {
        SharedMapping::map(map, count, libc::PROT_READ | libc::PROT_WRITE).map(WritableArray)
    }

    pub fn len(&self) -> usize {
        self.0.count
    }

    /// Writes `values` from the first element on (at most [`WritableArray::len`] of them).
    pub fn fill(&mut self, values: &[T]) {
        assert!(
            values.len() <= self.0.count,
            "{} values for {}",
            values.len(),
            self.0.count
        );
        // Checked once above, not per value: a table of 65,537 slots is written in a plain
        // strided loop.
        for (i, v) in values.iter().enumerate() {
            // SAFETY: value `i` < `count` of the mapping (checked above), written whole.
            unsafe { self.0.slot_unchecked(i).write_unaligned(*v) };
        }
    }
}

/// Reads the `u32` value at `key` (for a map of maps: the inner map's id).
pub fn lookup_u32(map: BorrowedFd<'_>, key: u32) -> io::Result<u32> {
    let mut value = 0u32;
    let mut attr = Attr::zeroed();
    attr.put_u32(0, map.as_raw_fd() as u32);
    attr.put_u64(8, &key as *const u32 as u64);
    attr.put_u64(16, &mut value as *mut u32 as u64);
    bpf(BPF_MAP_LOOKUP_ELEM, &mut attr)?;
    Ok(value)
}

/// Opens a map by id.
pub fn map_fd_by_id(id: u32) -> io::Result<OwnedFd> {
    let mut attr = Attr::zeroed();
    attr.put_u32(0, id);
    let fd = bpf(BPF_MAP_GET_FD_BY_ID, &mut attr)?;
    // SAFETY: the kernel returned a new file descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Reads `count` values of a memory-mappable array through a shared read-only mapping
/// (mapped for this read only).
pub fn read_mmapable<T: Copy>(map: BorrowedFd<'_>, count: usize) -> io::Result<Vec<T>> {
    let mapped = MappedArray::<T>::map(map, count)?;
    Ok((0..count).map(|i| mapped.get(i)).collect())
}

/// A shared read-only mapping of a memory-mappable array, kept for repeated reads: mapped
/// once, its pages stay in the page tables, so a read costs no mapping and no page faults (a
/// 32 MiB connection table mapped afresh each second costs thousands of faults), and values
/// are read in place, not copied out. Values may change under the reader (the XDP program
/// writes them): each is read whole but the set is not a snapshot.
pub struct MappedArray<T: Copy>(SharedMapping<T>);

impl<T: Copy> MappedArray<T> {
    /// Maps `count` values of the BPF_F_MMAPABLE array `map` (the mapping outlives the
    /// descriptor).
    pub fn map(map: BorrowedFd<'_>, count: usize) -> io::Result<MappedArray<T>> {
        SharedMapping::map(map, count, libc::PROT_READ).map(MappedArray)
    }

    pub fn len(&self) -> usize {
        self.0.count
    }

    /// Value `i` as it is now (the kernel lays values out 8-byte aligned).
    pub fn get(&self, i: usize) -> T {
        // SAFETY: a value of the mapping, read whole, as the kernel writes.
        unsafe { self.0.slot(i).read_unaligned() }
    }
}

/// Eight random bytes from the kernel.
pub fn random_u64() -> u64 {
    let mut v = 0u64;
    // SAFETY: getrandom fills the 8 bytes of `v`.
    let n = unsafe { libc::getrandom((&mut v as *mut u64).cast(), 8, 0) };
    if n != 8 {
        // No entropy source: fall back to the clock (the seed only spreads buckets).
        v = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0x5eed);
    }
    v
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;
    use std::os::unix::fs::FileExt as _;

    use super::*;

    /// A file in memory of `bytes` bytes, as a stand-in for a map's values (the mapping
    /// code maps any descriptor; no BPF, so no root).
    fn memory_file(bytes: usize) -> std::fs::File {
        // SAFETY: a new descriptor from a NUL-terminated name; owned by the File.
        let fd = unsafe { libc::memfd_create(c"fill_test".as_ptr(), 0) };
        assert!(fd >= 0, "memfd_create: {}", io::Error::last_os_error());
        // SAFETY: the kernel returned a new file descriptor that nothing else owns.
        let file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        file.set_len(bytes as u64).unwrap();
        file
    }

    /// The `u32` at each 8-byte stride of the file, as the kernel lays a `u32` array out.
    fn values_at_the_kernel_stride(file: &std::fs::File, count: usize) -> Vec<u32> {
        let mut bytes = vec![0; count * 8];
        file.read_exact_at(&mut bytes, 0).unwrap();
        (0..count)
            .map(|i| u32::from_ne_bytes(bytes[i * 8..i * 8 + 4].try_into().unwrap()))
            .collect()
    }

    #[test]
    fn a_fill_writes_each_value_at_the_kernel_stride_and_refills_in_place() {
        // A prime count whose values span several pages.
        let count: usize = 4_099;
        let file = memory_file((count * 8).next_multiple_of(4096));
        let mut table = WritableArray::<u32>::map(file.as_fd(), count).unwrap();
        assert_eq!(table.len(), count);
        let first: Vec<u32> = (0..count as u32).map(|i| i * 7 + 1).collect();
        table.fill(&first);
        assert_eq!(values_at_the_kernel_stride(&file, count), first);
        // Fewer values refill the front and leave the rest.
        let second: Vec<u32> = (0..100).map(|i| 1_000_000 + i).collect();
        table.fill(&second);
        let read = values_at_the_kernel_stride(&file, count);
        assert_eq!(read[..100], second[..]);
        assert_eq!(read[100..], first[100..]);
    }

    #[test]
    #[should_panic(expected = "4100 values for 4099")]
    fn more_values_than_the_mapping_holds_are_refused() {
        let file = memory_file(4_099 * 8);
        let mut table = WritableArray::<u32>::map(file.as_fd(), 4_099).unwrap();
        table.fill(&vec![1; 4_100]);
    }
}
