//! `Graph`: a ggml compute graph, allocated in (and borrowing) a [`Context`].
use super::{Context, Tensor};
use ggml_sys as sys;
use std::marker::PhantomData;
use std::ptr::NonNull;

/// Copyable handle (a pointer into its context).
#[derive(Clone, Copy)]
pub struct Graph<'ctx> {
    ptr: NonNull<sys::ggml_cgraph>,
    _ctx: PhantomData<&'ctx Context>,
}

impl<'ctx> Graph<'ctx> {
    /// An empty graph of at most `size` nodes in `ctx` (which must have been sized for it).
    pub fn new(ctx: &'ctx Context, size: usize) -> Self {
        // SAFETY: the context is live; ggml aborts only if the pool is too small, which
        // Context::new sized for.
        let g = unsafe { sys::ggml_new_graph_custom(ctx.raw(), size, false) };
        Self {
            ptr: NonNull::new(g).expect("ggml_new_graph_custom returned null"),
            _ctx: PhantomData,
        }
    }

    pub(crate) fn ptr(&self) -> NonNull<sys::ggml_cgraph> {
        self.ptr
    }

    /// Re-borrows a graph that lives in `ctx` (see `OwnedGraph`).
    pub(crate) fn from_ptr(ptr: NonNull<sys::ggml_cgraph>, _ctx: &'ctx Context) -> Self {
        Self {
            ptr,
            _ctx: PhantomData,
        }
    }

    pub(crate) fn raw(&self) -> *mut sys::ggml_cgraph {
        self.ptr.as_ptr()
    }

    /// Adds `t` and everything it depends on.
    pub fn build_forward(&self, t: Tensor<'ctx>) {
        // SAFETY: graph and tensor live in the same context.
        unsafe { sys::ggml_build_forward_expand(self.raw(), t.raw()) };
    }

    pub fn n_nodes(&self) -> usize {
        // SAFETY: pure query.
        unsafe { sys::ggml_graph_n_nodes(self.raw()) as usize }
    }

    /// Node `i` (`i < n_nodes()`), in the order ggml computes them.
    pub fn node(&self, i: usize) -> Tensor<'ctx> {
        assert!(i < self.n_nodes());
        // SAFETY: i < n_nodes; the node lives in a context that outlives 'ctx.
        let node = unsafe { sys::ggml_graph_node(self.raw(), i as i32) };
        Tensor::from_raw(NonNull::new(node).expect("graph node"))
    }

    /// Every read of a tensor by a node of this graph: (node, source slot, the source's
    /// [`Tensor::id`]). A view, reshape or permute of a tensor is a node that reads it, so a
    /// tensor read through a view shows a read by a view node.
    pub fn reads(&self) -> Vec<(Tensor<'ctx>, usize, usize)> {
        let mut out = Vec::new();
        for i in 0..self.n_nodes() {
            // SAFETY: i < n_nodes; nodes and their sources live in contexts that outlive 'ctx
            // (the graph's own, or the weights' and cache's, which the graph's builder borrowed).
            unsafe {
                let node = sys::ggml_graph_node(self.raw(), i as i32);
                let node = Tensor::from_raw(NonNull::new(node).expect("graph node"));
                for (slot, &src) in (*node.raw()).src.iter().enumerate() {
                    if !src.is_null() {
                        out.push((node, slot, src as usize));
                    }
                }
            }
        }
        out
    }
}
