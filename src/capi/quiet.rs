//! A library never prints: a panic inside a libskv call becomes `SKV_ERR_INTERNAL` (`guard`),
//! and Rust's panic hook, which would write the panic's text to the host's stderr first, is
//! kept quiet for it. The hook is installed once, when the first handle is created, and
//! chains to the hook that was there: a panic raised anywhere else — another Rust library in
//! the process, the host itself, an engine callback written in Rust that libskv is running —
//! still reaches it.

use std::cell::Cell;
use std::panic::{self, PanicHookInfo};
use std::sync::Once;

thread_local! {
    /// How many libskv calls this thread is inside (a call from inside a callback nests).
    static CALLS: Cell<u32> = const { Cell::new(0) };
}

/// Runs `f` as a libskv call: a panic inside it, outside any engine callback, is quiet.
/// One thread-local access a call: the counter's address is taken once.
#[inline(always)]
pub(crate) fn inside_call<R>(f: impl FnOnce() -> R) -> R {
    let calls: *const Cell<u32> = CALLS.with(std::ptr::from_ref);
    // SAFETY: this thread's counter, which lives as long as the thread (no destructor).
    let calls = unsafe { &*calls };
    calls.set(calls.get() + 1);
    let r = f();
    calls.set(calls.get() - 1);
    r
}

/// Installs the quiet hook, once per process. The hook libskv replaces is called for every
/// panic that is not libskv's own.
pub(crate) fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info: &PanicHookInfo<'_>| {
            if !libskv_panic() {
                previous(info);
            }
        }));
    });
}

/// Whether the panic being raised on this thread is libskv's: inside a call, and not inside
/// an engine callback that call is running.
fn libskv_panic() -> bool {
    CALLS.try_with(Cell::get).unwrap_or(0) > 0 && !super::this_thread_in_callback()
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    /// The child process's part of `only_libskv_panics_are_quiet`: panics with every hook
    /// arrangement, printing what the host's hook saw. Run only by that test, in a process of
    /// its own (panic hooks are process-wide).
    #[test]
    #[ignore = "run by only_libskv_panics_are_quiet in a child process"]
    fn quiet_hook_child() {
        use crate::capi::{skv_cache_config, skv_cache_free, skv_cache_new, skv_status};
        // The host's own hook, installed before libskv's.
        std::panic::set_hook(Box::new(|info| {
            let text = info.payload().downcast_ref::<&str>().copied().unwrap_or("?");
            eprintln!("host hook saw: {text}");
        }));
        let cfg = skv_cache_config::small_owned();
        let mut c = std::ptr::null_mut();
        // SAFETY: valid pointers; the handle is freed below.
        assert_eq!(unsafe { skv_cache_new(&cfg, &mut c) }, skv_status::SKV_OK);
        fn skv_probe() -> skv_status {
            export!(skv_probe, || panic!("inside a libskv call"))
        }
        assert_eq!(skv_probe(), skv_status::SKV_ERR_INTERNAL);
        // An engine callback (Rust) panicking inside a libskv call: the host's panic.
        fn skv_probe_callback() -> skv_status {
            export!(skv_probe_callback, || {
                let _scope = crate::capi::CallbackScope::enter();
                let _ = std::panic::catch_unwind(|| panic!("inside an engine callback"));
                Ok(())
            })
        }
        assert_eq!(skv_probe_callback(), skv_status::SKV_OK);
        let _ = std::panic::catch_unwind(|| panic!("the host's own"));
        // SAFETY: the handle created above.
        unsafe { skv_cache_free(c) };
        eprintln!("child done");
    }

    /// A panic inside a libskv call reaches no hook and prints nothing; the host's own
    /// panics, and an engine callback's, still reach the host's hook (fails with the hook not
    /// installed, or installed without chaining).
    #[test]
    fn only_libskv_panics_are_quiet() {
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "capi::quiet::tests::quiet_hook_child", "--ignored", "--nocapture", "--test-threads=1"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "child failed: {err}");
        assert!(err.contains("child done"), "{err}");
        assert!(err.contains("host hook saw: the host's own"), "{err}");
        assert!(err.contains("host hook saw: inside an engine callback"), "{err}");
        assert!(!err.contains("inside a libskv call"), "a libskv panic reached the host: {err}");
    }
}
