//! Checks a GGUF's tensors against its architecture's table: every expected tensor present with
//! the expected shape, nothing unexpected, and types that make sense for the role. Each finding
//! names the tensor; a wrong shape or a missing tensor also names the metadata keys (with their
//! values) that the expectation follows from, since either the tensor or those keys are wrong.
//! Classification (`role_of`) is what the placement planner uses.
use super::hparams::schema::{Ty, Val, KEYS};
use super::{ArchSpec, Hparams, Role, TensorSpec};
use crate::ggml::GgmlType;
use crate::gguf::TensorInfo;
use std::collections::HashMap;

/// One problem with a file, naming the tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    Missing {
        name: String,
        /// Metadata (`key = value`) that makes the tensor expected, see [`Finding::Shape`].
        because: Vec<String>,
    },
    MissingOptional {
        name: String,
    },
    Unexpected {
        name: String,
    },
    /// A `blk.N.*` tensor with N at or past the block count: the file has more blocks than its
    /// metadata says (llama.cpp refuses the extra tensors).
    BeyondBlocks {
        name: String,
        /// `{arch}.block_count = n`.
        block_count: String,
    },
    Shape {
        name: String,
        expected: Vec<u64>,
        found: Vec<u64>,
        /// The metadata (`key = value`) the expected shape follows from.
        from: Vec<String>,
    },
    Type {
        name: String,
        ty: GgmlType,
        why: &'static str,
    },
}

impl Finding {
    /// Whether llama.cpp would refuse the file for this.
    pub fn is_error(&self) -> bool {
        !matches!(
            self,
            Finding::MissingOptional { .. } | Finding::Unexpected { .. }
        )
    }
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Finding::Missing { name, because } => {
                write!(f, "missing required tensor {name}")?;
                if !because.is_empty() {
                    write!(f, " (expected given {})", because.join(", "))?;
                }
                Ok(())
            }
            Finding::MissingOptional { name } => write!(f, "optional tensor {name} is absent"),
            Finding::Unexpected { name } => write!(
                f,
                "unexpected tensor {name} (not in the architecture's table)"
            ),
            Finding::Shape {
                name,
                expected,
                found,
                from,
            } => {
                write!(
                    f,
                    "tensor {name} has shape {found:?}, expected {expected:?}"
                )?;
                if !from.is_empty() {
                    write!(f, " from {}", from.join(", "))?;
                }
                Ok(())
            }
            Finding::Type { name, ty, why } => write!(f, "tensor {name} has type {ty}: {why}"),
            Finding::BeyondBlocks { name, block_count } => write!(
                f,
                "tensor {name} belongs to a block past {block_count} (blocks are numbered from 0)"
            ),
        }
    }
}

/// Result of validating a model: findings plus the role of every tensor in the file.
#[derive(Debug, Clone)]
pub struct Validation {
    pub findings: Vec<Finding>,
    pub roles: HashMap<String, Role>,
}

impl Validation {
    pub fn errors(&self) -> impl Iterator<Item = &Finding> {
        self.findings.iter().filter(|f| f.is_error())
    }

    pub fn is_ok(&self) -> bool {
        self.errors().next().is_none()
    }
}

/// Validates `tensors` against `arch` for hyper-parameters `hp`.
pub fn validate(arch: &ArchSpec, hp: &Hparams, tensors: &[TensorInfo]) -> Validation {
    let by_name: HashMap<&str, &TensorInfo> =
        tensors.iter().map(|t| (t.name.as_str(), t)).collect();
    let mut findings = Vec::new();
    let mut roles = HashMap::new();
    for (name, spec, block) in arch.expected_tensors(hp) {
        let Some(t) = by_name.get(name.as_str()) else {
            let required = arch.required_in(spec, hp, block);
            findings.push(if required {
                let because = explain(hp, |h| expects(arch, h, spec, block));
                Finding::Missing { name, because }
            } else {
                Finding::MissingOptional { name }
            });
            continue;
        };
        let expected = (spec.shape)(hp, block.unwrap_or(0));
        if t.shape() != expected.as_slice() {
            let il = block.unwrap_or(0);
            let from = explain(hp, |h| (spec.shape)(h, il) == expected);
            findings.push(Finding::Shape {
                name: name.clone(),
                expected,
                found: t.shape().to_vec(),
                from,
            });
        }
        let one_dim = t.shape().iter().filter(|&&d| d > 1).count() <= 1;
        if one_dim && t.ty.is_quantized() {
            findings.push(Finding::Type {
                name: name.clone(),
                ty: t.ty,
                why: "vectors (norms, biases) must be F32/F16/BF16",
            });
        }
        if t.ty == GgmlType::I32 && spec.role != Role::Router {
            findings.push(Finding::Type {
                name: name.clone(),
                ty: t.ty,
                why: "integer tensors hold no weights (only routing tables may be I32)",
            });
        }
        roles.insert(name, spec.role);
    }
    for t in tensors {
        if !roles.contains_key(&t.name) {
            let block = super::block_of(&t.name);
            if block.is_some_and(|il| il >= hp.n_layer) {
                findings.push(Finding::BeyondBlocks {
                    name: t.name.clone(),
                    block_count: format!("{}.block_count = {}", hp.arch, hp.n_layer),
                });
            }
            findings.push(Finding::Unexpected {
                name: t.name.clone(),
            });
            roles.insert(t.name.clone(), Role::Other);
        }
    }
    Validation { findings, roles }
}

/// Whether a file for `hp` must hold `spec` in `block` (None: a global tensor).
fn expects(arch: &ArchSpec, hp: &Hparams, spec: &TensorSpec, block: Option<usize>) -> bool {
    block.is_none_or(|il| il < hp.n_layer && spec.in_layer(hp, il))
        && arch.required_in(spec, hp, block)
}

/// The fields (`{arch}.key = value`) on which `holds` depends: those for which `holds(hp)` is
/// true but turns false when the field alone is one more or (from 2 up) one less.
fn explain(hp: &Hparams, holds: impl Fn(&Hparams) -> bool) -> Vec<String> {
    // The integer keys of the schema (shapes and block predicates read only those).
    KEYS.iter()
        .filter(|k| k.ty == Ty::Uint)
        .filter(|k| {
            let v = (k.get)(hp).u();
            [v.checked_add(1), v.checked_sub(1).filter(|&w| w >= 1)]
                .into_iter()
                .flatten()
                .any(|w| {
                    let mut h = hp.clone();
                    (k.set)(&mut h, Val::U(w));
                    !holds(&h)
                })
        })
        .map(|k| format!("{} = {}", k.full(hp), (k.get)(hp)))
        .collect()
}
