//! The routed-expert matrices: their GGUF names and the enum that indexes per-matrix arrays.

/// The routed-expert matrices, in the order the graph uses them: `blk.N.<mat>.weight` are the
/// tensors of role `Role::RoutedExperts`, the non-resident ones (tested in `arch::tests`).
pub const MATS: [&str; 3] = ["ffn_up_exps", "ffn_gate_exps", "ffn_down_exps"];

/// One of the routed-expert matrices: what indexes [`MATS`] and every per-matrix array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertMat {
    Up,
    Gate,
    Down,
}

impl ExpertMat {
    /// In the graph's order (that of [`MATS`]).
    pub const ALL: [Self; 3] = [Self::Up, Self::Gate, Self::Down];

    /// Its place in [`MATS`] and in per-matrix arrays.
    pub fn index(self) -> usize {
        self as usize
    }

    /// The GGUF name part, `ffn_up_exps` etc.
    pub fn name(self) -> &'static str {
        MATS[self.index()]
    }
}
