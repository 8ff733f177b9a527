//! `pocketmoe self-check`: which ggml backends and devices this binary has, and whether each one
//! multiplies quantised matrices correctly.
//!
//! The check is the foundation smoke test: a ggml graph computes `W·x` with `W` quantised
//! (Q4_K, Q8_0, Q6_K, IQ2_XXS, MXFP4) and `x` f32, and the result is compared with a dequantise-
//! then-dot reference in f64. The dequantiser is our pure-Rust one ([`crate::ggml::refquant`])
//! where we have one, else ggml's `to_float` (IQ2_XXS: its codebook is ggml's table).
use crate::ggml::{quant, refquant, Backend, Context, GgmlType, Graph, Result};
use crate::util::Rng;

/// The quantised types the smoke test covers.
pub const SMOKE_TYPES: [GgmlType; 5] = [
    GgmlType::Q4_K,
    GgmlType::Q8_0,
    GgmlType::Q6_K,
    GgmlType::IQ2_XXS,
    GgmlType::MXFP4,
];

/// NMSE above which a quantised matvec counts as wrong. The only expected error is ggml's
/// quantisation of `x` to the type's vec-dot format (q8_0/q8_K/q8_1): 3e-5..5e-5 measured on the
/// CPU backend, so the limit leaves a 10x margin.
pub const MATVEC_NMSE_MAX: f64 = 5e-4;

/// Where the reference dequantisation came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reference {
    Rust,
    GgmlToFloat,
}

#[derive(Debug, Clone)]
pub struct MatvecCheck {
    pub ty: GgmlType,
    pub backend: String,
    pub rows: usize,
    pub cols: usize,
    pub nmse: f64,
    pub reference: Reference,
    /// `W·x` as ggml computed it, and the reference.
    pub got: Vec<f32>,
    pub want: Vec<f32>,
}

impl MatvecCheck {
    pub fn passed(&self) -> bool {
        self.nmse <= MATVEC_NMSE_MAX
    }
}

/// Computes `W·x` on `backend` with `W` [cols, rows] of type `ty` and compares it with the
/// reference. `cols` must be a multiple of 256 (the K-quant block).
pub fn matvec(
    backend: &Backend,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    seed: u64,
) -> Result<MatvecCheck> {
    let mut rng = Rng::new(seed);
    let w_f32 = rng.normals(rows * cols, 0.02);
    let x = rng.normals(cols, 1.0);
    let w_q = quant::quantize(ty, &w_f32, cols, None)?;

    let (w_deq, reference) = match refquant::dequantize(ty, &w_q) {
        Some(v) => (v, Reference::Rust),
        None => (
            quant::dequantize(ty, &w_q, rows * cols)?,
            Reference::GgmlToFloat,
        ),
    };
    let want: Vec<f32> = w_deq
        .chunks_exact(cols)
        .map(|row| {
            row.iter()
                .zip(&x)
                .map(|(&a, &b)| a as f64 * b as f64)
                .sum::<f64>() as f32
        })
        .collect();

    let ctx = Context::new(8, 16)?;
    let w = ctx
        .new_tensor(ty, &[cols as i64, rows as i64])?
        .set_name("w"); // [cols, rows]
    let xt = ctx
        .new_tensor(GgmlType::F32, &[cols as i64, 1])?
        .set_name("x"); // [cols, 1]
    let y = ctx.mul_mat(w, xt).set_name("y"); // [rows, 1]
    let graph = Graph::new(&ctx, 16);
    graph.build_forward(y);
    ctx.alloc_tensors(backend)?;
    w.write_bytes(&w_q)?;
    xt.write_f32(&x)?;
    backend.compute(&graph)?;
    let got = y.read_f32()?;
    Ok(MatvecCheck {
        ty,
        backend: backend.name(),
        rows,
        cols,
        nmse: quant::nmse(&got, &want),
        reference,
        got,
        want,
    })
}
