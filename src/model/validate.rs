//! Checks a GGUF's tensors against its architecture's table: every expected tensor present with
//! the expected shape, nothing unexpected, and types that make sense for the role. Each finding
//! names the tensor. Classification (`role_of`) is what the placement planner uses.
use super::{ArchSpec, Hparams, Role};
use crate::ggml::GgmlType;
use crate::gguf::TensorInfo;
use std::collections::HashMap;

/// One problem with a file, naming the tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    Missing {
        name: String,
    },
    MissingOptional {
        name: String,
    },
    Unexpected {
        name: String,
    },
    Shape {
        name: String,
        expected: Vec<u64>,
        found: Vec<u64>,
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
            Finding::Missing { name } => write!(f, "missing required tensor {name}"),
            Finding::MissingOptional { name } => write!(f, "optional tensor {name} is absent"),
            Finding::Unexpected { name } => write!(
                f,
                "unexpected tensor {name} (not in the architecture's table)"
            ),
            Finding::Shape {
                name,
                expected,
                found,
            } => write!(
                f,
                "tensor {name} has shape {found:?}, expected {expected:?}"
            ),
            Finding::Type { name, ty, why } => write!(f, "tensor {name} has type {ty}: {why}"),
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
                Finding::Missing { name }
            } else {
                Finding::MissingOptional { name }
            });
            continue;
        };
        let expected = (spec.shape)(hp, block.unwrap_or(0));
        if t.shape() != expected.as_slice() {
            findings.push(Finding::Shape {
                name: name.clone(),
                expected,
                found: t.shape().to_vec(),
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
            findings.push(Finding::Unexpected {
                name: t.name.clone(),
            });
            roles.insert(t.name.clone(), Role::Other);
        }
    }
    Validation { findings, roles }
}
