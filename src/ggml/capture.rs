//! Capturing named intermediate tensors during graph compute (ggml's scheduler eval callback),
//! for ours and for libllama alike: tensors are named the llama.cpp way (`ffn_moe_out-3`), so a
//! divergence can be located by diffing the two captures by name (docs/design.md §3.2).
use super::cstr;
use ggml_sys as sys;
use std::collections::{HashMap, HashSet};
use std::ffi::c_void;

/// Which tensors to keep (`"*"` keeps every node), and what was kept (f32 tensors only, as
/// flat vectors).
#[derive(Debug, Default)]
pub struct Capture {
    pub wanted: HashSet<String>,
    pub got: HashMap<String, Vec<f32>>,
    /// With `record_order`: every node the scheduler offered, in order, as `name op [ne]`
    /// (for comparing two graphs' structure).
    pub record_order: bool,
    pub order: Vec<String>,
}

impl Capture {
    pub fn new<I: IntoIterator<Item = S>, S: Into<String>>(names: I) -> Box<Self> {
        Box::new(Self {
            wanted: names.into_iter().map(Into::into).collect(),
            got: HashMap::new(),
            record_order: false,
            order: Vec::new(),
        })
    }
}

/// The callback: with `ask`, says whether `t` is wanted; otherwise copies it out.
///
/// # Safety
/// `user` must point to a live `Capture`, and `t` to a computed tensor (ggml's contract).
pub unsafe extern "C" fn capture_cb(
    t: *mut sys::ggml_tensor,
    ask: bool,
    user: *mut c_void,
) -> bool {
    // SAFETY: per the contract above.
    let (cap, t) = unsafe { (&mut *(user as *mut Capture), &*t) };
    let name = cstr(t.name.as_ptr());
    if ask {
        if cap.record_order {
            // SAFETY: ggml_op_desc returns a static string for any node.
            let op = cstr(unsafe { sys::ggml_op_desc(t) });
            cap.order.push(format!("{name} {op} {:?}", t.ne));
        }
        return cap.wanted.contains(&name) || cap.wanted.contains("*");
    }
    if t.type_ == sys::GGML_TYPE_F32 && !t.buffer.is_null() {
        // SAFETY: the tensor is computed and has a buffer; we copy exactly its bytes.
        let n = unsafe { sys::ggml_nbytes(t) };
        let mut v = vec![0f32; n / 4];
        unsafe { sys::ggml_backend_tensor_get(t, v.as_mut_ptr().cast(), 0, n) };
        cap.got.insert(name, v);
    }
    true
}
