//! [`Val`]: a key's value as the schema (`super::schema`) reads, checks and lists it.

/// A key's value as the schema reads and writes it.
#[derive(Debug, Clone, PartialEq)]
pub enum Val {
    U(u64),
    F(f32),
    B(bool),
    /// What a custom row shows (`inspect`).
    Text(String),
}

impl Val {
    /// The integer (0 for another kind).
    pub fn u(&self) -> u64 {
        match *self {
            Val::U(v) => v,
            _ => 0,
        }
    }

    /// The number (0 for another kind).
    pub fn f(&self) -> f32 {
        match *self {
            Val::F(v) => v,
            _ => 0.0,
        }
    }

    /// The flag (false for another kind).
    pub fn b(&self) -> bool {
        matches!(self, Val::B(true))
    }
}

impl std::fmt::Display for Val {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Val::U(v) => write!(f, "{v}"),
            Val::F(v) => write!(f, "{v}"),
            Val::B(v) => write!(f, "{v}"),
            Val::Text(s) => f.write_str(s),
        }
    }
}
