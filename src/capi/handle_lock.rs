//! The handle's lock: every call on a handle holds it, so a call's fixed cost is its cost.
//!
//! A compare-and-swap takes it and a plain store gives it back. std's `Mutex` gives it back
//! with an atomic swap, to learn whether a waiter sleeps in the kernel and needs waking; on
//! the dev box a trivial call (`skv_cache_stats`, the hot-path bench) went from 13.5 to 8.6 ns
//! without it. Here nobody sleeps where a store cannot wake them: a call that finds the lock
//! held polls it, first spinning (most calls hold it well under a microsecond), then yielding
//! its core (the holder may be preempted), then sleeping `NAP` between looks (an audit of a
//! large pool holds it longer). An engine drives a handle from one scheduler thread, so the
//! wait is the rare path. It is correct for any number of threads, but orders nobody: a
//! thread calling back to back can take the lock again before a sleeping waiter looks.
//!
//! A panic while the lock is held poisons it, as it does std's `Mutex`: the cache may be
//! half-changed, so every later call is refused rather than run on it.

use std::cell::UnsafeCell;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::panic::{RefUnwindSafe, UnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Polls with a spin-loop hint before the waiting call yields its core.
const SPINS: u32 = 64;
/// Polls that yield the core before the waiting call sleeps between polls.
const YIELDS: u32 = 64;
/// The sleep between polls once spinning and yielding did not find the lock free (Linux's
/// default timer slack makes it ~70 µs).
const NAP: Duration = Duration::from_micros(20);

/// A value one thread at a time reaches, through `lock`.
pub(crate) struct HandleLock<T> {
    held: AtomicBool,
    /// A holder panicked (see the module's doc).
    poisoned: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the value is reached only through a guard, one guard exists at a time (`held`), and
// a guard's thread gets the value as the previous guard's thread left it (the Acquire taking
// the lock pairs with the Release giving it back): what std's Mutex<T> gives, for T: Send.
unsafe impl<T: Send> Send for HandleLock<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for HandleLock<T> {}
// A panic that leaves the value half-changed poisons the lock, and no later `lock` reaches it.
impl<T> RefUnwindSafe for HandleLock<T> {}
impl<T> UnwindSafe for HandleLock<T> {}

/// The lock held: the value, until dropped.
pub(crate) struct HandleGuard<'a, T> {
    lock: &'a HandleLock<T>,
    /// The thread was already unwinding a panic when it took the lock: that panic is not one
    /// inside the holder's work, and does not poison the lock (std's `Mutex` rule).
    panicking: bool,
    /// The guard hands out `&mut T`: shared between threads only where `T` is `Sync` (as
    /// std's `MutexGuard`), since `&guard` gives `&T` (a `Cache` has `Cell`s).
    _value: PhantomData<&'a mut T>,
}

/// `lock` found the lock poisoned.
#[derive(Debug)]
pub(crate) struct Poisoned;

impl<T> HandleLock<T> {
    pub(crate) fn new(value: T) -> Self {
        HandleLock { held: AtomicBool::new(false), poisoned: AtomicBool::new(false), value: UnsafeCell::new(value) }
    }

    /// Takes the lock, waiting while another thread holds it; `Err` (with the lock given back)
    /// when a holder panicked.
    #[inline(always)]
    pub(crate) fn lock(&self) -> Result<HandleGuard<'_, T>, Poisoned> {
        if self.held.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            self.wait();
        }
        let guard = HandleGuard { lock: self, panicking: std::thread::panicking(), _value: PhantomData };
        match self.poisoned.load(Ordering::Relaxed) {
            false => Ok(guard),
            true => Err(Poisoned),
        }
    }

    /// Polls until this thread takes the lock: reads until it looks free, then tries (a failed
    /// compare-and-swap would take the line from the holder's core every poll).
    #[cold]
    #[inline(never)]
    fn wait(&self) {
        let mut polls = 0u32;
        loop {
            while self.held.load(Ordering::Relaxed) {
                polls = polls.saturating_add(1);
                if polls <= SPINS {
                    std::hint::spin_loop();
                } else if polls <= SPINS + YIELDS {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(NAP);
                }
            }
            if self.held.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                return;
            }
        }
    }
}

impl<T> Drop for HandleGuard<'_, T> {
    #[inline(always)]
    fn drop(&mut self) {
        if !self.panicking && std::thread::panicking() {
            self.lock.poisoned.store(true, Ordering::Relaxed);
        }
        self.lock.held.store(false, Ordering::Release);
    }
}

impl<T> Deref for HandleGuard<'_, T> {
    type Target = T;

    #[inline(always)]
    fn deref(&self) -> &T {
        // SAFETY: this guard holds the lock, so no other reference to the value exists.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for HandleGuard<'_, T> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: this guard holds the lock, and `&mut self` makes this the only reference.
        unsafe { &mut *self.lock.value.get() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::panic::{catch_unwind, AssertUnwindSafe};
    use std::sync::atomic::AtomicUsize;

    /// Each thread's increments are a read and a write apart: without mutual exclusion some
    /// would be lost (with `lock` not waiting, the total falls short).
    #[test]
    fn threads_taking_the_lock_in_turn_lose_no_update() {
        let lock = HandleLock::new(0u64);
        let inside = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..20_000 {
                        let mut g = lock.lock().expect("not poisoned");
                        assert_eq!(inside.fetch_add(1, Ordering::Relaxed), 0, "two holders at once");
                        let v = *g;
                        std::hint::black_box(&v);
                        *g = v + 1;
                        inside.fetch_sub(1, Ordering::Relaxed);
                    }
                });
            }
        });
        assert_eq!(*lock.lock().expect("not poisoned"), 80_000);
    }

    /// A holder that keeps the lock for 30 ms, far past the spinning and the yielding: the
    /// waiter takes it once it is given back, and sees the holder's write (a lock that did not
    /// wait would let it read 0).
    #[test]
    fn a_waiter_gets_the_lock_a_long_holder_gives_back() {
        let lock = HandleLock::new(0u32);
        let g = lock.lock().expect("not poisoned");
        std::thread::scope(|s| {
            let waiter = s.spawn(|| *lock.lock().expect("not poisoned"));
            std::thread::sleep(Duration::from_millis(30));
            let mut g = g;
            *g = 7;
            drop(g);
            assert_eq!(waiter.join().expect("waiter"), 7);
        });
    }

    #[test]
    fn a_panic_while_held_poisons_the_lock_and_gives_it_back() {
        let lock = HandleLock::new(1u32);
        let r = catch_unwind(AssertUnwindSafe(|| {
            let mut g = lock.lock().expect("not poisoned");
            *g = 2;
            panic!("a bug inside a call");
        }));
        assert!(r.is_err());
        assert!(lock.lock().is_err(), "poisoned");
        // Given back: the refusal did not leave it held (a second call would wait forever).
        assert!(!lock.held.load(Ordering::Relaxed));
    }

    /// A lock taken by code already unwinding (a Rust caller's `Drop` calling libskv during a
    /// panic) is not poisoned by that panic.
    #[test]
    fn a_lock_taken_while_unwinding_is_not_poisoned() {
        struct CallsDuringUnwind<'a>(&'a HandleLock<u32>);
        impl Drop for CallsDuringUnwind<'_> {
            fn drop(&mut self) {
                // No panic here: a second panic while unwinding would abort the test binary.
                if let Ok(mut g) = self.0.lock() {
                    *g += 1;
                }
            }
        }
        let lock = HandleLock::new(0u32);
        let r = catch_unwind(AssertUnwindSafe(|| {
            let _d = CallsDuringUnwind(&lock);
            panic!("the caller's own panic");
        }));
        assert!(r.is_err());
        assert_eq!(*lock.lock().expect("not poisoned"), 1);
    }
}
