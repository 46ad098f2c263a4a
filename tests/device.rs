//! The device copy of req_to_token in a `cuda` build: `cargo test --features cuda --test device`.
//! Where a CUDA driver and GPU exist, the copy read back must equal the host rows at every
//! mapped position after each sync; elsewhere attach must fail with SKV_ERR_CUDA and a clear
//! message, and the test says loudly that the GPU path did not run.
#![cfg(feature = "cuda")]
// As in the library: every unsafe block says why it is sound.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

use std::ptr;

use cudarc::driver::{result, sys};
use skv::*;

#[test]
fn device_copy_equals_the_host_rows() {
    let cfg = skv_cache_config {
        struct_size: std::mem::size_of::<skv_cache_config>() as u32,
        page_size: 16,
        num_token_slots: 1 << 14,
        num_rows: 8,
        max_context_len: 512,
        flags: 0,
        swa_num_token_slots: 0,
        ..Default::default()
    };
    let mut reqs = [skv_req::default(); 3];
    // SAFETY: c is created here and freed once on every way out; the reqs, dptr, stride, copy
    // and want are locals, want holding the kv_allocated_len indices asked for; the stream is
    // NULL; the device copy libskv keeps while c lives is num_rows x stride int32s, copy's
    // length, read back with device 0's primary context current.
    unsafe {
        let mut c = ptr::null_mut();
        assert_eq!(skv_cache_new(&cfg, &mut c), skv_status::SKV_OK);
        let (mut dptr, mut stride) = (0u64, 0u64);
        assert_eq!(skv_device_sync(c, &mut dptr, &mut stride), skv_status::SKV_ERR_STATE, "not attached yet");
        for r in reqs.iter_mut() {
            assert_eq!(skv_alloc_row(c, r), skv_status::SKV_OK);
            assert_eq!(skv_alloc_extend(c, r, 40, std::ptr::null_mut()), skv_status::SKV_OK);
        }
        let st = skv_device_attach(c, 0, ptr::null_mut());
        if !sys::is_culib_present() {
            assert_eq!(st, skv_status::SKV_ERR_CUDA);
            let msg = last_error_message();
            assert!(msg.starts_with("skv_device_attach: no CUDA driver"), "{msg}");
            eprintln!("device test: NO CUDA DRIVER ON THIS MACHINE - the GPU path did NOT run (checked: SKV_ERR_CUDA)");
            skv_cache_free(c);
            return;
        }
        if result::init().and_then(|_| result::device::get_count()).unwrap_or(0) == 0 {
            assert_eq!(st, skv_status::SKV_ERR_CUDA);
            eprintln!("device test: a CUDA driver but NO GPU - the GPU path did NOT run ({})", last_error_message());
            skv_cache_free(c);
            return;
        }
        assert_eq!(st, skv_status::SKV_OK, "{}", last_error_message());
        // Reading the copy back needs the device's primary context current on this thread
        // (libskv leaves the caller's current context as it found it).
        let dev = result::device::get(0).expect("device 0");
        let ctx = result::primary_ctx::retain(dev).expect("primary context");
        result::ctx::set_current(ctx).expect("make it current");
        assert_eq!(skv_device_attach(c, 0, ptr::null_mut()), skv_status::SKV_ERR_STATE, "attached twice");
        for round in 0..6 {
            for (i, r) in reqs.iter_mut().enumerate() {
                let n = (round * 37 + i as u32 * 11) % 60 + 1;
                match (round + i as u32) % 3 {
                    // a freed row comes back empty and is mapped again from position 0
                    0 if round > 0 => {
                        assert_eq!(skv_free_req(c, r), skv_status::SKV_OK);
                        assert_eq!(skv_alloc_row(c, r), skv_status::SKV_OK);
                    }
                    // a shortened row keeps its first positions; its next extension rewrites the rest
                    1 => {
                        r.kv_committed_len = r.kv_allocated_len;
                        assert_eq!(skv_free_tail(c, r, r.kv_allocated_len / 2), skv_status::SKV_OK);
                    }
                    _ => {}
                }
                if r.kv_allocated_len + n <= cfg.max_context_len {
                    assert_eq!(skv_alloc_extend(c, r, n, std::ptr::null_mut()), skv_status::SKV_OK);
                }
            }
            assert_eq!(skv_device_sync(c, &mut dptr, &mut stride), skv_status::SKV_OK, "{}", last_error_message());
            assert_eq!(stride, cfg.max_context_len as u64);
            result::ctx::synchronize().expect("the copies finish");
            let mut copy = vec![0i32; (cfg.num_rows as u64 * stride) as usize];
            result::memcpy_dtoh_sync(&mut copy, dptr).expect("read the copy back");
            for r in &reqs {
                let mut want = vec![0i32; r.kv_allocated_len as usize];
                let st = skv_row_indices(c, r.req_pool_idx, 0, r.kv_allocated_len, want.as_mut_ptr());
                assert_eq!(st, skv_status::SKV_OK);
                let at = r.req_pool_idx as usize * stride as usize;
                assert_eq!(&copy[at..at + want.len()], &want[..], "row {} after round {round}", r.req_pool_idx);
            }
        }
        eprintln!("device test: ran on a GPU, the device copy matched the host rows");
        skv_cache_free(c);
        result::primary_ctx::release(dev).ok();
    }
}
