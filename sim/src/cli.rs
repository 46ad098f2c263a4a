//! Command line and the workload checks that turn bad options into a one-line error.

use clap::Parser;

/// Branches a session may fork (each a separate slot with its own row).
pub const MAX_BRANCHES: u32 = 4;

/// Drive libskv through its C ABI as a serving engine would.
///
/// Multi-turn streaming sessions under speculative decoding, overshoot trimmed at every
/// finish, pages audited, per-call latencies reported.
///
/// Exit status: 0 clean; 1 audit violation, unexpected status or leaked page; 2 bad options.
#[derive(Parser, Debug, Clone)]
#[command(name = "skv-sim", version, max_term_width = 100, args_override_self = true)]
pub struct Args {
    /// Sessions to run in total
    #[arg(long, default_value_t = 10_000)]
    pub sessions: u64,
    /// Turns per session
    #[arg(long, default_value_t = 8)]
    pub turns: u32,
    /// Sessions open at once; an open session keeps its KV between turns
    #[arg(long, default_value_t = 256)]
    pub concurrency: u32,
    /// Requests running at once (the engine's batch); the other open sessions wait idle
    #[arg(long, default_value_t = 64)]
    pub batch: u32,
    /// Tokens per KV page
    #[arg(long, default_value_t = 16)]
    pub page_size: u32,
    /// KV pool capacity in tokens, rounded down to whole pages (page 0 is padding)
    #[arg(long, default_value_t = 1 << 19)]
    pub pool_tokens: u64,
    /// Draft tokens proposed per verify round (k); each round allocates k+1 slots ahead
    #[arg(long, default_value_t = 4)]
    pub draft_len: u32,
    /// Probability that a draft token is accepted (a round stops at the first rejection)
    #[arg(long, default_value_t = 0.7)]
    pub accept_rate: f64,
    /// Generation limit of a turn; half the turns stop earlier at a stop token
    #[arg(long, default_value_t = 256)]
    pub max_new_tokens: u32,
    /// Shortest new user prompt of a turn, in tokens
    #[arg(long, default_value_t = 32)]
    pub prompt_min: u32,
    /// Longest new user prompt of a turn, in tokens
    #[arg(long, default_value_t = 512)]
    pub prompt_max: u32,
    /// Fraction of turns the client aborts mid-generation
    #[arg(long, default_value_t = 0.05)]
    pub abort_rate: f64,
    /// Fraction of turns the scheduler rejects once after matching (matched twice)
    #[arg(long, default_value_t = 0.1)]
    pub retry_rate: f64,
    /// Chance that a turn forks a new branch of its session (at most 4 branches)
    #[arg(long, default_value_t = 0.05)]
    pub branch_rate: f64,
    /// Sliding window in tokens. 0: a full-attention model. N > 0: a hybrid model whose cache
    /// has an SWA pool; every decode step takes one window step (skv_swa_evict) per request
    #[arg(long, default_value_t = 0)]
    pub swa_window: u32,
    /// SWA pool capacity in tokens, rounded down to whole pages (needs --swa-window; default:
    /// --pool-tokens)
    #[arg(long)]
    pub swa_pool_tokens: Option<u64>,
    /// Tokens the SWA cursor must lag the window by before a window step moves it
    /// (skv_swa_evict's eviction_interval; needs --swa-window)
    #[arg(long, default_value_t = 1)]
    pub swa_eviction_interval: u32,
    /// Pages of a system prompt held by the engine's prefix tree and shared by sessions
    #[arg(long, default_value_t = 4)]
    pub shared_prefix_pages: u32,
    /// Fraction of sessions that start from the shared system prompt
    #[arg(long, default_value_t = 0.5)]
    pub prefix_fraction: f64,
    /// Reuse a session prefix only in whole pages (SKV_FLAG_ALIGNED_REUSE)
    #[arg(long)]
    pub aligned_reuse: bool,
    /// Give every request recurrent-state handles from a fake pool (sglang's mamba pool slot
    /// in aux_state, ping-pong track entries in aux_track); each must come back exactly once
    #[arg(long)]
    pub mamba: bool,
    /// Run skv_cache_check every N finished turns (0: only at the end)
    #[arg(long, default_value_t = 500)]
    pub check_every: u64,
    /// Seed of the workload's random stream (same seed, same calls)
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print a machine-readable summary (one flat JSON object) instead of the table
    #[arg(long, conflicts_with = "bench")]
    pub json: bool,
    /// Print only the timing line (no progress bar, no table)
    #[arg(long)]
    pub bench: bool,
    /// Serving instances, each its own libskv handle with pool, batch and shared prompt
    /// split evenly (--pool-tokens / N, --batch / N), behind a router (needs the `router`
    /// build feature; docs/simulator.md)
    #[arg(long, default_value_t = 1)]
    pub instances: u32,
    /// Routing policies, each run in turn on the same workload: kv (Dynamo's radix tree fed by
    /// libskv's KV events, scored by Dynamo's cost), session (sticky by session id), random.
    /// Given alone or with --instances, the run is the multi-instance one
    #[arg(long, value_delimiter = ',', value_enum)]
    pub router: Vec<Policy>,
    /// Remove instance K halfway through the turns: its turns go elsewhere, its slots are
    /// released, and nothing is routed to it afterwards
    #[arg(long)]
    pub drain: Option<u32>,
    /// Move idle sessions off an overloaded or draining instance to another through libskv's
    /// move export and import (needs --instances 2 or more; docs/simulator.md#migration)
    #[arg(long)]
    pub migrate: bool,
    /// --migrate: the pool use (used pages of an instance's pool, a fraction) at which its
    /// idle sessions move, least recently used first, until its use is below it again
    #[arg(long, default_value_t = 0.9)]
    pub migrate_threshold: f64,
    /// --migrate: the modelled link between two instances, in GB/s (each source instance's
    /// moves queue on its own link; the default 50 is a 400 Gb/s RDMA NIC)
    #[arg(long, default_value_t = 50.0)]
    pub link_gbps: f64,
    /// The kv router's credit per cached block against a block of load: Dynamo's
    /// `overlap_score_credit` (its default 1)
    #[arg(long, default_value_t = 1.0)]
    pub overlap_credit: f64,
    /// Simulated duration of one engine step (a verify round of every running request), in
    /// milliseconds; the clock of "events per simulated second", and a step's decode time in
    /// the host tier's time model
    #[arg(long, default_value_t = 20.0)]
    pub step_ms: f64,
    /// Host tier: a host pool of N tokens for idle sessions' KV (split evenly between the
    /// instances); the workload runs twice, without and with the tier (once per routing
    /// policy each), and the summary compares them (docs/simulator.md). 0: no tier
    #[arg(long, default_value_t = 0)]
    pub host_pool_tokens: u64,
    /// Modelled copy bandwidth between device and host, each way, in GB/s (--host-pool-tokens)
    #[arg(long, default_value_t = 25.0)]
    pub copy_gbps: f64,
    /// Modelled KV bytes per token across all layers (--host-pool-tokens, --migrate); the default 131072
    /// (128 KiB) is a 70B-class model's order (Llama-3-70B with grouped-query attention: 80
    /// layers x 8 KV heads x 128 dims, K and V, is 160 KiB in FP8)
    #[arg(long, default_value_t = 131_072)]
    pub kv_bytes_per_token: u64,
    /// Modelled prefill speed in tokens per second (--host-pool-tokens, --migrate): a step takes
    /// its prefill tokens at this rate plus --step-ms of decode
    #[arg(long, default_value_t = 20_000.0)]
    pub prefill_tokens_per_s: f64,
    /// Host tier: a finished session is written back once idle this many steps
    /// (skv_cache_config.tier_idle_steps)
    #[arg(long, default_value_t = 64)]
    pub tier_idle_steps: u32,
    /// Host tier: pages a step starts writing back, at most (tier_pages_per_step)
    #[arg(long, default_value_t = 256)]
    pub tier_pages_per_step: u32,
    /// Host tier: the chance that a ticket's copies fail (skv_ticket_done with a non-zero
    /// status); a request whose restore failed is aborted and its turn queued again
    #[arg(long, default_value_t = 0.0)]
    pub copy_fail_rate: f64,
}

/// How a turn picks its instance (`--router`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// NVIDIA Dynamo's KV router: overlap from its radix tree, fed only by libskv's events
    Kv,
    /// Sticky by session id: a session's first turn by load, every later turn where it went
    Session,
    /// Uniformly at random among the live instances
    Random,
}

impl Policy {
    pub fn name(self) -> &'static str {
        match self {
            Policy::Kv => "kv",
            Policy::Session => "session",
            Policy::Random => "random",
        }
    }
}

/// The options after validation, with what follows from them.
#[derive(Debug, Clone)]
pub struct Config {
    pub args: Args,
    pub shared_tokens: u32,
    pub total_pages: u64,
    /// SWA pool pages, its padding page included (0: a full-attention model, no SWA pool).
    pub swa_total_pages: u64,
    pub num_rows: u32,
    /// Longest row a session branch can need: its prompt history at the last turn plus a
    /// generation that overshoots by a full draft, plus the slots allocated ahead.
    pub max_context_len: u32,
    /// The multi-instance run (`--instances` or `--router` given): instances, token ids,
    /// events and a router.
    pub multi: bool,
    /// Pages (padding included) and batch of one instance; the whole pool and batch when
    /// not `multi`.
    pub instance_pages: u64,
    pub instance_batch: u32,
    pub instance_swa_pages: u64,
    /// Host tier pages, padding included (0: no tier).
    pub host_pages: u64,
}

impl Config {
    pub fn from_args(a: Args) -> Result<Config, String> {
        let ps = a.page_size as u64;
        if ps == 0 {
            return Err("--page-size 0: must be at least 1".into());
        }
        for (name, v) in [
            ("--sessions", a.sessions),
            ("--turns", a.turns as u64),
            ("--concurrency", a.concurrency as u64),
            ("--batch", a.batch as u64),
            ("--max-new-tokens", a.max_new_tokens as u64),
            ("--prompt-min", a.prompt_min as u64),
        ] {
            if v == 0 {
                return Err(format!("{name} 0: must be at least 1"));
            }
        }
        if a.prompt_min > a.prompt_max {
            return Err(format!("--prompt-min {} exceeds --prompt-max {}", a.prompt_min, a.prompt_max));
        }
        for (name, v) in [
            ("--accept-rate", a.accept_rate),
            ("--abort-rate", a.abort_rate),
            ("--retry-rate", a.retry_rate),
            ("--branch-rate", a.branch_rate),
            ("--prefix-fraction", a.prefix_fraction),
            ("--copy-fail-rate", a.copy_fail_rate),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(format!("{name} {v}: must be within [0, 1]"));
            }
        }
        let shared = a.shared_prefix_pages as u64 * ps;
        let k = a.draft_len as u64;
        let per_turn = a.prompt_max as u64 + a.max_new_tokens as u64;
        let max_ctx = shared + a.turns as u64 * per_turn + 2 * k + 1;
        let max_ctx = max_ctx.div_ceil(ps) * ps;
        if max_ctx > i32::MAX as u64 / 2 {
            return Err(format!("a session can reach {max_ctx} tokens: too long for int32 token indices"));
        }
        let num_rows = a.concurrency as u64 * MAX_BRANCHES as u64;
        if num_rows > i32::MAX as u64 {
            return Err(format!("--concurrency {}: {num_rows} rows exceed int32 row numbers", a.concurrency));
        }
        let total_pages = a.pool_tokens / ps;
        let multi = a.instances != 1 || !a.router.is_empty();
        if multi && !cfg!(feature = "router") {
            return Err("--instances/--router: this skv-sim was built without the `router` feature (cargo run --release --features router --bin skv-sim)".into());
        }
        if a.instances == 0 {
            return Err("--instances 0: must be at least 1".into());
        }
        if a.batch < a.instances {
            return Err(format!(
                "--batch {}: fewer than --instances {} (each instance runs --batch / N)",
                a.batch, a.instances
            ));
        }
        match a.drain {
            Some(k) if k >= a.instances || a.instances < 2 => {
                return Err(format!(
                    "--drain {k}: needs an instance below --instances {} and another to take over",
                    a.instances
                ))
            }
            _ => {}
        }
        check_migrate(&a)?;
        if !(a.step_ms > 0.0 && a.step_ms.is_finite()) {
            return Err(format!("--step-ms {}: must be a positive number", a.step_ms));
        }
        if !(a.overlap_credit >= 0.0 && a.overlap_credit.is_finite()) {
            return Err(format!("--overlap-credit {}: must be a finite number, 0 or more", a.overlap_credit));
        }
        let instance_pages = total_pages / a.instances as u64;
        let need = max_ctx / ps + a.shared_prefix_pages as u64 + 1;
        if instance_pages < need {
            return Err(format!(
                "--pool-tokens {}: too small for one session on each of {} instance(s) ({} tokens, {} shared-prefix pages and the padding page need {} pages of {})",
                a.pool_tokens, a.instances, max_ctx, a.shared_prefix_pages, need, ps));
        }
        if total_pages * ps > 1 << 31 {
            return Err(format!("--pool-tokens {}: exceeds 2^31 (token indices are int32)", a.pool_tokens));
        }
        if a.swa_window == 0 && a.swa_eviction_interval != 1 {
            return Err(format!(
                "--swa-eviction-interval {}: needs --swa-window (a full-attention model has no window)",
                a.swa_eviction_interval
            ));
        }
        let swa_total_pages = match (a.swa_window, a.swa_pool_tokens) {
            (0, Some(t)) => {
                return Err(format!(
                    "--swa-pool-tokens {t}: needs --swa-window (a full-attention model has no SWA pool)"
                ))
            }
            (0, None) => 0,
            (_, t) => {
                // Every page a row maps takes an SWA page until the window passes it, so one
                // session's prompt needs as many SWA pages as full ones.
                let t = t.unwrap_or(a.pool_tokens);
                let pages = t / ps;
                if pages / (a.instances as u64) < need {
                    return Err(format!(
                        "--swa-pool-tokens {t}: too small for one session on each instance ({max_ctx} tokens, {} shared-prefix pages and the padding page need {need} SWA pages of {ps})",
                        a.shared_prefix_pages));
                }
                if pages * ps > 1 << 31 {
                    return Err(format!("--swa-pool-tokens {t}: exceeds 2^31 (token indices are int32)"));
                }
                pages
            }
        };
        let host_pages = check_tier(&a)?;
        Ok(Config {
            host_pages,
            shared_tokens: shared as u32,
            total_pages,
            swa_total_pages,
            num_rows: num_rows as u32,
            max_context_len: max_ctx as u32,
            multi,
            instance_pages,
            instance_batch: a.batch / a.instances,
            instance_swa_pages: swa_total_pages / a.instances as u64,
            args: a,
        })
    }
}

/// The host tier's options; its pages (0: no tier), split evenly between the instances.
fn check_tier(a: &Args) -> Result<u64, String> {
    for (name, v) in [("--copy-gbps", a.copy_gbps), ("--prefill-tokens-per-s", a.prefill_tokens_per_s)] {
        if !(v > 0.0 && v.is_finite()) {
            return Err(format!("{name} {v}: must be a positive number"));
        }
    }
    if a.kv_bytes_per_token == 0 {
        return Err("--kv-bytes-per-token 0: must be at least 1".into());
    }
    let n = a.host_pool_tokens;
    if n == 0 {
        return Ok(0);
    }
    let pages = n / a.page_size as u64;
    if pages / (a.instances.max(1) as u64) < 2 || pages * a.page_size as u64 > 1 << 31 {
        return Err(format!(
            "--host-pool-tokens {n}: must hold at least 2 pages of {} on each of {} instance(s) (page 0 is padding) and at most 2^31 tokens",
            a.page_size, a.instances
        ));
    }
    Ok(pages)
}

/// `--migrate` and its model: two instances at least, no host tier (a parked session's unit
/// names host pages the move would have to read from another pool).
fn check_migrate(a: &Args) -> Result<(), String> {
    if !(a.migrate_threshold > 0.0 && a.migrate_threshold <= 1.0) {
        return Err(format!("--migrate-threshold {}: must be within (0, 1]", a.migrate_threshold));
    }
    if !(a.link_gbps > 0.0 && a.link_gbps.is_finite()) {
        return Err(format!("--link-gbps {}: must be a positive number", a.link_gbps));
    }
    if !a.migrate {
        return Ok(());
    }
    if a.instances < 2 {
        return Err(format!("--migrate: needs --instances 2 or more (--instances {})", a.instances));
    }
    if a.host_pool_tokens > 0 {
        return Err(format!(
            "--migrate with --host-pool-tokens {}: not modelled (a session moves between device pools)",
            a.host_pool_tokens
        ));
    }
    Ok(())
}
