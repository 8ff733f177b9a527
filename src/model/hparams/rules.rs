//! The rules that relate a key to others, each the [`Key::rule`](super::schema::Key) of one row
//! of the schema (`schema::KEYS`), run after that row's own bound. Each error names the keys
//! (`{arch}.*`, as the file spells them) and their values.
use super::Hparams;

/// `key = v` must lie in `lo..=hi`; `why` says where a bound comes from.
pub(super) fn range(key: &str, v: u64, lo: u64, hi: u64, why: &str) -> Result<(), String> {
    if (lo..=hi).contains(&v) {
        Ok(())
    } else {
        Err(format!("{key} = {v}: must be in {lo}..={hi}{why}"))
    }
}

/// Rotary dimensions `key = n_rot`: rotated in pairs (even), at least one pair, at most the key
/// head `head_key = head` (ggml's rope spins forever on 0 dims).
fn check_rot(key: &str, n_rot: u64, head_key: &str, head: u64) -> Result<(), String> {
    if n_rot < 2 || n_rot > head || !n_rot.is_multiple_of(2) {
        return Err(format!(
            "{key} = {n_rot}: must be an even number in 2..={head} ({head_key} = {head})"
        ));
    }
    Ok(())
}

/// Why a model without experts does not run (an architecture without `ArchSpec::dense`).
pub(super) fn dense_model(arch: &crate::model::ArchSpec) -> String {
    format!(
        "a dense model, not a Mixture-of-Experts one: PocketMoE runs {arch} only with experts \
         (of dense models it runs the `llama` architecture)"
    )
}

/// `nextn_predict_layers` leaves a block to decode (`block_count`'s rule).
pub(super) fn decoded_blocks(h: &Hparams) -> Result<(), String> {
    let a = h.arch;
    if h.n_layer_nextn >= h.n_layer {
        return Err(format!(
            "{a}.nextn_predict_layers = {}: must be less than {a}.block_count = {} (it would \
             leave no block to decode)",
            h.n_layer_nextn, h.n_layer
        ));
    }
    Ok(())
}

/// KV heads: at most the query heads, and each serves the same number of them.
pub(super) fn kv_heads(h: &Hparams) -> Result<(), String> {
    let heads = format!(" ({})", h.key_is("attention.head_count", h.n_head));
    range(
        &h.key("attention.head_count_kv"),
        h.n_head_kv,
        1,
        h.n_head,
        &heads,
    )?;
    if !h.n_head.is_multiple_of(h.n_head_kv) {
        return Err(format!(
            "{}: must divide {} (each KV head serves the same number of query heads)",
            h.key_is("attention.head_count_kv", h.n_head_kv),
            h.key_is("attention.head_count", h.n_head)
        ));
    }
    Ok(())
}

/// Head sizes the graphs rely on (llama.cpp asserts the same when it builds them).
pub(super) fn head_sizes(h: &Hparams) -> Result<(), String> {
    let a = h.arch;
    if a.rules.one_head_size && h.head_dim_v != h.head_dim_k {
        return Err(format!(
            "{}: must equal {} (keys and values share one head size in {a})",
            h.key_is("attention.value_length", h.head_dim_v),
            h.key_is("attention.key_length", h.head_dim_k)
        ));
    }
    if a.rules.square_q && h.n_head * h.head_dim_k != h.n_embd {
        return Err(format!(
            "{}: times {} must make {} (the query projection is square in {a})",
            h.key_is("attention.key_length", h.head_dim_k),
            h.key_is("attention.head_count", h.n_head),
            h.key_is("embedding_length", h.n_embd)
        ));
    }
    Ok(())
}

/// Rotary dimensions: in pairs, within the key head (the decompressed one in MLA files), the
/// whole head where the architecture rotates whole heads.
pub(super) fn rotary(h: &Hparams) -> Result<(), String> {
    let a = h.arch;
    let (head_key, head) = if h.mla.head_dim_k > h.head_dim_k {
        ("attention.key_length_mla", h.mla.head_dim_k)
    } else {
        ("attention.key_length", h.head_dim_k)
    };
    check_rot(
        &h.key("rope.dimension_count"),
        h.n_rot,
        &h.key(head_key),
        head,
    )?;
    if a.rules.whole_head_rope && h.n_rot != h.head_dim_k {
        return Err(format!(
            "{} = {}: must equal {} = {} ({a} rotates whole heads)",
            h.key("rope.dimension_count"),
            h.n_rot,
            h.key("attention.key_length"),
            h.head_dim_k
        ));
    }
    Ok(())
}

/// Leading dense blocks need a dense FFN width.
pub(super) fn dense_ffn(h: &Hparams) -> Result<(), String> {
    let lead = h.n_layer_dense_lead as u64;
    if lead > 0 && h.n_ff == 0 {
        return Err(format!(
            "{}: must be positive, it sizes the FFN of the dense blocks ({})",
            h.key_is("feed_forward_length", 0),
            h.key_is("leading_dense_block_count", lead)
        ));
    }
    Ok(())
}

/// A model without experts: a dense model where the architecture runs those (none used, every
/// block a dense FFN), else refused.
pub(super) fn no_experts(h: &Hparams) -> Result<(), String> {
    if h.n_expert > 0 {
        return Ok(());
    }
    if !h.arch.dense {
        return Err(format!(
            "{}: {}",
            h.key_is("expert_count", 0),
            dense_model(h.arch)
        ));
    }
    // llama.cpp: without experts none is used.
    if h.n_expert_used != 0 {
        return Err(format!(
            "{}: must be 0 in a model without experts ({})",
            h.key_is("expert_used_count", h.n_expert_used),
            h.key_is("expert_count", 0)
        ));
    }
    if h.n_ff == 0 {
        return Err(format!(
            "{}: must be positive, it sizes the FFN of every block of a model without experts",
            h.key_is("feed_forward_length", 0)
        ));
    }
    Ok(())
}

/// ` (expert_count = n)`, the bound's reason.
fn of_experts(h: &Hparams) -> String {
    format!(" ({})", h.key_is("expert_count", h.n_expert))
}

/// At least one expert used, at most all.
pub(super) fn used_experts(h: &Hparams) -> Result<(), String> {
    let key = h.key("expert_used_count");
    range(&key, h.n_expert_used, 1, h.n_expert, &of_experts(h))
}

/// At least one decoded block is MoE.
pub(super) fn dense_lead(h: &Hparams) -> Result<(), String> {
    let n_decode = h.n_layer_decode() as u64;
    range(
        &h.key("leading_dense_block_count"),
        h.n_layer_dense_lead as u64,
        0,
        n_decode - 1,
        &format!(
            " (at least one of the {n_decode} decoded blocks must be MoE: {}, {})",
            h.key_is("block_count", h.n_layer as u64),
            h.key_is("nextn_predict_layers", h.n_layer_nextn as u64)
        ),
    )
}

/// At most one routing group per expert.
pub(super) fn groups(h: &Hparams) -> Result<(), String> {
    let key = h.key("expert_group_count");
    range(&key, h.n_expert_groups, 0, h.n_expert, &of_experts(h))
}

/// Group-limited routing: the selected groups within the groups, equal groups of at least two
/// experts that hold the experts used.
pub(super) fn groups_used(h: &Hparams) -> Result<(), String> {
    let (groups, used) = (h.n_expert_groups, h.n_group_used);
    if used > groups {
        return Err(format!(
            "{}: must be at most {}",
            h.key_is("expert_group_used_count", used),
            h.key_is("expert_group_count", groups)
        ));
    }
    if groups > 1 {
        if !h.n_expert.is_multiple_of(groups) {
            return Err(format!(
                "{}: must divide {} into equal groups",
                h.key_is("expert_group_count", groups),
                h.key_is("expert_count", h.n_expert)
            ));
        }
        let per = h.n_expert / groups;
        if used > 0 && per < 2 {
            return Err(format!(
                "{}: leaves {per} expert per group of {}; group-limited routing scores a \
                 group by its two best experts (at most expert_count / 2 groups)",
                h.key_is("expert_group_count", groups),
                h.key_is("expert_count", h.n_expert)
            ));
        }
        if used > 0 && h.n_expert_used > used * per {
            return Err(format!(
                "{}: more than the {} experts of the {} selected groups ({})",
                h.key_is("expert_used_count", h.n_expert_used),
                used * per,
                used,
                h.key_is("expert_group_used_count", used)
            ));
        }
    }
    Ok(())
}

/// Sliding-window blocks need a window, and their rotary dims fit their key heads.
pub(super) fn window(h: &Hparams) -> Result<(), String> {
    let Some(il) = h.swa.layers.iter().position(|&w| w) else {
        return Ok(());
    };
    if h.swa.window == 0 {
        return Err(format!(
            "{} = 0: must be positive (block {il} and others use sliding-window attention)",
            h.key("attention.sliding_window")
        ));
    }
    if h.swa.n_rot > 0 {
        let (hk, head) = if h.swa.head_dim_k > 0 {
            ("attention.key_length_swa", h.swa.head_dim_k)
        } else {
            ("attention.key_length", h.head_dim_k)
        };
        check_rot(
            &h.key("rope.dimension_count_swa"),
            h.swa.n_rot,
            &h.key(hk),
            head,
        )?;
    }
    Ok(())
}
