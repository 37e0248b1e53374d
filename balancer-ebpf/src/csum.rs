//! Internet checksums (RFC 1071) over fixed-size headers, unrolled for the verifier.

use crate::headers::Ipv4Hdr;

/// Folds a 64-bit one's-complement sum to 16 bits.
#[inline(always)]
pub fn fold(mut sum: u64) -> u16 {
    sum = (sum & 0xffff_ffff) + (sum >> 32);
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    sum as u16
}

/// One's-complement sum of `N` 16-bit words read from `words` (in memory order).
///
/// # Safety
/// `words` must point at `2 * N` readable bytes.
#[inline(always)]
pub unsafe fn sum_words<const N: usize>(words: *const u16) -> u64 {
    let mut sum = 0u64;
    let mut i = 0;
    while i < N {
        // SAFETY: the caller guarantees `2 * N` readable bytes.
        sum += u64::from(unsafe { words.add(i).read_unaligned() });
        i += 1;
    }
    sum
}

/// The checksum of an IPv4 header without options whose `check` field is zero.
#[inline(always)]
pub fn ipv4_header(h: &Ipv4Hdr) -> u16 {
    // SAFETY: an `Ipv4Hdr` is 20 bytes = 10 words.
    !fold(unsafe { sum_words::<10>((h as *const Ipv4Hdr).cast()) })
}

/// Sum of the words of an address as stored in the packet.
#[inline(always)]
pub fn sum_addr(words: &[u32; 4]) -> u64 {
    let mut sum = 0u64;
    for w in words {
        sum += u64::from(*w & 0xffff) + u64::from(*w >> 16);
    }
    sum
}

/// What the first `N` 32-bit words of an address changing from `old` to `new` (both as stored
/// in the packet) add to a one's-complement sum: RFC 1624's `~m + m'`, to [`apply`] once for
/// every field a translation changes.
#[inline(always)]
pub fn addr_delta<const N: usize>(old: &[u32; 4], new: &[u32; 4]) -> u64 {
    let mut sum = 0u64;
    let mut i = 0;
    while i < N {
        let gone = !old[i];
        sum += u64::from(gone & 0xffff) + u64::from(gone >> 16);
        sum += u64::from(new[i] & 0xffff) + u64::from(new[i] >> 16);
        i += 1;
    }
    sum
}

/// What one 16-bit word (a port, as stored) changing from `old` to `new` adds to a sum.
#[inline(always)]
pub fn word_delta(old: u16, new: u16) -> u64 {
    u64::from(!old) + u64::from(new)
}

/// A checksum (as stored) after the changes summed in `delta`: RFC 1624's `~(~C + delta)`.
#[inline(always)]
pub fn apply(check: u16, delta: u64) -> u16 {
    !fold(u64::from(!check) + delta)
}

/// A checksum (as stored) after the first `N` 32-bit words of an address changed from `old`
/// to `new` (both as stored in the packet): RFC 1624's incremental update, `~(~C + ~m + m')`.
#[inline(always)]
pub fn replace_addr<const N: usize>(check: u16, old: &[u32; 4], new: &[u32; 4]) -> u16 {
    apply(check, addr_delta::<N>(old, new))
}

/// A checksum (as stored) after one 16-bit word (a port, as stored) changed from `old` to
/// `new`: RFC 1624's `~(~C + ~m + m')`.
#[inline(always)]
pub fn replace_word(check: u16, old: u16, new: u16) -> u16 {
    apply(check, word_delta(old, new))
}
