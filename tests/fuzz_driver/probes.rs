//! One-shot probes of the re-entry rule: a chain of nine handles whose callbacks call the next
//! (hole 3), and two threads each inside one handle's callback calling the other's (hole 4).
//! Before the rule "any libskv call from inside a callback is SKV_ERR_STATE" both deadlock;
//! the fuzzer's watchdog turns a deadlock into an abort that names the seed.

use std::ffi::{c_int, c_void};
use std::ptr::{null, null_mut};
use std::sync::Barrier;

use skv::skv_status::*;
use skv::*;

struct Link {
    me: *mut skv_cache,
    next: *mut skv_cache,
    /// What the call made from inside this handle's callback returned.
    got: Option<skv_status>,
    barrier: Option<*const Barrier>,
}

unsafe extern "C" fn chain_dec_lock_ref(ud: *mut c_void, _node: u64, _receipt: u64) -> c_int {
    // SAFETY: ud is this handle's boxed Link, which outlives the handle and is not otherwise
    // borrowed while a libskv call runs; the barrier lives on the probe's stack until both
    // threads are joined.
    let l = unsafe { &mut *(ud as *mut Link) };
    if let Some(b) = l.barrier {
        // SAFETY: as above.
        unsafe { (*b).wait() };
    }
    // SAFETY: l.me and l.next are handles of the probe, freed only after every call on them
    // has returned; h is plain integers (all zero is valid) and a local.
    let st = unsafe {
        if l.next.is_null() {
            // The innermost link calls its own handle, which is running this callback.
            let mut h = std::mem::zeroed::<skv_held>();
            let st = skv_session_held(l.me, null(), 0, &mut h);
            skv_cache_free(l.me); // must do nothing
            st
        } else {
            skv_release_session(l.next, 1)
        }
    };
    l.got = Some(st);
    0
}

fn cfg() -> skv_cache_config {
    skv_cache_config {
        struct_size: std::mem::size_of::<skv_cache_config>() as u32,
        page_size: 4,
        num_token_slots: 64,
        num_rows: 2,
        max_context_len: 32,
        flags: 0,
        swa_num_token_slots: 0,
        ..Default::default()
    }
}

/// An owned handle whose session 1 holds a prefix-tree lock, with `link` as its hooks' data.
///
/// # Safety
/// `link` must point at a Link that outlives the handle and stays where it is.
unsafe fn handle_with_lock(link: *mut Link) -> *mut skv_cache {
    let mut c = null_mut();
    let hooks = skv_engine_hooks {
        struct_size: std::mem::size_of::<skv_engine_hooks>() as u32,
        dec_lock_ref: Some(chain_dec_lock_ref),
        free_aux: None,
        ..Default::default()
    };
    let mut r = skv_req::default();
    // SAFETY: c, hooks and r are locals; link is valid for as long as the handle by this
    // function's contract.
    unsafe {
        assert_eq!(skv_cache_new(&cfg(), &mut c), SKV_OK);
        assert_eq!(skv_cache_set_hooks(c, &hooks, link as *mut c_void), SKV_OK);
        assert_eq!(skv_alloc_row(c, &mut r), SKV_OK);
        (r.lock_node, r.lock_receipt) = (1, 1);
        assert_eq!(skv_cache_finished_req(c, 1, 0, &mut r, 0), SKV_OK);
        (*link).me = c;
    }
    c
}

/// Nine handles, each one's dec_lock_ref releasing the next one's session; the ninth calls
/// itself. Every call into a handle whose callback is running must be SKV_ERR_STATE.
pub fn deep_reentry() {
    const N: usize = 9;
    let mut links: Vec<Box<Link>> =
        (0..N).map(|_| Box::new(Link { me: null_mut(), next: null_mut(), got: None, barrier: None })).collect();
    // SAFETY: the links are boxed (they stay put) and outlive the handles, each freed once at
    // the end.
    unsafe {
        let hs: Vec<*mut skv_cache> = links.iter_mut().map(|l| handle_with_lock(&mut **l)).collect();
        for i in 0..N - 1 {
            links[i].next = hs[i + 1];
        }
        assert_eq!(skv_release_session(hs[0], 1), SKV_OK, "deep re-entry probe: the outer release");
        if let Some(st) = links[N - 1].got {
            assert_eq!(st, SKV_ERR_STATE, "deep re-entry probe: the ninth handle called itself from its callback");
        }
        for (i, l) in links.iter().enumerate() {
            if let Some(st) = l.got {
                assert!(matches!(st, SKV_OK | SKV_ERR_STATE), "deep re-entry probe: link {i} got {st:?}");
            }
        }
        for h in hs {
            skv_cache_free(h);
        }
    }
}

/// Thread 1 inside A's callback calls B while thread 2 inside B's callback calls A.
pub fn cross_thread_reentry() {
    let barrier = Barrier::new(2);
    let bp: *const Barrier = &barrier;
    let mut la = Box::new(Link { me: null_mut(), next: null_mut(), got: None, barrier: Some(bp) });
    let mut lb = Box::new(Link { me: null_mut(), next: null_mut(), got: None, barrier: Some(bp) });
    // SAFETY: both links are boxed and outlive the handles, each freed once after the threads
    // are joined; the barrier outlives them too.
    unsafe {
        let a = handle_with_lock(&mut *la);
        let b = handle_with_lock(&mut *lb);
        (la.next, lb.next) = (b, a);
        let (pa, pb) = (a as usize, b as usize);
        std::thread::scope(|s| {
            s.spawn(move || assert_eq!(skv_release_session(pa as *mut skv_cache, 1), SKV_OK));
            s.spawn(move || assert_eq!(skv_release_session(pb as *mut skv_cache, 1), SKV_OK));
        });
        assert_eq!(la.got, Some(SKV_ERR_STATE), "cross-thread re-entry: A's callback calling B");
        assert_eq!(lb.got, Some(SKV_ERR_STATE), "cross-thread re-entry: B's callback calling A");
        skv_cache_free(a);
        skv_cache_free(b);
    }
}
