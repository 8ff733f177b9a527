//! Pure-Rust dequantisers written from the GGUF block formats, independent of ggml's code: the
//! reference our kernel tests compare ggml against. Formats (bytes in block order):
//! - Q8_0  (32 values, 34 B):  f16 d, i8 q[32];                  x = d*q
//! - Q4_K  (256 values, 144 B): f16 d, f16 dmin, u8 scales[12], u8 qs[128]; 8 sub-blocks of 32
//!   with 6-bit scale/min packed in `scales`; x = d*sc*q - dmin*m
//! - Q6_K  (256 values, 210 B): u8 ql[128], u8 qh[64], i8 scales[16], f16 d; q is 6 bits - 32
//! - MXFP4 (32 values, 17 B):  u8 e (E8M0), u8 qs[16]; x = e2m1(q) * 2^(e-127), nibble j holds
//!   value j (low) and j+16 (high)
use super::GgmlType;
use half::f16;

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Dequantises whole blocks of `ty`, or `None` if there is no Rust reference for `ty` (or the
/// length is not whole blocks).
pub fn dequantize(ty: GgmlType, data: &[u8]) -> Option<Vec<f32>> {
    let block: fn(&[u8], &mut [f32]) = match ty {
        GgmlType::Q8_0 => q8_0,
        GgmlType::Q4_K => q4_k,
        GgmlType::Q6_K => q6_k,
        GgmlType::MXFP4 => mxfp4,
        GgmlType::F16 => |b, y| y[0] = f16_at(b, 0),
        GgmlType::F32 => |b, y| y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        _ => return None,
    };
    let (bs, ts) = (ty.block_size(), ty.type_size());
    if !data.len().is_multiple_of(ts) {
        return None;
    }
    let mut out = vec![0f32; data.len() / ts * bs];
    for (b, y) in data.chunks_exact(ts).zip(out.chunks_exact_mut(bs)) {
        block(b, y);
    }
    Some(out)
}

fn q8_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (yi, &q) in y.iter_mut().zip(&b[2..34]) {
        *yi = d * (q as i8) as f32;
    }
}

/// 6-bit scale and min of sub-block `j` (0..8) from the 12 packed bytes.
fn scale_min_k4(j: usize, q: &[u8]) -> (f32, f32) {
    if j < 4 {
        ((q[j] & 63) as f32, (q[j + 4] & 63) as f32)
    } else {
        let sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        let m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
        (sc as f32, m as f32)
    }
}

fn q4_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let scales = &b[4..16];
    let qs = &b[16..144];
    // Four chunks of 64 values; each chunk's 32 bytes hold sub-block 2c in the low nibbles and
    // sub-block 2c+1 in the high nibbles.
    for c in 0..4 {
        let (s1, m1) = scale_min_k4(2 * c, scales);
        let (s2, m2) = scale_min_k4(2 * c + 1, scales);
        let q = &qs[32 * c..32 * c + 32];
        for l in 0..32 {
            y[64 * c + l] = d * s1 * (q[l] & 0xF) as f32 - dmin * m1;
            y[64 * c + 32 + l] = d * s2 * (q[l] >> 4) as f32 - dmin * m2;
        }
    }
}

fn q6_k(b: &[u8], y: &mut [f32]) {
    let (ql, qh, sc) = (&b[0..128], &b[128..192], &b[192..208]);
    let d = f16_at(b, 208);
    // Two halves of 128 values; each uses 64 bytes of ql, 32 of qh and 8 scales.
    for h in 0..2 {
        let (ql, qh, sc, y) = (
            &ql[64 * h..],
            &qh[32 * h..],
            &sc[8 * h..],
            &mut y[128 * h..],
        );
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
            y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
            y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
            y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
        }
    }
}

/// E2M1 code points (sign, 2-bit exponent, 1-bit mantissa) as values.
const E2M1: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

fn mxfp4(b: &[u8], y: &mut [f32]) {
    let scale = (2f64).powi(b[0] as i32 - 127) as f32;
    for j in 0..16 {
        y[j] = E2M1[(b[1 + j] & 0xF) as usize] * scale;
        y[j + 16] = E2M1[(b[1 + j] >> 4) as usize] * scale;
    }
}
