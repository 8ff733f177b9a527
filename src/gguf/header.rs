//! The GGUF header parser: `GgufHeader::parse(path, bytes)` reads and validates magic, version,
//! metadata and tensor index of one GGUF file held in a byte slice (the mmap of the file, or any
//! buffer: the fuzz tests feed it arbitrary bytes).
//!
//! Follows ggml's `gguf.cpp` (`gguf_init_from_reader`) and the GGUF spec: little-endian only;
//! versions 2 and 3; `general.alignment` must be a u32 power of two (default 32); the data section
//! starts at the end of the tensor infos rounded up to the alignment (not rounded when there are
//! no tensors, as in ggml); tensor offsets are relative to it and multiples of the alignment.
//! Stricter than ggml where ggml defers to later checks: tensor data must lie inside the file and
//! must not overlap, no dimension may be 0, n_dims is 1..=4. Looser: tensors need not be stored
//! contiguously in index order (ggml's reader requires that; our writer produces it).
//!
//! Invariants: parsing never panics and never allocates in proportion to a length field before
//! checking it against the bytes that remain (and reserves at most `PREALLOC_MAX` entries for
//! any count: memory grows only with what actually parses); a returned header's tensors all have
//! `offset - data_offset` a multiple of the alignment, `offset + n_bytes <= file_size`, and are
//! pairwise disjoint.
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use indexmap::IndexMap;

use super::error::{FormatError, GgufError};
use super::value::{GgufArray, GgufValue, GgufValueType, MAX_ARRAY_DEPTH};
use super::{Metadata, DEFAULT_ALIGNMENT, GGUF_MAGIC, KEY_ALIGNMENT, MAX_TENSOR_NAME};
use crate::ggml::GgmlType;

/// ggml's `GGUF_MAX_STRING_LENGTH` and `GGUF_MAX_ARRAY_ELEMENTS`.
const MAX_STRING_LEN: u64 = 1 << 30;
const MAX_ARRAY_ELEMENTS: u64 = 1 << 30;
/// Most entries reserved up front for a count read from the file. A count is checked against the
/// bytes that remain, but in a multi-GB model those include the tensor data, so a corrupt count
/// could still ask for gigabytes: beyond this, collections grow only as entries actually parse.
const PREALLOC_MAX: u64 = 1024;

fn prealloc(count: u64) -> usize {
    count.min(PREALLOC_MAX) as usize
}

/// Smallest valid key-value pair: key length, a 1-byte key, type tag, a 1-byte value.
const MIN_KV_BYTES: u64 = 8 + 1 + 4 + 1;
/// Smallest tensor info: name length (empty name), n_dims, one ne, type, offset.
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 8 + 4 + 8;

/// The validated header and tensor index of one GGUF file (no tensor data).
#[derive(Clone, Debug)]
pub struct GgufHeader {
    path: PathBuf,
    version: u32,
    alignment: u64,
    data_offset: u64,
    file_size: u64,
    metadata: IndexMap<String, GgufValue>,
    kv_offsets: Vec<u64>,
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
}

/// Describes the field being read, lazily (only formatted when an error is reported).
type Field<'f> = &'f dyn Fn() -> String;

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn err(&self, at: usize, field: Field, kind: FormatError) -> GgufError {
        GgufError::Format {
            path: self.path.to_path_buf(),
            offset: at as u64,
            field: field(),
            kind,
        }
    }

    fn bytes(&mut self, n: u64, field: Field) -> Result<&'a [u8], GgufError> {
        let available = self.remaining();
        if n > available {
            let kind = FormatError::Truncated { need: n, available };
            return Err(self.err(self.pos, field, kind));
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, field: Field) -> Result<[u8; N], GgufError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.bytes(N as u64, field)?);
        Ok(a)
    }

    fn u32(&mut self, field: Field) -> Result<u32, GgufError> {
        self.array(field).map(u32::from_le_bytes)
    }

    fn u64(&mut self, field: Field) -> Result<u64, GgufError> {
        self.array(field).map(u64::from_le_bytes)
    }

    /// A GGUF string's raw bytes (length checked against the rest of the file first).
    fn str_bytes(&mut self, field: Field) -> Result<&'a [u8], GgufError> {
        let at = self.pos;
        let len = self.u64(field)?;
        if len > self.remaining() {
            let available = self.remaining();
            return Err(self.err(at, field, FormatError::StringPastEof { len, available }));
        }
        if len > MAX_STRING_LEN {
            let max = MAX_STRING_LEN;
            return Err(self.err(at, field, FormatError::StringTooLong { len, max }));
        }
        self.bytes(len, field)
    }

    fn string(&mut self, field: Field) -> Result<String, GgufError> {
        let at = self.pos + 8;
        let b = self.str_bytes(field)?;
        utf8(b).map_err(|kind| self.err(at, field, kind))
    }

    fn value(&mut self, ty: GgufValueType, field: Field) -> Result<GgufValue, GgufError> {
        use GgufValue as V;
        Ok(match ty {
            GgufValueType::U8 => V::U8(u8::from_le_bytes(self.array(field)?)),
            GgufValueType::I8 => V::I8(i8::from_le_bytes(self.array(field)?)),
            GgufValueType::U16 => V::U16(u16::from_le_bytes(self.array(field)?)),
            GgufValueType::I16 => V::I16(i16::from_le_bytes(self.array(field)?)),
            GgufValueType::U32 => V::U32(u32::from_le_bytes(self.array(field)?)),
            GgufValueType::I32 => V::I32(i32::from_le_bytes(self.array(field)?)),
            GgufValueType::F32 => V::F32(f32::from_le_bytes(self.array(field)?)),
            GgufValueType::U64 => V::U64(u64::from_le_bytes(self.array(field)?)),
            GgufValueType::I64 => V::I64(i64::from_le_bytes(self.array(field)?)),
            GgufValueType::F64 => V::F64(f64::from_le_bytes(self.array(field)?)),
            GgufValueType::Bool => V::Bool(self.bool(field)?),
            GgufValueType::Str => V::Str(self.string(field)?),
            GgufValueType::Array => V::Array(self.gguf_array(field, 1)?),
        })
    }

    fn bool(&mut self, field: Field) -> Result<bool, GgufError> {
        let at = self.pos;
        match self.array::<1>(field)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(self.err(at, field, FormatError::BadBool(b))),
        }
    }

    fn value_type(&mut self, field: Field) -> Result<GgufValueType, GgufError> {
        let at = self.pos;
        let id = self.u32(field)?;
        GgufValueType::from_u32(id)
            .ok_or_else(|| self.err(at, field, FormatError::UnknownValueType(id)))
    }

    /// `elem type, count, elements`; `depth` is 1 for a top-level array.
    fn gguf_array(&mut self, field: Field, depth: u32) -> Result<GgufArray, GgufError> {
        let at = self.pos;
        if depth > MAX_ARRAY_DEPTH {
            let kind = FormatError::ArrayTooDeep {
                depth,
                max: MAX_ARRAY_DEPTH,
            };
            return Err(self.err(at, field, kind));
        }
        let elem = self.value_type(&|| format!("{}: array element type", field()))?;
        let count_at = self.pos;
        let count_field = || format!("{}: array count", field());
        let count = self.u64(&count_field)?;
        let need = count.saturating_mul(elem.min_size() as u64);
        if need > self.remaining() {
            let available = self.remaining();
            let kind = FormatError::ArrayTooLarge {
                count,
                elem,
                need,
                available,
            };
            return Err(self.err(count_at, &count_field, kind));
        }
        if count > MAX_ARRAY_ELEMENTS {
            let kind = FormatError::ArrayCountLimit {
                count,
                max: MAX_ARRAY_ELEMENTS,
            };
            return Err(self.err(count_at, &count_field, kind));
        }
        // Fixed-size elements are copied from bytes `bytes` has checked exist; variable-size
        // ones reserve at most PREALLOC_MAX entries and grow as elements parse.
        let n = count as usize;
        let elems = || format!("{}: array elements", field());
        Ok(match elem {
            GgufValueType::U8 => GgufArray::U8(self.bytes(count, &elems)?.to_vec()),
            GgufValueType::I8 => GgufArray::I8(self.fixed(n, &elems, i8::from_le_bytes)?),
            GgufValueType::U16 => GgufArray::U16(self.fixed(n, &elems, u16::from_le_bytes)?),
            GgufValueType::I16 => GgufArray::I16(self.fixed(n, &elems, i16::from_le_bytes)?),
            GgufValueType::U32 => GgufArray::U32(self.fixed(n, &elems, u32::from_le_bytes)?),
            GgufValueType::I32 => GgufArray::I32(self.fixed(n, &elems, i32::from_le_bytes)?),
            GgufValueType::F32 => GgufArray::F32(self.fixed(n, &elems, f32::from_le_bytes)?),
            GgufValueType::U64 => GgufArray::U64(self.fixed(n, &elems, u64::from_le_bytes)?),
            GgufValueType::I64 => GgufArray::I64(self.fixed(n, &elems, i64::from_le_bytes)?),
            GgufValueType::F64 => GgufArray::F64(self.fixed(n, &elems, f64::from_le_bytes)?),
            GgufValueType::Bool => {
                let mut v = Vec::with_capacity(prealloc(count));
                for i in 0..n {
                    v.push(self.bool(&|| format!("{}[{i}]", field()))?);
                }
                GgufArray::Bool(v)
            }
            GgufValueType::Str => {
                let mut v = Vec::with_capacity(prealloc(count));
                for i in 0..n {
                    v.push(self.string(&|| format!("{}[{i}]", field()))?);
                }
                GgufArray::Str(v)
            }
            GgufValueType::Array => {
                let mut v = Vec::with_capacity(prealloc(count));
                for i in 0..n {
                    v.push(self.gguf_array(&|| format!("{}[{i}]", field()), depth + 1)?);
                }
                GgufArray::Array(v)
            }
        })
    }

    /// `n` fixed-size little-endian elements.
    fn fixed<T, const N: usize>(
        &mut self,
        n: usize,
        field: Field,
        conv: fn([u8; N]) -> T,
    ) -> Result<Vec<T>, GgufError> {
        let b = self.bytes(n as u64 * N as u64, field)?;
        Ok(b.chunks_exact(N)
            .map(|c| {
                let mut a = [0u8; N];
                a.copy_from_slice(c);
                conv(a)
            })
            .collect())
    }
}

fn utf8(b: &[u8]) -> Result<String, FormatError> {
    match std::str::from_utf8(b) {
        Ok(s) => Ok(s.to_string()),
        Err(e) => Err(FormatError::InvalidUtf8 {
            valid_up_to: e.valid_up_to(),
        }),
    }
}

fn align_up(x: u64, alignment: u64) -> Option<u64> {
    x.checked_add(alignment - 1).map(|v| v & !(alignment - 1))
}

impl GgufHeader {
    /// Parses and validates the header of a GGUF file held in `bytes`. `path` is only used in
    /// messages (and returned by [`GgufHeader::path`]).
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<Self, GgufError> {
        Self::parse_shard(path, bytes, 0)
    }

    /// As [`GgufHeader::parse`], recording `shard` in every [`TensorInfo`].
    pub(crate) fn parse_shard(path: &Path, bytes: &[u8], shard: usize) -> Result<Self, GgufError> {
        let mut c = Cursor {
            buf: bytes,
            pos: 0,
            path,
        };
        let magic: [u8; 4] = c.array(&|| "header: magic".into())?;
        if &magic != GGUF_MAGIC {
            return Err(c.err(0, &|| "header: magic".into(), FormatError::BadMagic(magic)));
        }
        let vf = || "header: version".to_string();
        let version = c.u32(&vf)?;
        let bad_version = match version {
            2 | 3 => None,
            1 => Some(FormatError::VersionV1),
            v if v != 0 && v & 0xFFFF == 0 => Some(FormatError::BigEndian(v)),
            v => Some(FormatError::UnsupportedVersion(v)),
        };
        if let Some(kind) = bad_version {
            return Err(c.err(4, &vf, kind));
        }
        let tf = || "header: n_tensors".to_string();
        let n_tensors = c.u64(&tf)?;
        let kf = || "header: n_kv".to_string();
        let n_kv = c.u64(&kf)?;
        for (at, count, min, f) in [
            (8, n_tensors, MIN_TENSOR_INFO_BYTES, &tf as Field),
            (16, n_kv, MIN_KV_BYTES, &kf as Field),
        ] {
            let need = count.saturating_mul(min);
            if need > c.remaining() {
                let available = c.remaining();
                return Err(c.err(
                    at,
                    f,
                    FormatError::CountTooLarge {
                        count,
                        need,
                        available,
                    },
                ));
            }
        }

        // Key-value pairs (counts are checked against the remaining bytes, capacity capped).
        let mut metadata = IndexMap::with_capacity(prealloc(n_kv));
        let mut kv_offsets = Vec::with_capacity(prealloc(n_kv));
        for i in 0..n_kv {
            let kv_at = c.pos;
            let key_bytes = c.str_bytes(&|| format!("key #{i}"))?;
            let lossy = || String::from_utf8_lossy(key_bytes).into_owned();
            let named = || format!("key #{i} {:?}", lossy());
            let key = utf8(key_bytes).map_err(|kind| c.err(kv_at + 8, &named, kind))?;
            if key.is_empty() {
                return Err(c.err(kv_at, &|| format!("key #{i}"), FormatError::EmptyKey));
            }
            if let Some(j) = metadata.get_index_of(&key) {
                let kind = FormatError::DuplicateKey {
                    first_at: kv_offsets[j],
                };
                return Err(c.err(kv_at, &named, kind));
            }
            let ty = c.value_type(&|| format!("{}: value type", named()))?;
            let value = c.value(ty, &|| format!("{}: value", named()))?;
            metadata.insert(key, value);
            kv_offsets.push(kv_at as u64);
        }

        let alignment = match metadata.get_full(KEY_ALIGNMENT) {
            None => DEFAULT_ALIGNMENT,
            Some((i, _, v)) => {
                let at = kv_offsets[i] as usize;
                let f = || format!("key #{i} {KEY_ALIGNMENT:?}");
                let GgufValue::U32(a) = *v else {
                    return Err(c.err(at, &f, FormatError::AlignmentType(v.value_type())));
                };
                if !a.is_power_of_two() {
                    return Err(c.err(at, &f, FormatError::BadAlignment(a.into())));
                }
                a.into()
            }
        };

        let mut tensors = Vec::with_capacity(prealloc(n_tensors));
        let mut by_name = HashMap::with_capacity(prealloc(n_tensors));
        let mut offset_fields = Vec::with_capacity(prealloc(n_tensors));
        for i in 0..n_tensors {
            let (t, offset_at) = tensor_info(&mut c, i, alignment, shard)?;
            if let Some(&first_index) = by_name.get(&t.name) {
                let f = || format!("tensor info #{i} {:?}", t.name);
                let first_file = String::new();
                let kind = FormatError::DuplicateTensor {
                    first_index,
                    first_file,
                };
                return Err(c.err(t.info_offset as usize, &f, kind));
            }
            by_name.insert(t.name.clone(), tensors.len());
            tensors.push(t);
            offset_fields.push(offset_at);
        }

        let header_end = c.pos as u64;
        let file_size = bytes.len() as u64;
        let data_offset = if tensors.is_empty() {
            header_end
        } else {
            align_up(header_end, alignment).unwrap_or(u64::MAX)
        };
        check_data_ranges(&c, &mut tensors, &offset_fields, data_offset, file_size)?;
        Ok(GgufHeader {
            path: path.to_path_buf(),
            version,
            alignment,
            data_offset,
            file_size,
            metadata,
            kv_offsets,
            tensors,
            by_name,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn version(&self) -> u32 {
        self.version
    }
    /// `general.alignment`, or 32.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }
    /// Where the data section starts (tensor offsets in the file are relative to it).
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }
    /// Size of the parsed input (the file).
    pub fn file_size(&self) -> u64 {
        self.file_size
    }
    /// Metadata in file order.
    pub fn metadata(&self) -> &IndexMap<String, GgufValue> {
        &self.metadata
    }
    /// Byte offset of the key-value pair of `key` in the file.
    pub fn kv_offset(&self, key: &str) -> Option<u64> {
        self.metadata.get_index_of(key).map(|i| self.kv_offsets[i])
    }
    /// Tensors in file order, with absolute offsets.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }
}

impl Metadata for GgufHeader {
    fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }
    fn origin(&self, key: &str) -> (&Path, Option<u64>) {
        (self.path(), self.kv_offset(key))
    }
}

/// Reads tensor info `i`; returns it (offset still relative) and the position of its offset field.
fn tensor_info(
    c: &mut Cursor,
    i: u64,
    alignment: u64,
    shard: usize,
) -> Result<(TensorInfo, usize), GgufError> {
    let info_at = c.pos;
    let name_bytes = c.str_bytes(&|| format!("tensor info #{i}: name"))?;
    let lossy = String::from_utf8_lossy(name_bytes);
    let f = |what: &str| format!("tensor info #{i} {lossy:?}: {what}");
    if name_bytes.len() as u64 >= MAX_TENSOR_NAME {
        let kind = FormatError::NameTooLong {
            len: name_bytes.len() as u64,
            max: MAX_TENSOR_NAME - 1,
        };
        return Err(c.err(info_at, &|| format!("tensor info #{i}: name"), kind));
    }
    let name = utf8(name_bytes).map_err(|kind| c.err(info_at + 8, &|| f("name"), kind))?;

    let dims_at = c.pos;
    let n_dims = c.u32(&|| f("n_dims"))?;
    if !(1..=4).contains(&n_dims) {
        return Err(c.err(dims_at, &|| f("n_dims"), FormatError::BadNDims(n_dims)));
    }
    let mut ne = [1u64; 4];
    let mut ne_at = [c.pos; 4];
    for (d, slot) in ne.iter_mut().enumerate().take(n_dims as usize) {
        ne_at[d] = c.pos;
        let v = c.u64(&|| f(&format!("ne[{d}]")))?;
        if v == 0 {
            return Err(c.err(
                ne_at[d],
                &|| f(&format!("ne[{d}]")),
                FormatError::ZeroDim { dim: d },
            ));
        }
        if v > i64::MAX as u64 {
            let kind = FormatError::DimTooLarge { dim: d, value: v };
            return Err(c.err(ne_at[d], &|| f(&format!("ne[{d}]")), kind));
        }
        *slot = v;
    }
    let elements = ne.iter().try_fold(1u64, |acc, &n| acc.checked_mul(n));
    if elements.is_none_or(|n| n > i64::MAX as u64) {
        return Err(c.err(ne_at[0], &|| f("ne"), FormatError::ShapeOverflow { ne }));
    }

    let type_at = c.pos;
    let type_id = c.u32(&|| f("type"))?;
    let ty = GgmlType::from_id(type_id).map_err(|_| {
        c.err(
            type_at,
            &|| f("type"),
            FormatError::UnknownGgmlType(type_id),
        )
    })?;
    let block = ty.block_size() as u64;
    if ne[0] % block != 0 {
        let kind = FormatError::BlockSize {
            ne0: ne[0],
            ty: ty.name(),
            block,
        };
        return Err(c.err(ne_at[0], &|| f("ne[0]"), kind));
    }
    let n_bytes = ty
        .row_size(ne[0])
        .and_then(|r| r.checked_mul(ne[1]))
        .and_then(|r| r.checked_mul(ne[2]))
        .and_then(|r| r.checked_mul(ne[3]))
        .ok_or_else(|| c.err(ne_at[0], &|| f("ne"), FormatError::SizeOverflow { ne }))?;

    let offset_at = c.pos;
    let offset = c.u64(&|| f("offset"))?;
    if offset % alignment != 0 {
        let kind = FormatError::Misaligned { offset, alignment };
        return Err(c.err(offset_at, &|| f("offset"), kind));
    }
    let t = TensorInfo {
        name,
        ty,
        ne,
        n_dims,
        offset,
        n_bytes,
        shard,
        info_offset: info_at as u64,
    };
    Ok((t, offset_at))
}

/// Makes offsets absolute and checks that every tensor's data lies in the file and that no two
/// tensors overlap.
fn check_data_ranges(
    c: &Cursor,
    tensors: &mut [TensorInfo],
    offset_fields: &[usize],
    data_offset: u64,
    file_size: u64,
) -> Result<(), GgufError> {
    for (i, (t, &at)) in tensors.iter_mut().zip(offset_fields).enumerate() {
        let start = data_offset.saturating_add(t.offset);
        if start
            .checked_add(t.n_bytes)
            .is_none_or(|end| end > file_size)
        {
            let kind = FormatError::PastEnd {
                start,
                n_bytes: t.n_bytes,
                file_size,
            };
            let f = || format!("tensor info #{i} {:?}: offset", t.name);
            return Err(c.err(at, &f, kind));
        }
        t.offset = start;
    }
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by_key(|&i| tensors[i].offset);
    for w in order.windows(2) {
        let (a, b) = (&tensors[w[0]], &tensors[w[1]]);
        let a_end = a.offset + a.n_bytes;
        if a_end > b.offset {
            let kind = FormatError::Overlap {
                start: b.offset,
                end: b.offset + b.n_bytes,
                other: a.name.clone(),
                other_start: a.offset,
                other_end: a_end,
            };
            let f = || format!("tensor info #{} {:?}: offset", w[1], b.name);
            return Err(c.err(offset_fields[w[1]], &f, kind));
        }
    }
    Ok(())
}

/// One tensor of the index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub ty: GgmlType,
    /// ne0 first, padded with 1 up to 4 dimensions.
    pub ne: [u64; 4],
    pub n_dims: u32,
    /// Absolute byte offset of the data within its (shard) file.
    pub offset: u64,
    /// `ty.row_size(ne0) * ne1 * ne2 * ne3`.
    pub n_bytes: u64,
    /// Index of the shard file that holds the data (0 for single files).
    pub shard: usize,
    /// Byte offset of this tensor's info record in the header (for messages).
    pub info_offset: u64,
}

impl TensorInfo {
    /// The shape without padding: `ne[..n_dims]`.
    pub fn shape(&self) -> &[u64] {
        &self.ne[..(self.n_dims as usize).min(4)]
    }

    pub fn n_elements(&self) -> u64 {
        self.ne.iter().product()
    }
}
