//! Building blocks shared by every architecture: norms, attention, MoE and dense FFNs, in/out.
pub mod attention;
pub mod dsa;
pub mod dsv4;
pub mod ffn;
pub mod io;
pub mod mla;
pub mod moe;
pub mod norm;
pub mod rope;

pub use attention::AttnOpts;
pub use moe::{ExpertAct, MoeOpts, Resident, RoutedExperts};
