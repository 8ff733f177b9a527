//! Token embedding lookup and the output head.
use crate::ggml::Tensor;
use crate::graph::GraphBuilder;

impl<'a> GraphBuilder<'a> {
    /// `token_embd` rows of the batch's tokens -> [n_embd, n_tokens] (f32).
    pub fn embed(&self) -> Tensor<'a> {
        if let Some(rows) = self.batch.embd_rows {
            return rows;
        }
        let table = self.t(self.w.layers().io().embd);
        let e = self.ctx.get_rows(table, self.batch.tokens);
        self.cb(e, "inp_embd", -1)
    }

    /// Final norm and output projection (tied to `token_embd` when `output` is absent)
    /// -> [n_vocab, n_tokens].
    pub fn output(&self, x: Tensor<'a>) -> Tensor<'a> {
        self.output_head(self.select_outputs(x))
    }

    /// The columns of `x` [n, n_tokens] whose logits are wanted (all, the last, or the batch's
    /// `out_ids`): dropping the others before the head saves its matmul.
    pub fn select_outputs(&self, x: Tensor<'a>) -> Tensor<'a> {
        if let Some(ids) = self.batch.out_ids {
            self.ctx.get_rows(x, ids) // [n, n_outputs]
        } else if self.batch.last_only && self.batch.n_tokens > 1 {
            let ne0 = x.ne()[0];
            let row = ne0 as usize * 4;
            self.ctx
                .view(x, &[ne0, 1], &[row], (self.batch.n_tokens - 1) * row) // [n, 1]
        } else {
            x
        }
    }

    /// Final norm and output projection of the selected columns `x` [n_embd, n_out]; with
    /// `batch.embd`, the final norm only -> [n_embd, n_out] (the embeddings' input).
    pub fn output_head(&self, x: Tensor<'a>) -> Tensor<'a> {
        let io = self.w.layers().io();
        let x = self.rms_norm(x, self.t(io.output_norm), "result_norm", -1);
        if self.batch.embd {
            return x;
        }
        self.cb(self.ctx.mul_mat(self.t(io.head), x), "result_output", -1)
    }
}
