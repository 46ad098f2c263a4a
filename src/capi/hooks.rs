//! Owned mode's engine hooks: where a released session's prefix-tree lock and aux state go.

use std::ffi::{c_int, c_void};

use super::external::{skv_dec_lock_ref_fn, skv_free_aux_fn};
use super::{lock, skv_cache, skv_status, CallbackScope};
use crate::core::{EngineHooks, Result};

/// Owned mode's engine callbacks: a released session's prefix-tree lock and aux state go
/// here (release, aborted finish, aligned-reuse release). Either may be NULL. They run as
/// skv_pool_ops' callbacks do (docs/external-mode.md#what-a-callback-may-call).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct skv_engine_hooks {
    /// sizeof(skv_engine_hooks) of the header the caller was built with: 24 in ABI 1 to 3, 32
    /// from ABI 4 (copy_pages). Accepted from 24 up; see "Versioned structs" at the top of
    /// this header.
    pub struct_size: u32,
    /// Drop the prefix-tree lock a session inherited from its first request.
    pub dec_lock_ref: skv_dec_lock_ref_fn,
    /// Free one engine auxiliary-state handle: once per handle that is not -1, in the order
    /// `aux_state`, `aux_track[0]`, `aux_track[1]` (docs/recurrent-state.md).
    pub free_aux: skv_free_aux_fn,
    /// The host tier's copies (docs/tiers.md#copy_pages); NULL: no host-tier move can run.
    /// NULL when struct_size is 24.
    pub copy_pages: skv_copy_pages_fn,
}

/// Enqueue the copies of `ticket`, returning 0, or enqueue nothing and return non-zero (the
/// libskv call then fails with SKV_ERR_CALLBACK and changes nothing). Copy whole pages, every
/// layer: `src[i]` to `dst[i]`, the first `n_full` pairs in the full pools, the next `n_swa` in
/// the SWA pools; `direction` is SKV_COPY_TO_HOST (src device pages, dst host pages) or
/// SKV_COPY_TO_DEVICE. The arrays are readable during the call only. Once the copies ran, call
/// skv_ticket_done (never from inside this callback).
pub type skv_copy_pages_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        ticket: u64,
        direction: u32,
        src: *const i32,
        dst: *const i32,
        n_full: usize,
        n_swa: usize,
    ) -> c_int,
>;

/// Every published sizeof(skv_engine_hooks) (`read_versioned`).
pub(crate) const HOOKS_SIZES: [u32; 2] = [24, 32];
const _: () = assert!(std::mem::size_of::<skv_engine_hooks>() as u32 == HOOKS_SIZES[1]);

struct Hooks {
    hooks: skv_engine_hooks,
    user_data: *mut c_void,
}

// SAFETY: the engine promises its callbacks (and user_data, which only they use) may run on
// whichever thread calls libskv; the handle's lock keeps the calls one at a time.
unsafe impl Send for Hooks {}

fn rc(code: c_int) -> Result<(), i32> {
    if code == 0 {
        Ok(())
    } else {
        Err(code)
    }
}

impl EngineHooks for Hooks {
    fn dec_lock_ref(&mut self, node: u64, receipt: u64) -> Result<(), i32> {
        let _scope = CallbackScope::enter();
        // SAFETY: the engine's callback, callable while installed (skv_cache_set_hooks).
        self.hooks.dec_lock_ref.map_or(Ok(()), |f| rc(unsafe { f(self.user_data, node, receipt) }))
    }

    fn free_aux(&mut self, aux: i64) -> Result<(), i32> {
        let _scope = CallbackScope::enter();
        // SAFETY: the engine's callback, callable while installed (skv_cache_set_hooks).
        self.hooks.free_aux.map_or(Ok(()), |f| rc(unsafe { f(self.user_data, aux) }))
    }

    fn can_copy(&self) -> bool {
        self.hooks.copy_pages.is_some()
    }

    fn copy_pages(&mut self, ticket: u64, dir: u32, src: &[i32], dst: &[i32], nf: usize, ns: usize) -> Result<(), i32> {
        let _scope = CallbackScope::enter();
        let Some(f) = self.hooks.copy_pages else { return Err(-1) };
        // SAFETY: the engine's callback, callable while installed; the arrays outlive the call.
        rc(unsafe { f(self.user_data, ticket, dir, src.as_ptr(), dst.as_ptr(), nf, ns) })
    }
}

/// Installs owned mode's engine hooks (copied); `user_data` is passed to each. NULL hooks
/// removes them, after which released locks and aux states are dropped.
///
/// The caller must pass every pointer as NULL or valid, and keep the callbacks callable while
/// they are installed.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_STATE, SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_cache_set_hooks(
    c: *mut skv_cache,
    hooks: *const skv_engine_hooks,
    user_data: *mut c_void,
) -> skv_status {
    export!(
        skv_cache_set_hooks,
        c,
        |t| {
            // SAFETY: NULL or a struct of struct_size bytes by the call's contract; read as
            // the body reads it.
            match (!hooks.is_null()).then(|| unsafe { super::read_versioned(hooks, &HOOKS_SIZES, "hooks") }) {
                None => {
                    t.num("hooks", 0);
                }
                Some(Err(_)) => {
                    t.text("hooks", "invalid");
                }
                Some(Ok(h)) => {
                    t.num("hooks", 1);
                    t.num("dec_lock_ref", h.dec_lock_ref.is_some() as u8);
                    t.num("free_aux", h.free_aux.is_some() as u8);
                    t.num("copy_pages", h.copy_pages.is_some() as u8);
                }
            }
        },
        // SAFETY: c is NULL or a live handle and hooks NULL or a struct of struct_size bytes (the
        // contract above); lock refuses NULL and hooks is read only when not NULL.
        || unsafe {
            let mut c = lock(c)?;
            c.require_owned()?;
            let hooks = match hooks.is_null() {
                true => None,
                false => {
                    let hooks = super::read_versioned(hooks, &HOOKS_SIZES, "hooks")?;
                    Some(Box::new(Hooks { hooks, user_data }) as Box<dyn EngineHooks>)
                }
            };
            c.set_hooks(hooks)
        },
        |_| {},
    )
}
