//! Cache hints: ask the CPU to bring a line in before it is used. Hints
//! only: they read and write nothing the program can observe, never fault
//! whatever the address, and are no-ops off x86-64 and under Miri.

/// Brings the line at `p` in for reading (the worker, a few entries ahead
/// of the one it fires).
#[inline(always)]
pub(crate) fn read<T>(p: *const T) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: a prefetch is a hint (see the module docs); SSE, which it
    // needs, is part of x86-64.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>());
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    let _ = p;
}

/// Brings the line at `p` in owned, ready to be written (`PREFETCHW`; a
/// producer, a few slots ahead of the one it fills): without it, the
/// slot's stores miss, and the next locked instruction (the handle's drop,
/// an `Arc` clone in the caller's task) waits for them. On a CPU without
/// the instruction (`CPUID` says, read once) nothing is done.
#[inline(always)]
pub(crate) fn write<T>(p: *const T) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if has_prefetchw() {
        // SAFETY: a prefetch is a hint (see the module docs), and the CPU
        // has this one.
        unsafe {
            std::arch::asm!(
                "prefetchw byte ptr [{0}]",
                in(reg) p,
                options(nostack, preserves_flags, readonly)
            );
        }
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    let _ = p;
}

/// Whether the CPU has `PREFETCHW` (CPUID 8000_0001h, ECX bit 8), asked
/// once per process.
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[inline(always)]
fn has_prefetchw() -> bool {
    use std::sync::atomic::{AtomicU8, Ordering};
    /// 0: not asked yet; 1: no; 2: yes.
    static PREFETCHW: AtomicU8 = AtomicU8::new(0);
    match PREFETCHW.load(Ordering::Relaxed) {
        2 => true,
        1 => false,
        _ => {
            // `__cpuid` is safe from Rust 1.89 on, unsafe before (the MSRV
            // is 1.88). SAFETY: CPUID exists on every x86-64 CPU.
            #[allow(unused_unsafe)]
            let ext = unsafe { std::arch::x86_64::__cpuid(0x8000_0000) };
            let yes = ext.eax >= 0x8000_0001 && {
                // SAFETY: as above; the leaf exists (checked just before).
                #[allow(unused_unsafe)]
                let leaf = unsafe { std::arch::x86_64::__cpuid(0x8000_0001) };
                leaf.ecx & (1 << 8) != 0
            };
            PREFETCHW.store(if yes { 2 } else { 1 }, Ordering::Relaxed);
            yes
        }
    }
}

#[cfg(all(test, not(redwheel_loom)))]
mod tests {
    /// Hints on memory of every kind, and on an address nothing lives at,
    /// change nothing and never fault.
    #[test]
    fn hints_change_nothing_and_never_fault() {
        let mut v = vec![7u64; 64];
        for p in [
            v.as_ptr(),
            v[63..].as_ptr(),
            std::ptr::null(),
            std::ptr::dangling(),
        ] {
            super::read(p);
            super::write(p);
        }
        v[0] += 1;
        assert_eq!(v[0], 8);
        assert!(v[1..].iter().all(|&x| x == 7));
    }
}
