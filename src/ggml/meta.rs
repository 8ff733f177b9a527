//! ggml's meta backend (`ggml-backend-meta.cpp` of the pinned tree, llama.cpp's `-sm tensor`):
//! one backend over several devices, each tensor of its buffers held as per-device slices along
//! one axis (or whole on every device, or as per-device partial sums), the graph run on every
//! device with the all-reduces its splits need (NCCL where ggml-cuda was built with it, else
//! ggml's generic copy-and-add). Which axis a weight or cache tensor is split along is ours to
//! say, per tensor, through [`SplitRules`]; ggml derives every computed tensor's split from its
//! sources.
use super::{Backend, GgmlError, GgmlType, Result, Tensor};
use ggml_sys as sys;
use std::ffi::{c_void, CStr};

/// How one tensor lies over the devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Split {
    /// Sliced along dimension `axis` (0..4): device k holds `ne[k]` of it, in device order.
    Axis { axis: usize, ne: Vec<i64> },
    /// All of it on every device.
    Mirrored,
    /// Every device holds a partial sum of it (an expert bias added once per device's share,
    /// say); `ne` as for the tensor it is a partial sum over.
    Partial { ne: Vec<i64> },
}

/// Where each weight and cache tensor of a meta backend's buffers goes: asked once per tensor
/// as it is allocated, with its name, shape and type.
pub trait SplitRules: Send + Sync {
    fn split(&self, name: &str, ne: [i64; 4], ty: Option<GgmlType>) -> Split;
}

extern "C" {
    // ggml-backend-impl.h (exported, not in the public headers bound by ggml-sys).
    fn ggml_backend_is_meta(b: sys::ggml_backend_t) -> bool;
    fn ggml_backend_buffer_is_meta(b: sys::ggml_backend_buffer_t) -> bool;
    fn ggml_backend_meta_n_backends(meta: sys::ggml_backend_t) -> usize;
    fn ggml_backend_meta_simple_backend(meta: sys::ggml_backend_t, i: usize)
        -> sys::ggml_backend_t;
}

fn to_c(s: &Split) -> sys::ggml_backend_meta_split_state {
    let mut c = sys::ggml_backend_meta_split_state::default();
    c.nr[0] = 1;
    c.n_segments = 1;
    let fill = |c: &mut sys::ggml_backend_meta_split_state, ne: &[i64]| {
        for (k, n) in ne.iter().enumerate().take(c.ne.len()) {
            c.ne[k] = *n;
        }
    };
    match s {
        Split::Axis { axis, ne } => {
            c.axis = *axis as sys::ggml_backend_meta_split_axis;
            fill(&mut c, ne);
        }
        Split::Mirrored => c.axis = sys::GGML_BACKEND_SPLIT_AXIS_MIRRORED,
        Split::Partial { ne } => {
            c.axis = sys::GGML_BACKEND_SPLIT_AXIS_PARTIAL;
            fill(&mut c, ne);
        }
    }
    c
}

/// ggml's callback: the rules behind `ud` asked about `t`. A panic in the rules cannot cross
/// into C: it answers "mirrored" (every device holds the whole tensor, always correct, only
/// costlier) and says so.
unsafe extern "C" fn split_state(
    t: *const sys::ggml_tensor,
    ud: *mut c_void,
) -> sys::ggml_backend_meta_split_state {
    // SAFETY: ud is the leaked `Box<dyn SplitRules>` of `Backend::meta`; t a live tensor.
    let (rules, name, ne, ty) = unsafe {
        let rules = &*(ud as *const Box<dyn SplitRules>);
        let name = CStr::from_ptr((*t).name.as_ptr())
            .to_string_lossy()
            .into_owned();
        (rules, name, (*t).ne, GgmlType::from_id((*t).type_).ok())
    };
    let s = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| rules.split(&name, ne, ty)))
        .unwrap_or_else(|_| {
            tracing::error!("tensor split rules failed on {name}: kept whole on every device");
            Split::Mirrored
        });
    to_c(&s)
}

impl Backend {
    /// ggml's meta backend over `devices` (ggml device names: `CPU`, `CUDA0`, ...; the CPU's more
    /// than once stands in for several devices), each tensor of its buffers split as `rules`
    /// say. A CPU device's backend gets `n_threads` threads and a persistent pool, as
    /// [`Backend::cpu_polling`].
    ///
    /// `rules` is leaked: ggml keeps the meta device (and its pointer to them) for the process.
    pub fn meta(
        devices: &[String],
        rules: Box<dyn SplitRules>,
        n_threads: usize,
        poll: bool,
    ) -> Result<Self> {
        super::backend::filter_ggml_log();
        if devices.iter().any(|d| d.starts_with("CUDA")) {
            super::configure_cuda();
        }
        if devices.len() < 2 || devices.len() > sys::GGML_BACKEND_META_MAX_DEVICES as usize {
            return Err(GgmlError::BackendInit(format!(
                "a tensor split over {} devices (2 to {})",
                devices.len(),
                sys::GGML_BACKEND_META_MAX_DEVICES
            )));
        }
        let mut devs = Vec::with_capacity(devices.len());
        for name in devices {
            let c = std::ffi::CString::new(name.as_str())
                .map_err(|_| GgmlError::NoSuchDevice(name.clone(), "NUL in name".into()))?;
            // SAFETY: registry lookup with a valid C string; null if absent.
            let dev = unsafe { sys::ggml_backend_dev_by_name(c.as_ptr()) };
            if dev.is_null() {
                let names: Vec<String> = super::Device::all().into_iter().map(|d| d.name).collect();
                return Err(GgmlError::NoSuchDevice(name.clone(), names.join(", ")));
            }
            devs.push(dev);
        }
        let ud = Box::into_raw(Box::new(rules)) as *mut c_void;
        // ggml keeps its meta devices in unguarded static maps ("not thread-safe", says
        // ggml_backend_meta_device): engines loaded on several threads at once (the tests) take
        // turns here.
        static MAKING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _turn = MAKING.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: `devs` are registered devices; `ud` lives for the process (leaked above).
        let ptr = unsafe {
            let meta =
                sys::ggml_backend_meta_device(devs.as_mut_ptr(), devs.len(), Some(split_state), ud);
            // Its buffer type too, made now under the lock (ggml makes it at the first ask).
            sys::ggml_backend_dev_buffer_type(meta);
            sys::ggml_backend_dev_init(meta, std::ptr::null())
        };
        let mut b = Self::from_raw(ptr, &format!("Meta({})", devices.join(",")))?;
        for sub in b.simple_backends() {
            // SAFETY: the meta backend's own devices' backends, freed with it.
            unsafe {
                if sys::ggml_backend_is_cpu(sub) {
                    b.give_cpu_threads(sub, n_threads, poll);
                }
            }
        }
        Ok(b)
    }

    /// Whether this is a meta backend (a tensor split over several devices).
    pub fn is_meta(&self) -> bool {
        // SAFETY: live backend.
        unsafe { ggml_backend_is_meta(self.raw()) }
    }

    /// The backends that compute: a meta backend's devices' own, or this one.
    pub(crate) fn simple_backends(&self) -> Vec<sys::ggml_backend_t> {
        if !self.is_meta() {
            return vec![self.raw()];
        }
        // SAFETY: a live meta backend; its simple backends live as long as it does.
        unsafe {
            (0..ggml_backend_meta_n_backends(self.raw()))
                .map(|i| ggml_backend_meta_simple_backend(self.raw(), i))
                .collect()
        }
    }

    /// The devices a meta backend spans (0 for any other backend).
    pub fn meta_devices(&self) -> usize {
        if !self.is_meta() {
            return 0;
        }
        // SAFETY: a live meta backend.
        unsafe { ggml_backend_meta_n_backends(self.raw()) }
    }
}

/// Bytes of the buffer `t`'s memory is in (0 while unallocated); for a meta backend's buffer,
/// the largest of its devices' parts.
pub fn buffer_bytes(t: Tensor<'_>) -> usize {
    let b = t.buffer_raw();
    // SAFETY: a live tensor's buffer, or null.
    if b.is_null() {
        0
    } else {
        unsafe { sys::ggml_backend_buffer_get_size(b) }
    }
}

/// Whether `t`'s memory is a meta backend's buffer (sliced over its devices as the rules say).
pub fn in_meta_buffer(t: Tensor<'_>) -> bool {
    let b = t.buffer_raw();
    // SAFETY: a live tensor's buffer, or null.
    !b.is_null() && unsafe { ggml_backend_buffer_is_meta(b) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_convert_to_ggml_states() {
        let c = to_c(&Split::Axis {
            axis: 1,
            ne: vec![3, 5],
        });
        assert_eq!(c.axis, sys::GGML_BACKEND_SPLIT_AXIS_1);
        assert_eq!((c.ne[0], c.ne[1], c.ne[2]), (3, 5, 0));
        assert_eq!((c.nr[0], c.n_segments), (1, 1));
        assert_eq!(
            to_c(&Split::Mirrored).axis,
            sys::GGML_BACKEND_SPLIT_AXIS_MIRRORED
        );
        let p = to_c(&Split::Partial { ne: vec![2, 2] });
        assert_eq!((p.axis, p.ne[1]), (sys::GGML_BACKEND_SPLIT_AXIS_PARTIAL, 2));
    }
}
