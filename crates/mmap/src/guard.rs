//! The SIGBUS guard of every [`crate::Mapped`]: a process-wide list of the mapped address
//! ranges and a SIGBUS handler that, for a fault inside one of them (a read past the end of a
//! file truncated since it was mapped), maps zero pages over the rest of that range, marks it
//! faulted and returns, so the read completes on zeros and [`crate::Mapped::read`] reports
//! the change. Any other SIGBUS goes to the handler that was there before (by default, the
//! process dies of it as it would have).
//!
//! The list is guarded for each map's whole life, not per read on the reading thread: a read
//! may hand the bytes to other threads (the parallel hash of a shard), whose faults count too.
//!
//! What the handler touches is async-signal-safe: atomics, `mmap` and `sigaction`. The list
//! is a singly linked list of entries that are never freed (an entry of a dropped map is
//! reused by the next map), so the handler can walk it while maps come and go; each entry's
//! range is a seqlock, so a range being rewritten is skipped, never read torn. Entries are
//! added and rewritten under one mutex, outside the handler.

use std::ffi::{c_int, c_void};
use std::ptr::null_mut;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicUsize, fence};
use std::sync::{Mutex, Once};

/// `si_code` of a SIGBUS for an access to a mapped page past the end of its file (Linux's
/// `BUS_ADRERR`, which the `libc` crate does not define for Linux).
const BUS_ADRERR: c_int = 2;

/// One map's address range in the handler's list.
pub(crate) struct Range {
    /// Seqlock: odd while `start` and `end` are being rewritten.
    seq: AtomicUsize,
    start: AtomicUsize,
    /// 0: the entry is free (no map).
    end: AtomicUsize,
    /// A read of the range faulted (its tail is zero pages now).
    faulted: AtomicBool,
    /// The next entry; set before the entry is published, never changed.
    next: AtomicPtr<Range>,
}

impl Range {
    pub(crate) fn faulted(&self) -> bool {
        self.faulted.load(Acquire)
    }

    /// Sets the range (under [`FREE`]'s lock; the handler skips it meanwhile).
    fn set(&self, start: usize, end: usize) {
        let s = self.seq.load(Relaxed);
        self.seq.store(s.wrapping_add(1), Relaxed);
        fence(Release);
        self.start.store(start, Relaxed);
        self.end.store(end, Relaxed);
        self.faulted.store(false, Relaxed);
        self.seq.store(s.wrapping_add(2), Release);
    }

    /// The range, unless it is being rewritten.
    fn snapshot(&self) -> Option<(usize, usize)> {
        let s1 = self.seq.load(Acquire);
        if s1 & 1 == 1 {
            return None;
        }
        let (start, end) = (self.start.load(Relaxed), self.end.load(Relaxed));
        fence(Acquire);
        (self.seq.load(Relaxed) == s1).then_some((start, end))
    }
}

/// The first entry of the list (entries are pushed at the front, under [`FREE`]'s lock).
static HEAD: AtomicPtr<Range> = AtomicPtr::new(null_mut());
/// Entries of dropped maps, for the next maps; its lock serialises every change to the list.
static FREE: Mutex<Vec<&'static Range>> = Mutex::new(Vec::new());
static INSTALL: Once = Once::new();
static PAGE: AtomicUsize = AtomicUsize::new(4096);
/// The SIGBUS action before [`INSTALL`]: its handler (`sa_sigaction`) and flags.
static PREVIOUS_HANDLER: AtomicUsize = AtomicUsize::new(libc::SIG_DFL);
static PREVIOUS_FLAGS: AtomicI32 = AtomicI32::new(0);

/// The page size.
#[cfg(test)]
pub(crate) fn page() -> usize {
    install();
    PAGE.load(Relaxed)
}

/// Guards `[start, start + len)`, a map just made, until [`unregister`].
pub(crate) fn register(start: usize, len: usize) -> &'static Range {
    install();
    let mut free = FREE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(r) = free.pop() {
        r.set(start, start + len);
        return r;
    }
    let r: &'static Range = Box::leak(Box::new(Range {
        seq: AtomicUsize::new(0),
        start: AtomicUsize::new(start),
        end: AtomicUsize::new(start + len),
        faulted: AtomicBool::new(false),
        next: AtomicPtr::new(HEAD.load(Relaxed)),
    }));
    HEAD.store(r as *const Range as *mut Range, Release);
    r
}

/// Ends the guard of a map about to be unmapped.
pub(crate) fn unregister(r: &'static Range) {
    let mut free = FREE.lock().unwrap_or_else(|e| e.into_inner());
    r.set(0, 0);
    free.push(r);
}

/// Installs the SIGBUS handler, once; the action before it is kept for other faults.
fn install() {
    INSTALL.call_once(|| {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if page > 0 {
            PAGE.store(page as usize, Relaxed);
        }
        // SAFETY: an all-zero `sigaction` is a valid value (SIG_DFL, no flags, empty mask); the
        // calls only read `new` and write `old`, both live locals.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) != 0 {
                return;
            }
            PREVIOUS_HANDLER.store(old.sa_sigaction, Relaxed);
            PREVIOUS_FLAGS.store(old.sa_flags, Relaxed);
            let mut new: libc::sigaction = std::mem::zeroed();
            let handler: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) = on_sigbus;
            new.sa_sigaction = handler as usize;
            new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut new.sa_mask);
            libc::sigaction(libc::SIGBUS, &new, null_mut());
        }
    });
}

extern "C" fn on_sigbus(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    // SAFETY: the kernel passes a SA_SIGINFO handler a valid `siginfo_t`.
    let code = unsafe { (*info).si_code };
    if code == BUS_ADRERR {
        // SAFETY: as above; for a fault code (BUS_ADRERR), `si_addr` is the faulting address.
        let addr = unsafe { (*info).si_addr() } as usize;
        if zero_fill(addr) {
            return;
        }
    }
    chain(sig, code, info, ctx);
}

/// For a fault at `addr` inside a guarded range: maps zero pages from `addr`'s page to the
/// range's end, marks the range faulted and returns true (the faulting read then retries and
/// reads zeros). False for any other address.
fn zero_fill(addr: usize) -> bool {
    let page = PAGE.load(Relaxed);
    let mut p = HEAD.load(Acquire);
    // SAFETY: entries are leaked `Box`es, never freed, published with Release after being
    // initialised.
    while let Some(r) = unsafe { p.as_ref() } {
        if let Some((start, end)) = r.snapshot()
            && start <= addr
            && addr < end
        {
            let from = addr & !(page - 1);
            let to = end.next_multiple_of(page);
            // SAFETY: a range is in the list only while its map (all of `[start, end)`, and
            // the rest of its last page) is mapped: it is registered after the map is made and
            // unregistered before it is unmapped, and the faulting thread is reading the map,
            // so it is alive. `[from, to)` lies in it; replacing those pages with zero pages
            // only changes what the map reads (the read in progress is reported as changed
            // and its result discarded), and unmapping the map later unmaps them too.
            let m = unsafe {
                libc::mmap(
                    from as *mut c_void,
                    to - from,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if m == libc::MAP_FAILED {
                return false;
            }
            r.faulted.store(true, Release);
            return true;
        }
        p = r.next.load(Acquire);
    }
    false
}

/// A SIGBUS that is not a guarded map's: handed to the previous action. A handler is called;
/// the default action is restored, and the signal raised again if it was sent (a fault
/// recurs by itself when the handler returns), so the process dies of it as before; an
/// ignored signal stays ignored unless it is a fault (which cannot be ignored).
fn chain(sig: c_int, code: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    let handler = PREVIOUS_HANDLER.load(Relaxed);
    let flags = PREVIOUS_FLAGS.load(Relaxed);
    match handler {
        libc::SIG_IGN if code <= 0 => {}
        libc::SIG_DFL | libc::SIG_IGN => {
            // SAFETY: an all-zero `sigaction` is SIG_DFL with no flags and an empty mask;
            // sigaction and raise are async-signal-safe.
            unsafe {
                let dfl: libc::sigaction = std::mem::zeroed();
                libc::sigaction(sig, &dfl, null_mut());
                if code <= 0 {
                    libc::raise(sig);
                }
            }
        }
        h if flags & libc::SA_SIGINFO != 0 => {
            // SAFETY: with SA_SIGINFO, `sa_sigaction` holds a three-argument handler, which
            // gets the kernel's arguments unchanged.
            let f: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) =
                unsafe { std::mem::transmute(h) };
            f(sig, info, ctx);
        }
        h => {
            // SAFETY: without SA_SIGINFO, `sa_sigaction` holds a one-argument handler.
            let f: extern "C" fn(c_int) = unsafe { std::mem::transmute(h) };
            f(sig);
        }
    }
}
