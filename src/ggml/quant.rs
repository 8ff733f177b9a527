//! Quantise and dequantise rows with ggml's own routines, for every ggml type.
//!
//! `quantize` uses `ggml_quantize_chunk` (the reference quantisers llama-quantize uses); types that
//! need an importance matrix get the caller's, or a uniform one. `dequantize` uses the type's
//! `to_float`. Both check sizes first, so a bad length is an error, not an out-of-bounds write.
use super::{GgmlError, GgmlType, Result};
use ggml_sys as sys;

fn qerr(ty: GgmlType, msg: impl Into<String>) -> GgmlError {
    GgmlError::Quant {
        ty: ty.name(),
        msg: msg.into(),
    }
}

/// Quantises `src` (rows of `n_per_row` f32) to `ty`. `imatrix`, if given, has `n_per_row`
/// weights; types that require one and get none use a uniform matrix.
pub fn quantize(
    ty: GgmlType,
    src: &[f32],
    n_per_row: usize,
    imatrix: Option<&[f32]>,
) -> Result<Vec<u8>> {
    if n_per_row == 0 || !src.len().is_multiple_of(n_per_row) {
        return Err(qerr(
            ty,
            format!("{} values are not whole rows of {n_per_row}", src.len()),
        ));
    }
    let row_bytes = ty.row_size(n_per_row as u64).ok_or_else(|| {
        qerr(
            ty,
            format!(
                "row length {n_per_row} is not a multiple of the block size {}",
                ty.block_size()
            ),
        )
    })? as usize;
    if ty == GgmlType::I32 || ty == GgmlType::Q8_K || (ty.is_quantized() && !ty.has_to_float()) {
        return Err(qerr(ty, "ggml has no quantiser for this type"));
    }
    let uniform;
    let imatrix = match imatrix {
        Some(m) if m.len() != n_per_row => {
            return Err(qerr(
                ty,
                format!(
                    "importance matrix has {} entries, rows have {n_per_row}",
                    m.len()
                ),
            ))
        }
        Some(m) => m.as_ptr(),
        None if ty.requires_imatrix() => {
            uniform = vec![1.0f32; n_per_row];
            uniform.as_ptr()
        }
        None => std::ptr::null(),
    };
    let nrows = src.len() / n_per_row;
    let mut dst = vec![0u8; nrows * row_bytes];
    // SAFETY: src holds nrows*n_per_row f32, dst nrows*row_bytes bytes, imatrix null or
    // n_per_row f32; ggml_quantize_chunk writes exactly nrows rows.
    let written = unsafe {
        sys::ggml_quantize_chunk(
            ty.raw(),
            src.as_ptr(),
            dst.as_mut_ptr().cast(),
            0,
            nrows as i64,
            n_per_row as i64,
            imatrix,
        )
    };
    if written != dst.len() {
        return Err(qerr(
            ty,
            format!("ggml wrote {written} bytes, expected {}", dst.len()),
        ));
    }
    Ok(dst)
}

/// Dequantises `data` (whole rows/blocks of `ty`) to `n` f32 values.
pub fn dequantize(ty: GgmlType, data: &[u8], n: usize) -> Result<Vec<f32>> {
    let need =
        ty.row_size(n as u64)
            .ok_or_else(|| qerr(ty, format!("{n} values are not whole blocks")))? as usize;
    if data.len() != need {
        return Err(qerr(
            ty,
            format!("{n} values need {need} bytes, got {}", data.len()),
        ));
    }
    let mut out = vec![0f32; n];
    if ty == GgmlType::F32 {
        out.copy_from_slice(bytemuck::cast_slice(data));
        return Ok(out);
    }
    // SAFETY: the trait table entry is static for a valid type.
    let to_float = unsafe { (*sys::ggml_get_type_traits(ty.raw())).to_float }
        .ok_or_else(|| qerr(ty, "ggml has no dequantiser for this type"))?;
    // SAFETY: data holds exactly the bytes of n values of ty; out has n f32.
    unsafe { to_float(data.as_ptr().cast(), out.as_mut_ptr(), n as i64) };
    Ok(out)
}

/// Normalised mean squared error: sum((a-b)^2) / sum(b^2), the metric our parity tests use.
pub fn nmse(a: &[f32], reference: &[f32]) -> f64 {
    assert_eq!(
        a.len(),
        reference.len(),
        "nmse of slices of different lengths"
    );
    let (mut num, mut den) = (0f64, 0f64);
    for (&x, &r) in a.iter().zip(reference) {
        num += (x as f64 - r as f64).powi(2);
        den += (r as f64).powi(2);
    }
    if den == 0.0 {
        if num == 0.0 {
            0.0
        } else {
            f64::INFINITY
        }
    } else {
        num / den
    }
}
