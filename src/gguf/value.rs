//! GGUF metadata values: `GgufValueType` (the on-disk type tags), `GgufValue` (one value) and
//! `GgufArray` (a typed array; arrays of arrays nest), with lossless typed accessors and the
//! little-endian encoding the writer uses.
//!
//! Follows the GGUF spec (ggml/docs/gguf.md) and ggml's `gguf.cpp`: type ids 0..=12, bools are one
//! byte 0/1, strings are `u64 length + UTF-8 bytes`, an array is `u32 element type, u64 count,
//! elements`, where an element of type ARRAY is again `type, count, elements`.
//!
//! Invariants: an array's elements all have one type (enforced by the typed `GgufArray`); a
//! value's nesting depth is `GgufValue::depth()`, which reader and writer both cap at
//! [`MAX_ARRAY_DEPTH`]. Accessors never convert lossily except `as_f32` from F64 (rounded).
use std::fmt;

/// Deepest array nesting reader and writer accept (an array of scalars has depth 1).
pub const MAX_ARRAY_DEPTH: u32 = 8;

/// The type tag of a GGUF metadata value (`enum gguf_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum GgufValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    Str = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl GgufValueType {
    /// Checked conversion from an on-disk tag.
    pub fn from_u32(id: u32) -> Option<Self> {
        use GgufValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => Str,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// Fixed byte size of a scalar of this type; `None` for STRING and ARRAY.
    pub fn fixed_size(self) -> Option<usize> {
        use GgufValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            Str | Array => None,
        }
    }

    /// Smallest possible encoding of one element: a string is at least its u64 length, an
    /// array at least its u32 type and u64 count.
    pub fn min_size(self) -> usize {
        match self {
            GgufValueType::Str => 8,
            GgufValueType::Array => 12,
            t => t.fixed_size().unwrap_or(1),
        }
    }

    pub fn name(self) -> &'static str {
        use GgufValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            Str => "str",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }
}

impl fmt::Display for GgufValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    U64(u64),
    I64(i64),
    F64(f64),
    Array(GgufArray),
}

/// A typed array; `Array` holds arrays of arrays, each inner array with its own element type.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufArray {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    Str(Vec<String>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
    Array(Vec<GgufArray>),
}

/// Applies `$body` to the vector inside any `GgufArray` variant.
macro_rules! each_array {
    ($arr:expr, $v:ident => $body:expr) => {
        match $arr {
            GgufArray::U8($v) => $body,
            GgufArray::I8($v) => $body,
            GgufArray::U16($v) => $body,
            GgufArray::I16($v) => $body,
            GgufArray::U32($v) => $body,
            GgufArray::I32($v) => $body,
            GgufArray::F32($v) => $body,
            GgufArray::Bool($v) => $body,
            GgufArray::Str($v) => $body,
            GgufArray::U64($v) => $body,
            GgufArray::I64($v) => $body,
            GgufArray::F64($v) => $body,
            GgufArray::Array($v) => $body,
        }
    };
}

impl GgufValue {
    pub fn value_type(&self) -> GgufValueType {
        use GgufValue as V;
        match self {
            V::U8(_) => GgufValueType::U8,
            V::I8(_) => GgufValueType::I8,
            V::U16(_) => GgufValueType::U16,
            V::I16(_) => GgufValueType::I16,
            V::U32(_) => GgufValueType::U32,
            V::I32(_) => GgufValueType::I32,
            V::F32(_) => GgufValueType::F32,
            V::Bool(_) => GgufValueType::Bool,
            V::Str(_) => GgufValueType::Str,
            V::U64(_) => GgufValueType::U64,
            V::I64(_) => GgufValueType::I64,
            V::F64(_) => GgufValueType::F64,
            V::Array(_) => GgufValueType::Array,
        }
    }

    /// `"u32"`, `"str"`, `"array[f32]"`, `"array[array]"`, ...: for messages.
    pub fn type_name(&self) -> String {
        match self {
            GgufValue::Array(a) => format!("array[{}]", a.elem_type()),
            v => v.value_type().name().to_string(),
        }
    }

    /// The value as an integer, for any integer type (not bool, not float).
    pub fn as_i128(&self) -> Option<i128> {
        use GgufValue as V;
        Some(match *self {
            V::U8(v) => v.into(),
            V::I8(v) => v.into(),
            V::U16(v) => v.into(),
            V::I16(v) => v.into(),
            V::U32(v) => v.into(),
            V::I32(v) => v.into(),
            V::U64(v) => v.into(),
            V::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// Any integer type whose value fits in u32 (U8, U16, U32, I32 >= 0, U64 <= u32::MAX, ...).
    pub fn as_u32(&self) -> Option<u32> {
        self.as_i128().and_then(|v| v.try_into().ok())
    }
    pub fn as_u64(&self) -> Option<u64> {
        self.as_i128().and_then(|v| v.try_into().ok())
    }
    pub fn as_i32(&self) -> Option<i32> {
        self.as_i128().and_then(|v| v.try_into().ok())
    }
    pub fn as_i64(&self) -> Option<i64> {
        self.as_i128().and_then(|v| v.try_into().ok())
    }

    /// F32; F64 rounded to the nearest f32; integers of magnitude <= 2^24 (exact).
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            GgufValue::F32(v) => Some(v),
            GgufValue::F64(v) => Some(v as f32),
            _ => self
                .as_i128()
                .filter(|v| v.unsigned_abs() <= 1 << 24)
                .map(|v| v as f32),
        }
    }

    /// F32, F64, integers of magnitude <= 2^53 (all exact).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v.into()),
            GgufValue::F64(v) => Some(v),
            _ => self
                .as_i128()
                .filter(|v| v.unsigned_abs() <= 1 << 53)
                .map(|v| v as f64),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&GgufArray> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// Array nesting depth: 0 for scalars, 1 for an array of scalars, ...
    pub fn depth(&self) -> u32 {
        match self {
            GgufValue::Array(a) => a.depth(),
            _ => 0,
        }
    }

    /// Appends the value's encoding (without its type tag) to `out`.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        use GgufValue as V;
        match self {
            V::U8(v) => out.push(*v),
            V::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
            V::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
            V::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
            V::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
            V::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
            V::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
            V::Bool(v) => out.push(u8::from(*v)),
            V::Str(s) => encode_str(s, out),
            V::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
            V::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
            V::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
            V::Array(a) => a.encode(out),
        }
    }
}

/// Appends a GGUF string (u64 length, bytes).
pub(crate) fn encode_str(s: &str, out: &mut Vec<u8>) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

impl GgufArray {
    pub fn elem_type(&self) -> GgufValueType {
        use GgufValueType as T;
        match self {
            GgufArray::U8(_) => T::U8,
            GgufArray::I8(_) => T::I8,
            GgufArray::U16(_) => T::U16,
            GgufArray::I16(_) => T::I16,
            GgufArray::U32(_) => T::U32,
            GgufArray::I32(_) => T::I32,
            GgufArray::F32(_) => T::F32,
            GgufArray::Bool(_) => T::Bool,
            GgufArray::Str(_) => T::Str,
            GgufArray::U64(_) => T::U64,
            GgufArray::I64(_) => T::I64,
            GgufArray::F64(_) => T::F64,
            GgufArray::Array(_) => T::Array,
        }
    }

    pub fn len(&self) -> usize {
        each_array!(self, v => v.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` as a `GgufValue` (cloned).
    pub fn get(&self, i: usize) -> Option<GgufValue> {
        use GgufValue as V;
        Some(match self {
            GgufArray::U8(v) => V::U8(*v.get(i)?),
            GgufArray::I8(v) => V::I8(*v.get(i)?),
            GgufArray::U16(v) => V::U16(*v.get(i)?),
            GgufArray::I16(v) => V::I16(*v.get(i)?),
            GgufArray::U32(v) => V::U32(*v.get(i)?),
            GgufArray::I32(v) => V::I32(*v.get(i)?),
            GgufArray::F32(v) => V::F32(*v.get(i)?),
            GgufArray::Bool(v) => V::Bool(*v.get(i)?),
            GgufArray::Str(v) => V::Str(v.get(i)?.clone()),
            GgufArray::U64(v) => V::U64(*v.get(i)?),
            GgufArray::I64(v) => V::I64(*v.get(i)?),
            GgufArray::F64(v) => V::F64(*v.get(i)?),
            GgufArray::Array(v) => V::Array(v.get(i)?.clone()),
        })
    }

    pub fn as_strs(&self) -> Option<&[String]> {
        match self {
            GgufArray::Str(v) => Some(v),
            _ => None,
        }
    }
    pub fn as_i32s(&self) -> Option<&[i32]> {
        match self {
            GgufArray::I32(v) => Some(v),
            _ => None,
        }
    }
    pub fn as_u32s(&self) -> Option<&[u32]> {
        match self {
            GgufArray::U32(v) => Some(v),
            _ => None,
        }
    }
    pub fn as_f32s(&self) -> Option<&[f32]> {
        match self {
            GgufArray::F32(v) => Some(v),
            _ => None,
        }
    }
    pub fn as_bools(&self) -> Option<&[bool]> {
        match self {
            GgufArray::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// Every element as i64, for an array of any integer type whose values all fit.
    pub fn to_i64_vec(&self) -> Option<Vec<i64>> {
        (0..self.len())
            .map(|i| self.get(i).and_then(|v| v.as_i64()))
            .collect()
    }

    /// Every element as f32 (see [`GgufValue::as_f32`] for the conversions allowed).
    pub fn to_f32_vec(&self) -> Option<Vec<f32>> {
        match self {
            GgufArray::F32(v) => Some(v.clone()),
            _ => (0..self.len())
                .map(|i| self.get(i).and_then(|v| v.as_f32()))
                .collect(),
        }
    }

    /// Nesting depth: 1 for an array of scalars, 1 + the deepest inner array otherwise.
    pub fn depth(&self) -> u32 {
        match self {
            GgufArray::Array(inner) => 1 + inner.iter().map(|a| a.depth()).max().unwrap_or(0),
            _ => 1,
        }
    }

    /// Appends `elem type, count, elements`.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.elem_type() as u32).to_le_bytes());
        out.extend_from_slice(&(self.len() as u64).to_le_bytes());
        match self {
            GgufArray::U8(v) => out.extend_from_slice(v),
            GgufArray::Bool(v) => out.extend(v.iter().map(|&b| u8::from(b))),
            GgufArray::Str(v) => v.iter().for_each(|s| encode_str(s, out)),
            GgufArray::Array(v) => v.iter().for_each(|a| a.encode(out)),
            GgufArray::I8(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
            GgufArray::U16(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
            GgufArray::I16(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
            GgufArray::U32(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
            GgufArray::I32(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
            GgufArray::F32(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
            GgufArray::U64(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
            GgufArray::I64(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
            GgufArray::F64(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        }
    }
}

/// Short form for listings: strings quoted, arrays cut after 8 elements with the total count.
impl fmt::Display for GgufValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use GgufValue as V;
        match self {
            V::U8(v) => write!(f, "{v}"),
            V::I8(v) => write!(f, "{v}"),
            V::U16(v) => write!(f, "{v}"),
            V::I16(v) => write!(f, "{v}"),
            V::U32(v) => write!(f, "{v}"),
            V::I32(v) => write!(f, "{v}"),
            V::F32(v) => write!(f, "{v}"),
            V::Bool(v) => write!(f, "{v}"),
            V::Str(v) => write!(f, "{v:?}"),
            V::U64(v) => write!(f, "{v}"),
            V::I64(v) => write!(f, "{v}"),
            V::F64(v) => write!(f, "{v}"),
            V::Array(a) => write!(f, "{a}"),
        }
    }
}

impl fmt::Display for GgufArray {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 8;
        f.write_str("[")?;
        for i in 0..self.len().min(SHOWN) {
            if i > 0 {
                f.write_str(", ")?;
            }
            if let Some(v) = self.get(i) {
                write!(f, "{v}")?;
            }
        }
        if self.len() > SHOWN {
            write!(f, ", … ({} {} items)", self.len(), self.elem_type())?;
        }
        f.write_str("]")
    }
}

macro_rules! from_scalar {
    ($($t:ty => $v:ident),* $(,)?) => {$(
        impl From<$t> for GgufValue {
            fn from(x: $t) -> Self { GgufValue::$v(x) }
        }
        impl From<Vec<$t>> for GgufArray {
            fn from(x: Vec<$t>) -> Self { GgufArray::$v(x) }
        }
        impl From<Vec<$t>> for GgufValue {
            fn from(x: Vec<$t>) -> Self { GgufValue::Array(GgufArray::$v(x)) }
        }
    )*};
}
from_scalar!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, f32 => F32,
    bool => Bool, String => Str, u64 => U64, i64 => I64, f64 => F64);

impl From<&str> for GgufValue {
    fn from(s: &str) -> Self {
        GgufValue::Str(s.to_string())
    }
}

impl From<Vec<&str>> for GgufValue {
    fn from(v: Vec<&str>) -> Self {
        GgufValue::Array(GgufArray::Str(v.into_iter().map(str::to_string).collect()))
    }
}

impl From<GgufArray> for GgufValue {
    fn from(a: GgufArray) -> Self {
        GgufValue::Array(a)
    }
}

impl From<Vec<GgufArray>> for GgufValue {
    fn from(v: Vec<GgufArray>) -> Self {
        GgufValue::Array(GgufArray::Array(v))
    }
}
